"""Several ranks reading one dataset, each its own slice of every global batch.

What it shows:

1. One store, read by ``RANKS`` processes started like the ranks of a
   distributed run (here with ``multiprocessing``; under torchrun or a JAX
   multi-process job each process would pass its own rank).
2. Each rank builds the same ``zring.DataLoader`` (same seed, same global
   ``batch_size``) with ``shard=(rank, RANKS)`` and receives rows
   ``[rank * B / RANKS, (rank + 1) * B / RANKS)`` of every global batch: the
   sampler is a pure function of (seed, step), so no rank talks to another.
3. The parent checks that the ranks' slices, put side by side, are exactly
   the batches of an unsharded loader, and that no record repeats within a
   cycle (mode 2).

Run: ``python examples/ranks.py [--ranks 4] [--steps 10]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring

BATCH = 64


def rank_main(path: str, rank: int, ranks: int, steps: int, out: mp.Queue) -> None:
    """What each rank runs: its shard of every step, reported as record ids."""
    with zring.DataLoader({"x": zring.Dataset(path)}, batch_size=BATCH, mode=2, seed=3,
                          shard=(rank, ranks), num_workers=1) as loader:
        got = [next(loader)["x"][:, 0].copy() for _ in range(steps)]
    out.put((rank, got))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if BATCH % args.ranks:
        ap.error(f"--ranks must divide the batch of {BATCH}")

    with tempfile.TemporaryDirectory(prefix="zring-ranks-") as tmp:
        path = str(Path(tmp) / "x.zr")
        # Record i holds i in its first column, so a batch names its records.
        records = np.arange(BATCH * args.steps, dtype=np.int64)[:, None] * np.ones((1, 8), np.int64)
        zring.write_dataset(path, records, codec="raw")

        # spawn: each rank is a fresh interpreter, as under a real launcher.
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(path, r, args.ranks, args.steps, out))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        shards = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
            if p.exitcode != 0:
                print(f"a rank exited with status {p.exitcode}", file=sys.stderr)
                return 1

        with zring.DataLoader({"x": zring.Dataset(path)}, batch_size=BATCH, mode=2, seed=3) as whole:
            for step in range(args.steps):
                joined = np.concatenate([shards[r][step] for r in range(args.ranks)])
                if not np.array_equal(joined, next(whole)["x"][:, 0]):
                    print(f"step {step}: the ranks' slices differ from the global batch", file=sys.stderr)
                    return 1
        seen = np.concatenate([s for r in range(args.ranks) for s in shards[r]])
        if len(np.unique(seen)) != len(seen):
            print("a record repeated within one cycle", file=sys.stderr)
            return 1
        print(f"{args.ranks} ranks x {args.steps} steps: each rank read {BATCH // args.ranks} rows of every "
              f"batch of {BATCH}; side by side they are the global batches, every record once per cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
