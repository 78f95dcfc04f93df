"""Converting a Parquet file of >= 1 GiB: zring.convert next to pyarrow reading it.

Writes (once, reused) $ZRING_BENCH_DIR/convert/tokens-<rows>.parquet: a token
dataset of ``--rows`` rows (default 2,100,000, a file of about 1.05 GiB) with a variable-length list of
int32 token ids (0..511 tokens, ids below 50,000), an int64 label and a short
UTF-8 string, in row groups of 16,384 rows. Then, in this process:

  1. ``pyarrow.parquet.read_table`` of the whole file (what any consumer pays
     to decode it), best of 3;
  2. ``zring.convert`` of the file into one store per column (zstd), once.

Each line gives wall seconds, MiB/s of the Parquet file, and cores busy (the
process's CPU seconds, every thread, over its wall seconds).

Usage: python benches/convert_bench.py [--rows N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import zring

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def make(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    writer = None
    group = 16_384
    for start in range(0, rows, group):
        n = min(group, rows - start)
        lens = rng.integers(0, 512, n)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        ids = np.arange(start, start + n)
        table = pa.table({
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            "label": pa.array(ids % 1000, type=pa.int64()),
            "text": pa.array([f"document {i}" for i in ids]),
        })
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=group)
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_100_000)
    args = ap.parse_args()
    root = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "convert"
    root.mkdir(parents=True, exist_ok=True)
    src = root / f"tokens-{args.rows}.parquet"
    if not src.exists():
        t = time.perf_counter()
        make(src.with_suffix(".partial"), args.rows)
        os.replace(src.with_suffix(".partial"), src)
        print(f"wrote {src.name} in {time.perf_counter() - t:.1f} s")
    size = src.stat().st_size
    print(f"{src.name}: {size / MIB:.0f} MiB, {args.rows} rows, "
          f"{pq.ParquetFile(src).num_row_groups} row groups; {os.cpu_count()} cores")
    best = None
    for _ in range(3):
        c, t = cpu(), time.perf_counter()
        table = pq.read_table(src)
        wall = time.perf_counter() - t
        del table
        if best is None or wall < best[0]:
            best = (wall, cpu() - c)
    rows = [("pyarrow.parquet.read_table", *best)]
    dst = root / "out"
    shutil.rmtree(dst, ignore_errors=True)
    c, t = cpu(), time.perf_counter()
    counts = zring.convert(src, dst, progress=False)
    rows.append(("zring.convert (zstd, 3 stores)", time.perf_counter() - t, cpu() - c))
    stored = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    print(f"stores: {counts}, {stored / MIB:.0f} MiB on disk")
    print()
    print("| | wall s | MiB/s of Parquet | cores busy |")
    print("|---|---:|---:|---:|")
    for name, wall, cpus in rows:
        print(f"| {name} | {wall:.2f} | {size / MIB / wall:.0f} | {cpus / wall:.2f} |")
    shutil.rmtree(dst, ignore_errors=True)


if __name__ == "__main__":
    main()
