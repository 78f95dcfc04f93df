"""Packing benchmark: zring.pack in the Rust loader against Grain's packing
and against zring's plain ragged loader, over the same documents.

The documents: ``--docs`` int32 token documents of 50..4,000 tokens
(uniform, seed 0), written once (codec raw) to ``$ZRING_BENCH_DIR`` (or
a temporary directory) and hot in the page cache; Grain reads the same
documents from memory (a list of NumPy arrays). One process, rounds
interleaved, each contestant timed for ``--secs`` per round; reported: the
median over rounds of tokens/s (all tokens of a batch, padding included)
and of real tokens/s (segment id > 0), and the real-token fraction.

* zring concat / first_fit: ``DataLoader(zring.pack(docs, 2048, mode=...),
  batch_size=32, mode=2, num_workers=2, prefetch_size=4)``;
* zring ragged: ``DataLoader({"tokens": docs}, batch_size=32, ...)`` (the
  same loader settings), its token rate the records' tokens;
* Grain ConcatThenSplit: ``MapDataset.source(docs).shuffle(0)
  .to_iter_dataset()`` then ``ConcatThenSplitIterDataset(length_struct=
  {"tokens": 2048})`` and ``.batch(32)``;
* Grain FirstFit: the same source with each document cut to its first 2,048
  tokens (FirstFit needs documents no longer than a row), then
  ``FirstFitPackIterDataset(num_packing_bins=32, ...)`` and ``.batch(32)``.

``--rss SECS`` instead runs zring concat (then first_fit) for SECS each and
samples the process's RSS every 10 s, reporting first/last/max.

``--labels`` instead times zring's packing with and without labels, in
interleaved rounds in one run: concat and first fit, each plain and with
``labels=True, mask_boundaries=True`` (the ``labels`` and ``loss_mask``
columns as well); tokens/s counts the ``tokens`` column (``B x seq_len``),
and the ratio is labelled over plain (the issue asks >= 0.8), of the
medians and the median of each round's ratio (the two run back to back).

    python benches/pack.py --docs 200000 --secs 5 --rounds 5 [--out bench-results/pack.md]
    python benches/pack.py --docs 200000 --rss 300
    python benches/pack.py --docs 100000 --secs 3 --rounds 5 --labels
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import zring  # noqa: E402

SEQ_LEN = 2048
BATCH = 32
LO, HI = 50, 4000
LOADER = dict(num_workers=2, prefetch_size=4, mode=2, seed=0)


def documents(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(LO, HI + 1, size=n)
    flat = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.int32)
    return np.split(flat, np.cumsum(lengths)[:-1])


def store(docs: list[np.ndarray], root: Path) -> zring.RaggedDataset:
    path = root / f"pack-docs-{len(docs)}"
    if not path.exists():
        t = time.perf_counter()
        zring.write_ragged(str(path), docs, codec="raw", progress=False)
        common.note(f"wrote {len(docs)} documents in {time.perf_counter() - t:.0f} s")
    ds = zring.RaggedDataset(str(path))
    assert len(ds) == len(docs)
    return ds


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Contestant:
    """An endless iterator of batches and how to count a batch's tokens."""

    def __init__(self, name, make, count):
        self.name, self.it, self.count = name, make(), count
        self.rates: list[float] = []
        self.real_rates: list[float] = []
        next(self.it)  # start-up (zring: cycle index; grain: first buffers)

    def run(self, secs: float) -> None:
        total = real = 0
        t0 = time.perf_counter()
        while (t := time.perf_counter() - t0) < secs:
            a, r = self.count(next(self.it))
            total += a
            real += r
        self.rates.append(total / t)
        self.real_rates.append(real / t)


def packed_count(b):
    seg = b["segment_ids"]
    return seg.size, int(np.count_nonzero(seg))


def ragged_count(b):
    values, _ = b["tokens"]
    return values.size, values.size


def grain_count(b):
    seg = b["tokens_segment_ids"]
    return seg.size, int(np.count_nonzero(seg))


