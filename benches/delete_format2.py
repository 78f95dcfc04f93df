"""Delete one record among 1 M 4-byte labels sealed in table format 2,
against the same store in format 1, with the same build.

A delete rewrites the table, reading every record of a fixed section; each
4 KiB block of records is to be read and checked once, not once per record
in it. Prints the best of three runs per format and their ratio.

    ZRING_MMAP=0 python benches/delete_format2.py   # entries read through the file
    python benches/delete_format2.py

The stores go under ``ZRING_BENCH_DIR`` (default: the system's temporary
directory, which may be tmpfs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from zring import _zring

N = 1_000_000
RUNS = 3


def main() -> None:
    root = tempfile.mkdtemp(dir=os.environ.get("ZRING_BENCH_DIR"))
    labels = np.arange(N, dtype=np.uint32).view(np.uint8)
    best = {}
    try:
        for fmt in (1, 2):
            p = os.path.join(root, f"format{fmt}")
            with _zring.Store(p, "x", codec="raw") as s:
                s.append_fixed(labels, 4)
                s.sync()
                if fmt == 2:
                    s.compact(2)
            times = []
            for _ in range(RUNS):
                q = p + "-run"
                shutil.rmtree(q, ignore_errors=True)
                shutil.copytree(p, q)
                with _zring.Store(q, "a") as s:
                    t = time.perf_counter()
                    s.delete(np.array([12345], dtype=np.uint64))
                    times.append(time.perf_counter() - t)
                    assert len(s) == N - 1
            best[fmt] = min(times)
            runs = ", ".join(f"{t:.3f}" for t in times)
            print(f"format {fmt}: delete of 1 among {N:,} labels: {best[fmt]:.3f} s (runs {runs})")
        print(f"format 2 / format 1: {best[2] / best[1]:.2f}")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
