"""Mixture sources of under one row per batch (issue 38, "any weights").

Weights 0.9989/0.001/0.0001 at 256 rows per batch: the two small sources get
0.256 and 0.0256 rows per batch. Runs the loader 20,000 steps, counts each
source's rows from ``last_sources`` and prints the largest distance of each
source's rows so far from ``weight × rows so far`` over all steps (must be
under one row), and the same per rank of 8 (from the rows' positions: rank
``j`` takes rows ``32 j`` to ``32 j + 31``). Then resumes from the state saved
at step 12,345, whole and as 8 shards, and checks the next 200 batches equal
the uninterrupted run's.

    .venv/bin/python benches/small_weights.py

A correctness check, not a throughput: the dev build will do.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import zring

WEIGHTS = [0.9989, 0.001, 0.0001]
LENGTHS = [100_000, 5_000, 700]
BATCH = 256
STEPS = 20_000
RESUME = 12_345
AFTER = 200
RANKS = 8


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        sources = []
        for k, n in enumerate(LENGTHS):
            zring.write_dataset(Path(tmp) / f"s{k}", np.arange(n, dtype=np.int64) * 10 + k)
            sources.append({"x": zring.Dataset(Path(tmp) / f"s{k}")})
        m = zring.mix(sources, WEIGHTS)
        total = np.zeros(3, np.int64)
        per_rank = np.zeros((RANKS, 3), np.int64)
        worst = np.zeros(3)
        worst_rank = np.zeros(3)
        kept = []
        began = time.perf_counter()
        with zring.DataLoader(m, batch_size=BATCH, mode=2, seed=7, num_workers=2) as dl:
            for t in range(STEPS):
                if t == RESUME:
                    state = dl.state()
                b = next(dl)
                src = dl.last_sources
                total += np.bincount(src, minlength=3)
                for j in range(RANKS):
                    per_rank[j] += np.bincount(src[j * BATCH // RANKS:(j + 1) * BATCH // RANKS], minlength=3)
                rows = (t + 1) * BATCH
                worst = np.maximum(worst, np.abs(total - m.weights * rows))
                worst_rank = np.maximum(worst_rank, np.abs(per_rank - m.weights * rows / RANKS).max(axis=0))
                if RESUME <= t < RESUME + AFTER:
                    kept.append((dl.last_sources.copy(), dl.last_indices.copy(), b["x"].copy()))
        took = time.perf_counter() - began
        print(f"weights {WEIGHTS} at {BATCH} rows per batch, {STEPS:,} steps ({took:.1f} s)")
        print(f"rows per source: {total.tolist()} (shares {np.round(m.weights * STEPS * BATCH, 1).tolist()})")
        print("max |rows so far - weight x rows so far| over every step, per source:",
              ", ".join(f"{x:.4f}" for x in worst))
        print(f"the same on each of {RANKS} ranks:", ", ".join(f"{x:.4f}" for x in worst_rank))
        ok = bool(worst.max() < 1)

        def run(shard):
            got = []
            with zring.DataLoader(m, batch_size=BATCH, mode=2, seed=7, state=state, shard=shard) as dl:
                for _ in range(AFTER):
                    b = next(dl)
                    got.append((dl.last_sources.copy(), dl.last_indices.copy(), b["x"].copy()))
            return got

        whole = run(None)
        same = all(all(np.array_equal(a, b) for a, b in zip(x, y)) for x, y in zip(whole, kept))
        shards = [run((j, RANKS)) for j in range(RANKS)]
        union = all(all(np.array_equal(np.concatenate([s[i][f] for s in shards]), kept[i][f]) for f in range(3))
                    for i in range(AFTER))
        print(f"resumed at step {RESUME:,}: next {AFTER} batches equal the uninterrupted run's: {same}; "
              f"{RANKS} resumed shards' union equals them: {union}")
        ok = ok and same and union
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
