"""Interleaved against grouped mixture rows: what the per-rank fairness of
zring.mix costs the loader.

A mixture's rows are interleaved so that every shard holds each source's
share (zring._mix); each source's records then go straight into their rows'
slots. This compares, in one process and one run with the rounds
interleaved, the batches/s of a 0.7/0.3 mixture of two raw stores of 12 KiB
records (16,384 and 8,192 records, hot in the page cache, batch 256, cyclic,
2 workers, prefetch 4) read interleaved (a new run) and grouped (the same
run resumed from a state without "order", as runs saved before the change
resume), whole and as shard 0 of 8.

    python benches/mix_order.py [--secs 2] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import zring

RECORD = 12288
SIZES = (16384, 8192)
LOADER = dict(num_workers=2, prefetch_size=4)


def rate(mix: zring.Mixture, grouped: bool, shard: tuple[int, int] | None, secs: float) -> float:
    dl = zring.DataLoader(mix, batch_size=256, mode=2, seed=0, shard=shard, **LOADER)
    if grouped:
        state = dl.state()
        dl.close()
        del state["mixture"]["order"]
        dl = zring.DataLoader(mix, state=state, shard=shard, **LOADER)
    with dl:
        for _ in range(20):
            next(dl)
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < secs:
            next(dl)
            n += 1
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", help="where to write the stores (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        sources = []
        for k, n in enumerate(SIZES):
            x = np.random.default_rng(k).integers(0, 255, (n, RECORD), dtype=np.uint8)
            zring.write_dataset(Path(tmp) / f"s{k}", x, codec="raw")
            sources.append({"x": zring.Dataset(Path(tmp) / f"s{k}")})
        mix = zring.mix(sources, [0.7, 0.3])
        runs: dict[tuple[bool, tuple[int, int] | None], list[float]] = {}
        for _ in range(args.rounds):
            for grouped in (False, True):
                for shard in (None, (0, 8)):
                    runs.setdefault((grouped, shard), []).append(rate(mix, grouped, shard, args.secs))
        print("| rows | shard | batches/s (median) | rounds |")
        print("|---|---|---:|---|")
        for (grouped, shard), v in runs.items():
            print(f"| {'grouped' if grouped else 'interleaved'} | {'0 of 8' if shard else 'all'} | "
                  f"{np.median(v):,.0f} | {', '.join(f'{x:.0f}' for x in v)} |")
        for s in sources:
            s["x"].close()


if __name__ == "__main__":
    main()
