"""Time and peak memory of converting a Megatron dataset whose sequences are
scattered through ``.bin`` (indexed in another order than written), the case
that gathered each sequence with a Python call (issue 36: a 22 MiB ``.idx``
took 1.4 GB and 18.7 s).

The dataset is made here: ``--sequences`` int32 sequences of 1..15 tokens,
one a document, written to ``.bin`` in a random order (``.idx`` of 20 bytes a
sequence: 1.15 M sequences make 22 MiB). The conversion runs in a child
process, whose peak RSS (``ru_maxrss``) is reported with its wall time.

    python benches/megatron_import.py [--sequences 1150000] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make(prefix: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 16, n).astype("<i4")
    order = rng.permutation(n)
    sizes = lengths[order].astype(np.int64) * 4
    pointers = np.empty(n, np.int64)
    pointers[order] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    tokens = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
    with open(f"{prefix}.bin", "wb") as f:
        f.write(tokens.tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, 4) + struct.pack("<QQ", n, n + 1))
        f.write(lengths.tobytes() + pointers.astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())


def child(prefix: str, dst: str) -> None:
    import zring

    t = time.perf_counter()
    zring.convert(prefix, dst, codec="raw", progress=False)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{wall:.2f} {rss}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=1_150_000)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "target"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        prefix = Path(d) / "scattered"
        make(prefix, a.sequences)
        idx_mib = os.path.getsize(f"{prefix}.idx") / 2**20
        out = subprocess.run([sys.executable, __file__, "--child", str(prefix), str(Path(d) / "z")],
                             check=True, capture_output=True, text=True).stdout.split()
        wall, rss = float(out[-2]), int(out[-1])
        print(f"{a.sequences:,} scattered sequences, .idx {idx_mib:.1f} MiB: {wall:.2f} s, peak RSS {rss / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
