"""Packed tokens/s: zring.pack with labels, without, and megatron-core's
GPTDataset over the same corpus, in one process, rounds interleaved
(issue 38: with labels >= 0.8x without, and >= 5x GPTDataset).

The corpus: ``--docs`` uint16 documents of 50..4,000 tokens (uniform, seed
0), written once by megatron-core's ``IndexedDatasetBuilder`` and converted
with ``zring.convert`` (so both read the same tokens from disk, hot in the
page cache). Contestants, each timed for ``--secs`` a round:

* zring concat: ``DataLoader(zring.pack(docs, 2048), batch_size=32, mode=2,
  num_workers=2)``, batches of ``tokens``, ``segment_ids``, ``positions``;
* zring concat + labels: the same with ``labels=True, mask_boundaries=True``
  (``labels`` and ``loss_mask`` as well), what GPTDataset's samples carry;
* megatron-core GPTDataset: ``GPTDataset`` (sequence_length 2048,
  ``eod_mask_loss=True``, no attention mask) in ``torch.utils.data.
  DataLoader(batch_size=32, num_workers=2, shuffle=False)`` (its samples
  are already shuffled), batches of ``tokens``, ``labels``, ``loss_mask``,
  ``position_ids``.

tokens/s counts the ``tokens`` column (32 x 2048 a batch); the ratios are
medians of the rounds' ratios. Needs torch and
megatron-core (not in requirements-dev.txt: torch is several GB).

    python benches/pack_gpt.py [--docs 50000] [--secs 3] [--rounds 5] [--out bench-results/lm-speed.md]
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

SEQ, BATCH = 2048, 32


class Tok:
    """What GPTDataset asks of a tokenizer."""
    vocab_size = 32000
    eod = 0
    pad = 0
    unique_identifiers = {"class": "Tok", "vocab_size": 32000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "target"))
    ap.add_argument("--out")
    a = ap.parse_args()

    import torch
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split
    from megatron.core.package_info import __version__ as mc_version

    os.makedirs(a.dir, exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=a.dir))
    try:
        rng = np.random.default_rng(0)
        lens = rng.integers(50, 4001, a.docs)
        flat = rng.integers(1, 32000, int(lens.sum()), dtype=np.uint16)
        starts = np.concatenate([[0], np.cumsum(lens)])
        prefix = root / "corpus_text_document"
        b = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
        for i in range(a.docs):
            b.add_document(torch.from_numpy(flat[starts[i]:starts[i + 1]]), [int(lens[i])])
        b.finalize(f"{prefix}.idx")
        zring.convert(prefix, root / "z", codec="raw", progress=False)
        docs = zring.RaggedDataset(root / "z" / "tokens.zr")

        config = GPTDatasetConfig(random_seed=0, sequence_length=SEQ, blend=([str(prefix)], None), split="1,0,0",
                                  path_to_cache=str(root / "cache"), tokenizer=Tok(), reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=True, create_attention_mask=False)
        indexed = IndexedDataset(str(prefix))
        samples = 10 * int(lens.sum()) // SEQ
        gpt = GPTDataset(indexed, str(prefix), np.arange(a.docs, dtype=np.int32), samples, Split.train, config)

        def zring_loader(labels: bool):
            p = zring.pack(docs, SEQ, labels=labels, mask_boundaries=labels)
            dl = zring.DataLoader(p, batch_size=BATCH, mode=2, num_workers=2, prefetch_size=4, seed=0)
            while True:
                yield next(dl)

        def megatron_loader():
            while True:
                for batch in torch.utils.data.DataLoader(gpt, batch_size=BATCH, num_workers=2, shuffle=False,
                                                         persistent_workers=False, prefetch_factor=4):
                    yield batch

        its = {"zring pack concat": zring_loader(False),
               "zring pack concat + labels, loss_mask": zring_loader(True),
               "megatron-core GPTDataset (torch DataLoader, 2 workers)": megatron_loader()}
        for it in its.values():
            next(it)
        rates: dict[str, list[float]] = {k: [] for k in its}
        for r in range(a.rounds):
            for name, it in its.items():
                n = 0
                t0 = time.perf_counter()
                while (t := time.perf_counter() - t0) < a.secs:
                    n += int(np.prod(next(it)["tokens"].shape))
                rates[name].append(n / t)
                print(f"round {r}: {name}: {n / t / 1e6:.1f} M tokens/s", flush=True)
        plain, lab, meg = list(its)
        med = {k: statistics.median(v) for k, v in rates.items()}
        lines = [f"## Packed tokens/s: zring with and without labels against megatron-core's GPTDataset "
                 f"(seq 2048, batch 32, median of {a.rounds} interleaved rounds of {a.secs:g} s)", "",
                 f"{a.docs:,} uint16 documents of 50..4000 tokens ({lens.sum() / 1e6:.0f} M tokens); "
                 f"{common.machine(root)}",
                 f"zring {zring.__version__}, megatron-core {mc_version}, torch {torch.__version__}", "",
                 "| loader | M tokens/s | over zring without labels | zring with labels over it |", "|---|---:|---:|---:|"]
        for k in its:
            ratio = statistics.median(x / y for x, y in zip(rates[k], rates[plain]))
            over = statistics.median(y / x for x, y in zip(rates[k], rates[lab]))
            lines.append(f"| {k} | {med[k] / 1e6:.1f} | {ratio:.2f}x | {over:.1f}x |")
        text = "\n".join(lines) + "\n"
        print(text)
        if a.out:
            with open(a.out, "a") as f:
                f.write("\n" + text)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
