"""Checkpoint cost on a large store: zring.jax's state() and resume check.

A checkpoint records a fingerprint of every stream's store, and a resume
checks it. This builds a store of 10^7 tiny records (4-byte int32, raw; about
330 MiB of table) under $ZRING_BENCH_DIR/checkpoint (default
``bench-data/checkpoint``, reused when complete) and times, in this process:

  * ``zring.jax.fingerprint`` on a freshly opened Dataset (the first call),
    and the median of 20 more;
  * ``zring.jax.checkpoint_state`` (what ``state()`` of the JAX loaders
    returns), median of 20;
  * the resume check ``zring.jax.restore_loader`` performs (fingerprint and
    length against the saved state), median of 20.

Usage: python benches/checkpoint_bench.py [--records N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

import zring
import zring.jax as zjax

REPO = Path(__file__).resolve().parent.parent


def timed(fn, n: int) -> float:
    """Median seconds of ``n`` calls."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    args = ap.parse_args()
    root = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "checkpoint"
    path = root / f"x-{args.records}"
    done = root / f".x-{args.records}.complete"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        zring.write_dataset(path, np.arange(args.records, dtype=np.int32), codec="raw", overwrite=True)
        print(f"wrote {args.records} records in {time.perf_counter() - t:.1f} s")
        done.write_text("1")
    t = time.perf_counter()
    ds = zring.Dataset(path)
    opened = time.perf_counter() - t
    streams = {"x": ds}
    t = time.perf_counter()
    zjax.fingerprint(streams)
    first = time.perf_counter() - t
    sampler = zring.Sampler(len(ds), 256, 2, 0).state()
    state = zjax.checkpoint_state(streams, sampler)
    print(f"zring {zring.__version__} from {Path(zring.__file__).parent}")
    print(f"store: {len(ds)} records")
    print(f"open Dataset:              {opened * 1e3:9.2f} ms")
    print(f"fingerprint, first call:   {first * 1e3:9.2f} ms")
    print(f"fingerprint:               {timed(lambda: zjax.fingerprint(streams), 20) * 1e3:9.2f} ms")
    print(f"checkpoint_state (state()):{timed(lambda: zjax.checkpoint_state(streams, sampler), 20) * 1e3:9.2f} ms")
    print(f"resume check:              {timed(lambda: zjax._check_state(state, streams), 20) * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
