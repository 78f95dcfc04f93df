"""DataLoader throughput with a transform that releases the GIL: zring's
transform workers against its consumer-thread transform and against loaderx.

    python benches/transform_bench.py [--dir DIR] [--records N] [--steps S] [--rounds R] [--data tiles|smooth]

The store: N records of 12 KiB (3 x 64 x 64 uint8), zstd, written once by
each library into DIR (default bench-data/transform). ``tiles`` are the
image-like tiles of benches/ab.py (compress about 1.4x; decoding is most of
the gather), ``smooth`` the same tiles without their noise (compress far
better; the gather is cheap, so the transform dominates).

Each loader: batch 256, num_workers 4, prefetch 4, mode 1 (iid), transform
``lambda b: (time.sleep(0.004), b)[1]`` (4 ms of GIL-free work per batch;
a consumer-thread transform caps out at 250 batches/s). Every measurement runs
in its own process (one contender per process, no shared warm-up), rounds
alternate the contenders, and the table reports the median. The rows
without a transform are the gather ceilings for context.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

B, WORKERS, PREFETCH, SLEEP = 256, 4, 4, 0.004
SHAPE = (3, 64, 64)  # 12 KiB of uint8

# (label, library, transform on?, transform_workers or None for the default)
CONTENDERS = [
    ("zring, transform_workers=0 (consumer thread)", "zring", True, 0),
    ("zring, transform_workers default (= num_workers)", "zring", True, None),
    ("loaderx 0.7.3", "loaderx", True, None),
    ("zring, no transform", "zring", False, None),
    ("loaderx 0.7.3, no transform", "loaderx", False, None),
]


def tiles(n: int, noise: bool) -> np.ndarray:
    """Image-like 12 KiB records, distinct per record (benches/ab.py's tiles, vectorised)."""
    rng = np.random.default_rng(0)
    y = np.arange(64, dtype=np.uint32)[:, None]
    x = np.arange(64, dtype=np.uint32)[None, :]
    out = np.empty((n, *SHAPE), np.uint8)
    for lo in range(0, n, 1024):
        i = np.arange(lo, min(n, lo + 1024), dtype=np.uint32)[:, None, None]
        base = (x * (1 + i % 3) + y * (1 + i % 5) + i) % 256
        for c in range(3):
            v = base + c * 40
            if noise:
                v = v + rng.integers(0, 6, v.shape, dtype=np.uint32)
            out[lo:lo + len(i), c] = (v % 256).astype(np.uint8)
    return out


def setup(d: str, n: int, data: str) -> None:
    marker = os.path.join(d, "params.json")
    params = {"records": n, "data": data, "shape": SHAPE}
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == json.loads(json.dumps(params)):
                return
    os.makedirs(d, exist_ok=True)
    a = tiles(n, noise=data == "tiles")
    for lib in ("zring", "loaderx"):
        path = os.path.join(d, lib)
        if os.path.exists(path):
            import shutil

            shutil.rmtree(path)
        importlib.import_module(lib).write_dataset(path, a, codec="zstd")
    with open(marker, "w") as f:
        json.dump(params, f)


def run_one(d: str, lib: str, with_transform: bool, transform_workers: int | None, steps: int) -> None:
    """One measurement in this process; prints a JSON line and exits."""
    m = importlib.import_module(lib)
    kw = {}
    if with_transform:
        kw["transform"] = lambda b: (time.sleep(SLEEP), b)[1]
    if transform_workers is not None:
        kw["transform_workers"] = transform_workers
    dl = m.DataLoader({"data": m.Dataset(os.path.join(d, lib))}, num_workers=WORKERS, batch_size=B,
                      prefetch_size=PREFETCH, mode=1, seed=42, **kw)
    it = iter(dl)
    for _ in range(20):
        next(it)
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = next(it)
    wall = time.perf_counter() - t0
    assert batch["data"].shape == (B, *SHAPE)
    print(json.dumps({"batches_per_s": steps / wall}), flush=True)
    if lib == "zring":
        dl.close()
    os._exit(0)  # loaderx's daemon threads would otherwise delay exit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join("bench-data", "transform"))
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", choices=("tiles", "smooth"), default="tiles")
    ap.add_argument("--run", nargs=3, metavar=("LIB", "TRANSFORM", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = os.path.join(args.dir, args.data)
    if args.run:
        lib, on, tw = args.run
        run_one(d, lib, on == "1", None if tw == "default" else int(tw), args.steps)
        return

    setup(d, args.records, args.data)
    load_before = os.getloadavg()[0]
    results: dict[str, list[float]] = {c[0]: [] for c in CONTENDERS}
    for r in range(args.rounds):
        for label, lib, on, tw in CONTENDERS:
            cmd = [sys.executable, __file__, "--dir", args.dir, "--data", args.data, "--steps", str(args.steps),
                   "--run", lib, "1" if on else "0", "default" if tw is None else str(tw)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
            results[label].append(json.loads(out.strip().splitlines()[-1])["batches_per_s"])
            print(f"round {r + 1}/{args.rounds}: {label}: {results[label][-1]:.1f} batches/s", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in results.items()}
    ref = {True: med["loaderx 0.7.3"], False: med["loaderx 0.7.3, no transform"]}
    import zring

    print(f"DataLoader, {args.records} zstd records of 12 KiB ('{args.data}' data), batch {B}, "
          f"num_workers {WORKERS}, prefetch {PREFETCH}, mode 1; transform = sleep({SLEEP}) per batch; "
          f"{args.steps} steps after 20 warm-up, median of {args.rounds} rounds, one process per run.")
    print()
    print(f"Machine: {os.cpu_count()} cpus, Python {platform.python_version()}, zring {zring.__version__}, "
          f"loaderx {importlib.import_module('loaderx').__version__}; 1-minute load average "
          f"{load_before:.2f} before the runs, {os.getloadavg()[0]:.2f} after (other work on the "
          f"machine shows up here).")
    print()
    print("| loader | batches/s | rounds | × loaderx |")
    print("|---|---:|---|---:|")
    for label, _lib, on, _tw in CONTENDERS:
        rounds = ", ".join(f"{v:.0f}" for v in results[label])
        print(f"| {label} | {med[label]:.1f} | {rounds} | {med[label] / ref[on]:.2f} |")
    print()
    print("Command: `" + " ".join(["python", "benches/transform_bench.py", *sys.argv[1:]]) + "`")


if __name__ == "__main__":
    main()
