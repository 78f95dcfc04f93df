"""Peak disk of a one-shot write against the store it leaves (issue 36).

A thread sums the allocated bytes (``st_blocks * 512``, what ``du`` counts)
of every file under a fresh parent directory (the staging directory
``write_dataset`` builds in included) every millisecond while the main thread
writes; the peak is the largest sum seen, the final size the store's once
the write returns.

* ``--labels`` (default 4 million) int64 labels through ``write_dataset``;
* ``--ragged`` (default 0) int32 records of 8..127 tokens through
  ``write_ragged`` (raw).

    python benches/peak_disk.py [--labels 4000000] [--ragged 1000000] [--dir D]

``--dir`` is where the parent directory is made (default: beside this
script's checkout, on its disk; tmpfs would count the same bytes).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

import zring


def allocated(root: str) -> int:
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def measure(parent: str, write) -> tuple[int, int]:
    peak = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, allocated(parent))
            done.wait(0.001)

    t = threading.Thread(target=poll)
    t.start()
    try:
        write()
    finally:
        done.set()
        t.join()
    final = allocated(parent)
    return max(peak, final), final


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--labels", type=int, default=4_000_000)
    ap.add_argument("--ragged", type=int, default=0)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "target"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    rows = []
    if a.labels:
        labels = np.arange(a.labels, dtype=np.int64)
        with tempfile.TemporaryDirectory(dir=a.dir) as parent:
            peak, final = measure(parent, lambda: zring.write_dataset(os.path.join(parent, "s"), labels))
            rows.append((f"write_dataset {a.labels:,} int64 labels", peak, final))
    if a.ragged:
        rng = np.random.default_rng(0)
        lens = rng.integers(8, 128, a.ragged)
        arrays = [np.arange(n, dtype=np.int32) for n in lens]
        with tempfile.TemporaryDirectory(dir=a.dir) as parent:
            peak, final = measure(parent, lambda: zring.write_ragged(os.path.join(parent, "s"), arrays, codec="raw"))
            rows.append((f"write_ragged {a.ragged:,} int32 records of 8..127", peak, final))
    print(f"{'write':<48} {'peak MB':>9} {'final MB':>9} {'peak/final':>10}")
    for name, peak, final in rows:
        print(f"{name:<48} {peak / 1e6:>9.1f} {final / 1e6:>9.1f} {peak / final:>10.3f}")


if __name__ == "__main__":
    main()
