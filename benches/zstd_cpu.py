"""CPU-seconds per GiB of hot zstd gathers against the codec alone, rounds interleaved.

A loaded host moves every contender's throughput by the cores it happens to
get; the CPU time a contender spends per GiB delivered holds still, and no
reader can spend less than zstd itself on the same frames. Per round, each
row gathers 64 batches of 256 records of 12 KiB (benches/hot.py's stores in
$ZRING_BENCH_DIR/hot, made by running hot.py once) twice over, timing the
process's CPU (every thread); the ceiling row is
``zring._zring.ceiling("decode", ...)`` on one thread over 4,096 of the same
tiles (no store, no Python), its process CPU over the bytes it decoded.

Rows: zring zstd (random indices; the same in order), zring zstd_dict
(a trained dictionary, level 3), loaderx 0.7.3 zstd (random), the ceiling.

    python benches/zstd_cpu.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import compare  # noqa: E402

import zring  # noqa: E402

RECORD, BATCH, N = 12288, 256, 16384


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import loaderx

    root = Path(os.environ.get("ZRING_BENCH_DIR", common.REPO / "bench-data")) / "hot"
    need = ["zring-zstd", "zring-zstd_dict", "loaderx-zstd"]
    missing = [k for k in need if not (root / f"{k}-{N}.complete").exists()]
    if missing:
        sys.exit(f"{root} lacks {', '.join(missing)}: run benches/hot.py once with the same ZRING_BENCH_DIR")
    rng = np.random.default_rng(0)
    rand = [rng.integers(0, N, BATCH, dtype=np.uint64) for _ in range(64)]
    seq = [np.arange(s, s + BATCH, dtype=np.uint64) for s in range(0, N, BATCH)]
    z = zring.Dataset(str(root / f"zring-zstd-{N}"))
    zd = zring.Dataset(str(root / f"zring-zstd_dict-{N}"))
    lx = loaderx.Dataset(str(root / f"loaderx-zstd-{N}"))
    assert (z.__getitems__(rand[0]) == zd.__getitems__(rand[0])).all()
    rows = {
        "zring zstd, random records": (z, rand),
        "zring zstd, records in order": (z, seq),
        "zring zstd_dict, random records": (zd, rand),
        "loaderx 0.7.3 zstd, random records": (lx, rand),
    }
    flat = compare.make_records(4096).reshape(-1)
    got: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, (ds, batches) in rows.items():
            for p in (root / f"{'zring' if ds is not lx else 'loaderx'}-"
                      f"{'zstd_dict' if ds is zd else 'zstd'}-{N}",):
                compare.warm(p)
            ds.__getitems__(batches[0])
            c = time.process_time()
            for _ in range(2):
                for b in batches:
                    ds.__getitems__(b)
            got.setdefault(name, []).append((time.process_time() - c) / (2 * len(batches) * BATCH * RECORD / (1 << 30)))
        c, w = time.process_time(), time.perf_counter()
        mib = zring._zring.ceiling("decode", flat, RECORD, 1)
        got.setdefault("ceiling: zstd alone, one thread", []).append(
            (time.process_time() - c) / (mib * (time.perf_counter() - w) / 1024))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in got.items()), file=sys.stderr, flush=True)
    floor = float(np.median(got["ceiling: zstd alone, one thread"]))
    print(f"CPU-s per GiB of decoded 12 KiB records, {args.rounds} interleaved rounds; "
          f"{common.versions(('zring', 'loaderx', 'numpy'))}\n")
    print("| reader | CPU-s per GiB, per round | median | ÷ ceiling |")
    print("|---|---|---:|---:|")
    for k, v in got.items():
        print(f"| {k} | {', '.join(f'{x:.2f}' for x in v)} | {np.median(v):.2f} | {np.median(v) / floor:.2f} |")


if __name__ == "__main__":
    main()