def grain_pipelines(docs: list[np.ndarray], seq_len: int = SEQ_LEN):
    import grain
    from grain.experimental import ConcatThenSplitIterDataset, FirstFitPackIterDataset

    def concat():
        ds = grain.MapDataset.source([{"tokens": d} for d in docs]).shuffle(seed=0).repeat()
        ds = ConcatThenSplitIterDataset(ds.to_iter_dataset(), length_struct={"tokens": seq_len})
        return iter(ds.batch(BATCH))

    def first_fit():
        cut = [{"tokens": d[:seq_len]} for d in docs]
        ds = grain.MapDataset.source(cut).shuffle(seed=0).repeat()
        ds = FirstFitPackIterDataset(ds.to_iter_dataset(), length_struct={"tokens": seq_len},
                                     num_packing_bins=BATCH, shuffle_bins=False)
        return iter(ds.batch(BATCH))

    return concat, first_fit


def fractions(ds, docs, batches: int = 200) -> str:
    """Real-token fraction of first fit, zring against Grain (32 bins), at two
    row lengths, over the first ``batches`` batches."""
    lines = ["| seq_len | zring first_fit | Grain FirstFit (32 bins, documents cut to seq_len) |", "|---:|---:|---:|"]
    for seq_len in (1024, SEQ_LEN):
        z = iter(zring.DataLoader(zring.pack(ds, seq_len, mode="first_fit", pad_id=0), batch_size=BATCH, **LOADER))
        g = grain_pipelines(docs, seq_len)[1]()
        out = []
        for it, count in ((z, packed_count), (g, grain_count)):
            a = r = 0
            for _ in range(batches):
                x, y = count(next(it))
                a, r = a + x, r + y
            out.append(r / a)
        lines.append(f"| {seq_len} | {out[0]:.3f} | {out[1]:.3f} |")
    return "\n".join(lines)


