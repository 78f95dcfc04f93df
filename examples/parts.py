"""A corpus written in parts by a pool of workers, read as one dataset, then grown.

What it shows:

1. ``WORKERS`` processes each tokenize a shard of the input and write it as
   one part with ``zring.parts.write_part``, returning a small ``PartInfo``.
   One task fails after writing its part, and is run again, as a
   scheduler (Ray, Spark) would retry it.
2. The driver commits the parts it got back with ``zring.parts.commit``: one
   atomic replace of ``manifest.json``, and every document is in the dataset
   exactly once. This driver is the dataset's only writer, so it removes the
   failed attempt's staged part at once (``remove_uncommitted=0``; by
   default a commit leaves staged parts alone for an hour, in case another
   writer has yet to commit them).
3. ``zring.RaggedDataset`` opens the folder as one dataset: a packed
   ``DataLoader`` reads it, and a loader of its documents saves a state.
4. Four more parts are appended (a new manifest generation), and the saved
   state resumes over the grown corpus: the saved cycle goes on as it would
   have, and the new documents join at the next cycle (a packed loader's
   too: its cycle under way ends over the documents it began with).

Run: ``python examples/parts.py [--shards 8] [--docs 500]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring


def tokenize(shard: int, docs: int) -> list[np.ndarray]:
    """Shard ``shard``'s documents: document ``d`` is ``d`` repeated 1 to 40 times."""
    rng = np.random.default_rng(shard)
    first = shard * docs
    return [np.full(int(rng.integers(1, 41)), first + i, dtype=np.int32) for i in range(docs)]


def task(args: tuple[str, int, int, str]) -> zring.parts.PartInfo | None:
    root, shard, docs, marker = args
    info = zring.parts.write_part(root, tokenize(shard, docs))
    if shard == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        return None  # this attempt "failed" after writing its part
    return info


def write(pool, root: str, shards: range, docs: int, marker: str) -> list[zring.parts.PartInfo]:
    """Every shard's PartInfo, running failed tasks again."""
    infos: dict[int, zring.parts.PartInfo] = {}
    todo = list(shards)
    while todo:
        results = pool.map(task, [(root, s, docs, marker) for s in todo])
        infos.update({s: r for s, r in zip(todo, results) if r is not None})
        todo = [s for s, r in zip(todo, results) if r is None]
    return [infos[s] for s in shards]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--docs", type=int, default=500)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, marker = str(Path(tmp) / "corpus"), str(Path(tmp) / "failed-once")
        with mp.get_context("spawn").Pool(2) as pool:
            infos = write(pool, root, range(a.shards), a.docs, marker)
            staged = len(os.listdir(Path(root) / "staging"))
            generation = zring.parts.commit(root, infos, remove_uncommitted=0)
            print(f"{a.shards} parts committed (generation {generation}); {staged} were staged, "
                  f"{len(os.listdir(Path(root) / 'staging'))} left after the commit")
            ds = zring.RaggedDataset(root)
            ids = [int(ds[i][0]) for i in range(len(ds))]
            if ids != list(range(a.shards * a.docs)):
                print("FAILED: the documents are not each there once, in order", file=sys.stderr)
                return 1

            with zring.DataLoader(zring.pack(ds, 128), batch_size=8, mode=2) as dl:
                rows = next(dl)["tokens"]
            print(f"packed rows of 128 tokens from the parts: {rows.shape}")
            with zring.DataLoader({"doc": ds}, batch_size=64, mode=2, seed=0) as dl:
                for _ in range(3):
                    next(dl)
                state = dl.state()
                rest = [next(dl)["doc"][0].copy() for _ in range(3)]

            more = write(pool, root, range(a.shards, a.shards + 4), a.docs, marker)
            generation = zring.parts.commit(root, more, mode="append")
        grown = zring.RaggedDataset(root)
        print(f"4 parts appended (generation {generation}): {len(ds)} -> {len(grown)} documents")
        with zring.DataLoader({"doc": grown}, state=state) as dl:
            again = [next(dl)["doc"][0] for _ in range(3)]
        if not all(np.array_equal(x, y) for x, y in zip(rest, again)):
            print("FAILED: the resumed run differs from the uninterrupted one", file=sys.stderr)
            return 1
        print("resumed over the grown corpus: the saved cycle goes on unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
