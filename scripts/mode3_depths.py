"""Mode 3 at every prefetch depth and worker count: none hangs.

A mode-3 DataLoader with ``prefetch_size=1`` used to hang forever in
``next()``. This runs ``DataLoader(mode=3)`` over a small store with every
``prefetch_size`` from 1 to 8 and ``num_workers`` from 1 to 4, 1,000 steps
each, each run on a thread with a watchdog (``--limit`` seconds), checks each
batch against the sampler, and prints one line per run and a summary. Exit
status 1 if any run hung or delivered a wrong batch.

    python scripts/mode3_depths.py [--steps 1000] [--limit 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

import numpy as np

import zring

N, BATCH = 2000, 8
SHAPE = dict(block_records=10, window_blocks=2)


def run(ys: zring.Dataset, depth: int, workers: int, steps: int, out: dict) -> None:
    sampler = zring.Sampler(N, BATCH, zring.Sampler.Mode.BLOCKED, seed=11, **SHAPE)
    with zring.DataLoader({"y": ys}, batch_size=BATCH, mode=3, seed=11, prefetch_size=depth,
                          num_workers=workers, **SHAPE) as dl:
        for step in range(steps):
            got = next(dl)["y"]
            if not np.array_equal(got, sampler.batch(step)):
                out["error"] = f"step {step}: {got} is not the sampler's batch"
                return
    out["done"] = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--limit", type=float, default=60.0)
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        zring.write_dataset(f"{tmp}/y", np.arange(N, dtype=np.int64), progress=False)
        ys = zring.Dataset(f"{tmp}/y")
        for depth in range(1, 9):
            for workers in range(1, 5):
                out: dict = {}
                t = time.perf_counter()
                th = threading.Thread(target=run, args=(ys, depth, workers, args.steps, out), daemon=True)
                th.start()
                th.join(args.limit)
                secs = time.perf_counter() - t
                if th.is_alive():
                    verdict = f"HUNG (no end within {args.limit:.0f} s)"
                elif "done" in out:
                    verdict = f"ok, {args.steps} steps in {secs:.2f} s"
                else:
                    verdict = f"FAILED: {out.get('error', 'the run raised (see above)')}"
                failed += not verdict.startswith("ok")
                print(f"prefetch_size={depth} num_workers={workers}: {verdict}", flush=True)
                if th.is_alive():
                    # A hung loader cannot be closed from here; stop the sweep.
                    print(f"{failed} of the runs so far failed", flush=True)
                    return 1
        ys.close()
    print(f"{32 - failed} of 32 runs delivered {args.steps} steps; {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