def bench(args, ds, docs) -> str:
    concat, first_fit = grain_pipelines(docs)
    who = [
        Contestant("zring pack concat",
                   lambda: iter(zring.DataLoader(zring.pack(ds, SEQ_LEN), batch_size=BATCH, **LOADER)), packed_count),
        Contestant("zring pack first_fit",
                   lambda: iter(zring.DataLoader(zring.pack(ds, SEQ_LEN, mode="first_fit", pad_id=0), batch_size=BATCH,
                                                 **LOADER)), packed_count),
        Contestant("zring ragged (unpacked)", lambda: iter(zring.DataLoader({"tokens": ds}, batch_size=BATCH, **LOADER)),
                   ragged_count),
        Contestant("Grain ConcatThenSplit", concat, grain_count),
        Contestant("Grain FirstFit (32 bins)", first_fit, grain_count),
    ]
    for r in range(args.rounds):
        for c in who:
            c.run(args.secs)
        print(f"round {r}: " + ", ".join(f"{c.name} {c.rates[-1] / 1e6:.1f}" for c in who) + " M tokens/s",
              file=sys.stderr, flush=True)
    med = {c.name: statistics.median(c.rates) for c in who}
    real = {c.name: statistics.median(c.real_rates) for c in who}
    plain = med["zring ragged (unpacked)"]
    grain_cts = med["Grain ConcatThenSplit"]
    lines = [
        "| loader | M tokens/s | M real tokens/s | real fraction | vs Grain ConcatThenSplit | vs zring ragged |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in who:
        frac = real[c.name] / med[c.name] if med[c.name] else 0
        lines.append(f"| {c.name} | {med[c.name] / 1e6:.1f} | {real[c.name] / 1e6:.1f} | {frac:.3f} | "
                     f"{med[c.name] / grain_cts:.1f}x | {med[c.name] / plain:.2f}x |")
    return "\n".join(lines)


def labels_run(args, ds) -> str:
    """Packed tokens/s with labels against without, interleaved rounds."""
    def loader(how: str, labels: bool):
        packed = zring.pack(ds, SEQ_LEN, mode=how, pad_id=0, labels=labels, mask_boundaries=labels)
        return lambda: iter(zring.DataLoader(packed, batch_size=BATCH, **LOADER))

    who = [Contestant(f"zring pack {how}{' + labels' if labels else ''}", loader(how, labels), packed_count)
           for how in ("concat", "first_fit") for labels in (False, True)]
    for r in range(args.rounds):
        for c in who:
            c.run(args.secs)
        print(f"round {r}: " + ", ".join(f"{c.name} {c.rates[-1] / 1e6:.1f}" for c in who) + " M tokens/s",
              file=sys.stderr, flush=True)
    med = {c.name: statistics.median(c.rates) for c in who}
    rates = {c.name: c.rates for c in who}
    lines = ["| loader | M tokens/s | with labels over without (medians) | median of the rounds' ratios |",
             "|---|---:|---:|---:|"]
    for how in ("concat", "first_fit"):
        plain, lab = med[f"zring pack {how}"], med[f"zring pack {how} + labels"]
        paired = statistics.median(b / a for a, b in zip(rates[f"zring pack {how}"], rates[f"zring pack {how} + labels"]))
        lines.append(f"| zring pack {how} | {plain / 1e6:.1f} | | |")
        lines.append(f"| zring pack {how} + labels, loss_mask | {lab / 1e6:.1f} | {lab / plain:.2f}x | {paired:.2f}x |")
    return "\n".join(lines)


def rss_run(args, ds) -> str:
    lines = ["| loader | seconds | RSS first MiB | RSS last MiB | RSS max MiB | M tokens/s |", "|---|---:|---:|---:|---:|---:|"]
    for how in ("concat", "first_fit"):
        dl = zring.DataLoader(zring.pack(ds, SEQ_LEN, mode=how, pad_id=0), batch_size=BATCH, **LOADER)
        samples = []
        tokens = 0
        t0 = time.perf_counter()
        next_sample = 0.0
        while (t := time.perf_counter() - t0) < args.rss:
            if t >= next_sample:
                samples.append(rss_mib())
                next_sample += 10
            tokens += next(dl)["tokens"].size
        samples.append(rss_mib())
        dl.close()
        print(f"{how}: RSS samples {[round(s) for s in samples]}", file=sys.stderr, flush=True)
        lines.append(f"| zring pack {how} | {args.rss:g} | {samples[0]:.0f} | {samples[-1]:.0f} | {max(samples):.0f} | "
                     f"{tokens / t / 1e6:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rss", type=float, default=0.0, help="run the memory test for this many seconds per mode")
    ap.add_argument("--labels", action="store_true", help="time packing with labels against without")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    args = ap.parse_args()
    root = Path(os.environ.get("ZRING_BENCH_DIR") or tempfile.gettempdir())
    t = time.perf_counter()
    docs = documents(args.docs)
    ds = store(docs, root)
    common.note(f"{args.docs} documents, {sum(d.size for d in docs) / 1e6:.0f} M tokens, "
                f"ready in {time.perf_counter() - t:.0f} s")
    if args.labels:
        del docs
        table = labels_run(args, ds)
        title = (f"## Packed tokens/s with and without labels, seq_len {SEQ_LEN}, batch {BATCH} "
                 f"(median of {args.rounds} rounds of {args.secs:g} s)")
    elif args.rss:
        del docs
        table = rss_run(args, ds)
        title = f"## Memory over {args.rss:g} s per mode (RSS sampled every 10 s)"
    else:
        table = bench(args, ds, docs) + "\n\nReal-token fraction of first fit (first 200 batches of 32 rows):\n\n" + fractions(ds, docs)
        title = f"## Tokens/s, seq_len {SEQ_LEN}, batch {BATCH} (median of {args.rounds} rounds of {args.secs:g} s)"
    text = "\n".join([
        title, "",
        f"{args.docs} int32 documents of {LO}..{HI} tokens; " + common.machine(root),
        common.versions(("zring", "grain", "numpy")), "",
        table, "",
        *(f"- {n}" for n in common.notes),
    ])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
