"""A token corpus written by Ray Data as a dataset of parts, grown, and read as one.

What it shows:

1. A Ray Data pipeline (local mode here; the same code on a cluster, with
   ``path`` on a file system every node sees) tokenizes documents in parallel
   tasks and writes them with ``zring.ray.write``: each write task stages one
   part, and the driver commits the parts it got back in one manifest
   replace. Document ``i`` holds ``i % 7 + 1`` copies of ``i``, so a read
   names its documents.
2. A second job appends more documents (``mode="append"``): a new manifest
   generation listing the old parts first, unchanged.
3. ``zring.RaggedDataset(path)`` opens all parts as one dataset; one pass of
   a ``DataLoader`` over it draws every document exactly once, and
   ``zring parts PATH --ranks 2`` says which parts each host would need.

Run: ``python examples/ray_write.py [--docs 20000] [--more 5000]`` (needs
``pip install 'zring[ray]'``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import zring
import zring.ray


def tokenize(batch: dict) -> dict:
    """Stand-in for a tokenizer: document i becomes i % 7 + 1 copies of i."""
    ids = np.asarray(batch["id"], dtype=np.int64)
    return {"tokens": [np.full(i % 7 + 1, i, np.int32) for i in ids]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--more", type=int, default=5_000)
    args = ap.parse_args()

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus"
        t = time.perf_counter()
        ds = ray.data.range(args.docs, override_num_blocks=8).map_batches(tokenize)
        rows = zring.ray.write(ds, path, column="tokens")
        secs = time.perf_counter() - t
        first_parts = len(zring.parts.list_parts(path))
        more = ray.data.range(args.docs + args.more, override_num_blocks=4).filter(
            lambda r: r["id"] >= args.docs).map_batches(tokenize)
        rows += zring.ray.write(more, path, column="tokens", mode="append")
        ray.shutdown()

        total = args.docs + args.more
        assert rows == total, (rows, total)
        docs = zring.RaggedDataset(str(path))
        listed = zring.parts.list_parts(path)
        print(f"Ray wrote {args.docs:,} documents into {first_parts} parts ({args.docs / secs:,.0f} documents/s, "
              f"Ray's start included), then appended {args.more:,} in {len(listed) - first_parts} more")

        # One pass over the whole dataset: every document exactly once.
        seen = np.zeros(total, np.int64)
        with zring.DataLoader({"tokens": docs}, batch_size=500, one_pass=True) as loader:
            for batch in loader:
                values, splits = batch["tokens"]
                firsts = values[splits[:-1]]
                lengths = np.diff(splits)
                assert (lengths == firsts % 7 + 1).all(), "each document whole"
                np.add.at(seen, firsts, 1)
        assert (seen == 1).all(), "every document exactly once"
        print(f"one pass read all {total:,} documents once from {len(listed)} parts")

        plan = subprocess.run([sys.executable, "-m", "zring.cli", "parts", str(path), "--ranks", "2"],
                              capture_output=True, text=True, check=True).stdout
        per_rank = {}
        for line in plan.splitlines():
            rank, _, part = line.partition("\t")
            if rank.isdigit():
                per_rank.setdefault(int(rank), []).append(part)
        print("parts per host for 2 ranks:", {r: len(p) for r, p in sorted(per_rank.items())})


if __name__ == "__main__":
    main()
