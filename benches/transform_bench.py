"""DataLoader throughput with a transform that releases the GIL: zring's
transform workers against its consumer-thread transform and against loaderx.

    python benches/transform_bench.py [--dir DIR] [--records N] [--steps S] [--rounds R] [--data tiles|smooth]
                                      [--transform sleep|numpy] [--workers W] [--base DIR]

The store: N records of 12 KiB (3 x 64 x 64 uint8), zstd, written once by
each library into DIR (default bench-data/transform). ``tiles`` are the
image-like tiles of benches/ab.py (compress about 1.4x; decoding is most of
the gather), ``smooth`` the same tiles without their noise (compress far
better; the gather is cheap, so the transform dominates).

Each loader: batch 256, num_workers 4, prefetch 4, mode 1 (iid), transform
``lambda b: (time.sleep(0.004), b)[1]`` (4 ms of GIL-free work per batch;
a consumer-thread transform caps out at 250 batches/s), or with ``--transform
numpy`` a NumPy augmentation that does real work on every batch (a random
horizontal flip of the batch, then uint8 to float32 and per-channel
normalisation: ``(x - mean) * (1 / std)``, as an image pipeline does; NumPy
releases the GIL for the arithmetic). Every measurement runs
in its own process (one contender per process, no shared warm-up), rounds
alternate the contenders, and the table reports the median. The rows
without a transform are the gather ceilings for context. ``--base DIR``
adds zring contenders from an earlier build's package in DIR (for a
before/after A/B in the same run), ``--workers`` sets ``num_workers``.
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
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1) * 255
INV_STD = 1 / (np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1) * 255)


def augment(batch: dict, rng: np.random.Generator) -> dict:
    """A NumPy image augmentation: random horizontal flip, then uint8 to
    normalised float32 (a new array of 4x the bytes)."""
    x = batch["data"]
    if rng.random() < 0.5:
        x = x[..., ::-1]
    out = x.astype(np.float32)
    out -= MEAN
    out *= INV_STD
    return {**batch, "data": out}
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


def run_one(d: str, lib: str, with_transform: bool, transform_workers: int | None, steps: int,
            kind: str = "sleep", workers: int = WORKERS) -> None:
    """One measurement in this process; prints a JSON line and exits."""
    m = importlib.import_module(lib)
    kw = {}
    if with_transform and kind == "numpy":
        rng = np.random.default_rng(0)
        kw["transform"] = lambda b: augment(b, rng)
    elif with_transform:
        kw["transform"] = lambda b: (time.sleep(SLEEP), b)[1]
    if transform_workers is not None:
        kw["transform_workers"] = transform_workers
    dl = m.DataLoader({"data": m.Dataset(os.path.join(d, lib))}, num_workers=workers, batch_size=B,
                      prefetch_size=PREFETCH, mode=1, seed=42, **kw)
    it = iter(dl)
    for _ in range(20):
        next(it)
    c0, t0 = os.times(), time.perf_counter()
    for _ in range(steps):
        batch = next(it)
    wall, c1 = time.perf_counter() - t0, os.times()
    assert batch["data"].shape == (B, *SHAPE)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)  # every thread of this process
    print(json.dumps({"batches_per_s": steps / wall, "cpu_ms_per_batch": 1000 * cpu / steps, "file": m.__file__}),
          flush=True)
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
    ap.add_argument("--transform", choices=("sleep", "numpy"), default="sleep")
    ap.add_argument("--workers", type=int, default=WORKERS, help="num_workers of every loader")
    ap.add_argument("--base", help="a directory holding an earlier build's zring package (adds its contenders)")
    ap.add_argument("--run", nargs=3, metavar=("LIB", "TRANSFORM", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = os.path.join(args.dir, args.data)
    if args.run:
        lib, on, tw = args.run
        run_one(d, lib, on == "1", None if tw == "default" else int(tw), args.steps, args.transform, args.workers)
        return

    setup(d, args.records, args.data)
    load_before = os.getloadavg()[0]
    contenders = list(CONTENDERS)
    if args.base:
        contenders[2:2] = [("zring (base), transform_workers default", "zring", True, None, args.base),
                           ("zring (base), no transform", "zring", False, None, args.base)]
    contenders = [c if len(c) == 5 else (*c, None) for c in contenders]
    results: dict[str, list[float]] = {c[0]: [] for c in contenders}
    cpu_ms: dict[str, list[float]] = {}  # the process's CPU time per batch delivered
    for r in range(args.rounds):
        k = r % len(contenders)
        for label, lib, on, tw, base in contenders[k:] + contenders[:k]:
            cmd = [sys.executable, __file__, "--dir", args.dir, "--data", args.data, "--steps", str(args.steps),
                   "--transform", args.transform, "--workers", str(args.workers),
                   "--run", lib, "1" if on else "0", "default" if tw is None else str(tw)]
            env = dict(os.environ)
            if base:
                env["PYTHONPATH"] = os.path.abspath(base) + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, env=env).stdout
            got = json.loads(out.strip().splitlines()[-1])
            results[label].append(got["batches_per_s"])
            cpu_ms.setdefault(label, []).append(got["cpu_ms_per_batch"])
            print(f"round {r + 1}/{args.rounds}: {label}: {results[label][-1]:.1f} batches/s, "
                  f"{cpu_ms[label][-1]:.1f} CPU-ms per batch", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in results.items()}
    ref = {True: med["loaderx 0.7.3"], False: med["loaderx 0.7.3, no transform"]}
    import zring

    what = f"sleep({SLEEP}) per batch" if args.transform == "sleep" else "NumPy flip + float32 normalisation"
    print(f"DataLoader, {args.records} zstd records of 12 KiB ('{args.data}' data), batch {B}, "
          f"num_workers {args.workers}, prefetch {PREFETCH}, mode 1; transform = {what}; "
          f"{args.steps} steps after 20 warm-up, median of {args.rounds} rounds, one process per run.")
    print()
    print(f"Machine: {os.cpu_count()} cpus, Python {platform.python_version()}, zring {zring.__version__}, "
          f"loaderx {importlib.import_module('loaderx').__version__}; 1-minute load average "
          f"{load_before:.2f} before the runs, {os.getloadavg()[0]:.2f} after (other work on the "
          f"machine shows up here).")
    print()
    print("| loader | batches/s | rounds | × loaderx (of the medians) | × loaderx, round by round: median (range) "
          "| CPU-ms per batch (median) |")
    print("|---|---:|---|---:|---|---:|")
    for label, _lib, on, _tw, _base in contenders:
        rounds = ", ".join(f"{v:.0f}" for v in results[label])
        lx = results["loaderx 0.7.3" if on else "loaderx 0.7.3, no transform"]
        pairs = [a / b for a, b in zip(results[label], lx)]
        print(f"| {label} | {med[label]:.1f} | {rounds} | {med[label] / ref[on]:.2f} | "
              f"{statistics.median(pairs):.2f} ({min(pairs):.2f}–{max(pairs):.2f}) | "
              f"{statistics.median(cpu_ms[label]):.1f} |")
    print()
    print("Command: `" + " ".join(["python", "benches/transform_bench.py", *sys.argv[1:]]) + "`")


if __name__ == "__main__":
    main()
