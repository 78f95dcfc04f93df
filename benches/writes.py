"""write_dataset of zring against loaderx, interleaved, one fresh process per write.

The records are benches/compare.py's 12 KiB tiles (zstd shrinks them about
1.4x), saved once as a ``.npy`` and read back with ``mmap_mode="r"`` from the
page cache, as section (e) of compare.py does. Every round writes a fresh
store with each contender, in a new Python process (import, write including
the sync ``write_dataset`` does before it returns, exit); the order of the
contenders rotates from round to round. Reported: MiB/s of record bytes per
write (the time around the ``write_dataset`` call alone), the process's CPU
seconds over it, each round's ratio to loaderx, and the medians.

    python benches/writes.py [--records N] [--rounds R] [--codec zstd]
                             [--levels 2,1] [--base DIR] [--data DIR] [--out FILE]

``--levels`` adds a zring contender per zstd level (``write_dataset(...,
level=L)``); plain "zring" and loaderx write at their default, level 3.

In every round the parent also measures the compress ceiling: zstd alone
(level 3, each record its own frame, one context per thread, no store, no
I/O) on every core over 4,096 of the same records
(``zring._zring.ceiling("compress", ...)``, built by ``make develop-bench``),
and each writer's median is reported ÷ the median ceiling, with the
ceiling's CPU-seconds per GiB beside the writers' (the floor at level 3).

``--base DIR`` adds a contender "zring (base)": the ``zring`` package found
in DIR (a copy of an earlier build's ``py/python/zring``), for a before/after
A/B in the same run. Data goes to $ZRING_BENCH_DIR/writes (default
``bench-data/writes`` in the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MIB = 1 << 20


def one(lib: str, src: str, dst: str, codec: str, level: str = "") -> None:
    """Child: one write_dataset, printing {"wall", "cpu", "disk"} as JSON."""
    import importlib

    mod = importlib.import_module(lib)
    arr = np.load(src, mmap_mode="r")
    with open(src, "rb", buffering=0) as fh:  # the source in the page cache
        while fh.read(8 << 20):
            pass
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if level:
        mod.write_dataset(dst, arr, codec=codec, level=int(level))
    else:
        mod.write_dataset(dst, arr, codec=codec)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    disk = sum(os.stat(p).st_blocks * 512 for p in Path(dst).rglob("*") if p.is_file())
    print(json.dumps({"wall": wall, "cpu": cpu, "disk": disk, "file": mod.__file__}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--codec", default="zstd")
    ap.add_argument("--levels", default="", help="comma-separated zstd levels: a zring contender each (zring's level= argument)")
    ap.add_argument("--base", type=Path, help="a directory holding an earlier build's zring package")
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "writes")
    ap.add_argument("--out", type=Path, help="append the table (markdown) to this file")
    args = ap.parse_args()

    sys.path.insert(0, str(HERE))
    from compare import make_records  # noqa: E402  (the same tiles as compare.py)

    args.data.mkdir(parents=True, exist_ok=True)
    src = args.data / f"src-{args.records}.npy"
    if not src.exists():
        tmp = src.with_suffix(".tmp.npy")
        np.save(tmp, make_records(args.records))
        tmp.rename(src)
    nbytes = args.records * 3 * 64 * 64

    # (name, module, PYTHONPATH entry or None, zstd level or "")
    contenders = [("zring", "zring", None, ""), ("loaderx", "loaderx", None, "")]
    for lv in filter(None, args.levels.split(",")):
        contenders.insert(-1, (f"zring level={int(lv)}", "zring", None, str(int(lv))))
    if args.base is not None:
        contenders.insert(1, ("zring (base)", "zring", str(args.base.resolve()), ""))
    runs: dict[str, list[dict]] = {name: [] for name, *_ in contenders}
    import zring

    fn = getattr(zring._zring, "ceiling", None)
    sample = make_records(min(4096, args.records)).reshape(-1)
    ceils: list[float] = []
    ceil_cpu: list[float] = []  # CPU-s per GiB of the ceiling's threads
    for r in range(args.rounds):
        if fn is not None and args.codec == "zstd":
            ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            ceils.append(fn("compress", sample, 3 * 64 * 64, os.cpu_count() or 1, 3))
            ru1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            ceil_cpu.append(cpu / (ceils[-1] * wall / 1024))
            print(f"round {r + 1} compress ceiling {ceils[-1]:7.1f} MiB/s", file=sys.stderr)
        k = r % len(contenders)
        for name, lib, path, level in contenders[k:] + contenders[:k]:
            dst = args.data / "store"
            shutil.rmtree(dst, ignore_errors=True)
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run([sys.executable, __file__, "--one", lib, str(src), str(dst), args.codec, level],
                                 env=env, check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            runs[name].append(got)
            print(f"round {r + 1} {name:<13} {nbytes / MIB / got['wall']:7.1f} MiB/s  cpu {got['cpu']:.2f} s  "
                  f"wall {got['wall']:.3f} s  disk {got['disk'] / MIB:.1f} MiB", file=sys.stderr)
        shutil.rmtree(args.data / "store", ignore_errors=True)

    def rate(g: dict) -> float:
        return nbytes / MIB / g["wall"]

    lx = runs["loaderx"]
    ceil = float(np.median(ceils)) if ceils else None
    lines = [
        f"{args.records:,} records of 12 KiB ({nbytes / MIB:.0f} MiB), codec {args.codec}, {args.rounds} rounds, "
        f"{os.cpu_count()} cpus; each write a fresh process and store, contenders' order rotating per round",
        "",
        "| writer | MiB/s per round | median MiB/s | CPU-s per GiB (median) | on disk MiB | × loaderx per round "
        "| × loaderx (median of rounds) | ÷ compress ceiling (medians) |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for name, *_ in contenders:
        g = runs[name]
        rates = [rate(x) for x in g]
        ratios = [rate(x) / rate(y) for x, y in zip(g, lx)]
        cpu = float(np.median([x["cpu"] / (nbytes / (1 << 30)) for x in g]))
        lines.append(f"| {name} | {', '.join(f'{v:.0f}' for v in rates)} | {np.median(rates):.0f} | {cpu:.2f} | "
                     f"{g[-1]['disk'] / MIB:.1f} | {', '.join(f'{v:.2f}' for v in ratios)} | {np.median(ratios):.2f} | "
                     + (f"{np.median(rates) / ceil:.2f} |" if ceil else "- |"))
    if ceil:
        lines += ["", f"Compress ceiling (zstd level 3 alone, {os.cpu_count()} threads, per round): "
                  f"{', '.join(f'{v:.0f}' for v in ceils)} MiB/s, median {ceil:.0f}; "
                  f"{float(np.median(ceil_cpu)):.2f} CPU-s per GiB"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(*sys.argv[2:7])
    else:
        main()
