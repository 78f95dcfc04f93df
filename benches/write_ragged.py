"""write_ragged of many small documents against megatron-core's
``IndexedDatasetBuilder`` (issue 38: 1 M documents took zring 69 s against
Megatron's 20 s), in one process, rounds interleaved.

The documents: ``--docs`` uint16 token documents of 1..``--max-len`` tokens
(uniform, seed 0), made once in memory as NumPy arrays (and, for Megatron,
zero-copy torch tensors of them, as a tokenizer pipeline hands it). Each
round, in turn:

* megatron-core: ``IndexedDatasetBuilder(PREFIX.bin, dtype=np.uint16)``,
  ``add_document(tensor, [len])`` per document, ``finalize(PREFIX.idx)``;
* zring raw: ``zring.write_ragged(DST, docs, codec="raw")`` (synced and
  sealed when it returns, as every zring write is);
* zring zstd: the same with the default codec.

Reported: each one's median wall time over the rounds and documents/s, and
zring's time over Megatron's (median of the rounds' ratios). Output files go
to ``--dir`` (default: a temporary directory under ``target/``) and are
removed after each round. Needs torch and megatron-core in the environment
(not in requirements-dev.txt: torch is several GB).

    python benches/write_ragged.py [--docs 1000000] [--max-len 256] [--rounds 3] [--out bench-results/lm-speed.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import zring  # noqa: E402


def documents(n: int, max_len: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, max_len + 1, n)
    tokens = rng.integers(0, 32000, int(lens.sum()), dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lens)])
    return [tokens[starts[i]:starts[i + 1]] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "target"))
    ap.add_argument("--out")
    a = ap.parse_args()

    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron.core.package_info import __version__ as mc_version

    torch.set_num_threads(1)
    docs = documents(a.docs, a.max_len)
    tensors = [torch.from_numpy(d) for d in docs]
    tokens = sum(len(d) for d in docs)
    os.makedirs(a.dir, exist_ok=True)

    def megatron(d: Path) -> None:
        b = IndexedDatasetBuilder(str(d / "m.bin"), dtype=np.uint16)
        for t in tensors:
            b.add_document(t, [len(t)])
        b.finalize(str(d / "m.idx"))

    def zring_raw(d: Path) -> None:
        zring.write_ragged(d / "z", docs, codec="raw", progress=False)

    def zring_zstd(d: Path) -> None:
        zring.write_ragged(d / "z", docs, progress=False)

    contestants = {"megatron-core IndexedDatasetBuilder": megatron, "zring write_ragged raw": zring_raw,
                   "zring write_ragged zstd": zring_zstd}
    times: dict[str, list[float]] = {k: [] for k in contestants}
    for r in range(a.rounds):
        for name, fn in contestants.items():
            d = Path(tempfile.mkdtemp(dir=a.dir))
            try:
                t = time.perf_counter()
                fn(d)
                times[name].append(time.perf_counter() - t)
            finally:
                shutil.rmtree(d)
            print(f"round {r}: {name}: {times[name][-1]:.2f} s", flush=True)
    base = "megatron-core IndexedDatasetBuilder"
    lines = [f"## write_ragged against megatron-core's IndexedDatasetBuilder, {a.docs:,} documents "
             f"(median of {a.rounds} interleaved rounds)", "",
             f"{a.docs:,} uint16 documents of 1..{a.max_len} tokens ({tokens / 1e6:.0f} M tokens, "
             f"{2 * tokens / 2**20:.0f} MiB); {common.machine(Path(a.dir))}",
             f"zring {zring.__version__}, megatron-core {mc_version}, torch {torch.__version__}, numpy {np.__version__}",
             "", "| writer | median s | documents/s | time over megatron-core (median of rounds' ratios) |",
             "|---|---:|---:|---:|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = statistics.median(t / m for t, m in zip(ts, times[base]))
        lines.append(f"| {name} | {med:.2f} | {a.docs / med:,.0f} | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
