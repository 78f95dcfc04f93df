"""Must-show for zring.split and the one-pass loader (bench-results/splits.md).

A store of 1,000,000 token documents (document d is the int32 tokens d, d+1,
... of 1 to 16 tokens) is split 969/30/1. Checked and printed:

* the parts are disjoint and complete, each within its weight of its exact
  share (every whole period of 1,000 documents holds exactly 969/30/1);
* after 1,000 documents are appended (and the store reopened), every old
  document is in the part it was in, at the same place in it, and each new
  document is in exactly one part;
* a one-pass loader over the validation part (batch 512) delivers each of
  its documents once, in order, the right tokens, and stops (StopIteration)
  after exactly len(loader) steps; the same pass packed (concat, labels,
  EOD) delivers each token of the part once, each label inside it once;
* a train loader's state saved over the old store resumes over the grown one.

Usage: python scripts/splits.py [--dir DIR] [--docs N]   (DIR default: a
temporary directory, removed at the end)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import zring


def doc_len(d: np.ndarray | int) -> np.ndarray | int:
    return 1 + (np.asarray(d, dtype=np.uint64) * np.uint64(2654435761) % np.uint64(16)).astype(np.int64)


def docs(start: int, stop: int):
    for d in range(start, stop):
        yield np.arange(d, d + int(doc_len(d)), dtype=np.int32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--append", type=int, default=1_000)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="zring-splits-"))
    path = root / "docs"
    n, extra = args.docs, args.append
    try:
        t = time.perf_counter()
        zring.write_ragged(str(path), docs(0, n), dtype=np.int32, codec="raw", overwrite=True, progress=False)
        print(f"wrote {n:,} documents in {time.perf_counter() - t:.1f} s")

        ds = zring.RaggedDataset(str(path))
        t = time.perf_counter()
        parts = zring.split(ds, "969,30,1")
        print(f"split 969/30/1 of {n:,} documents in {time.perf_counter() - t:.2f} s")
        every = np.concatenate([p.records for p in parts])
        disjoint = np.unique(every).size == every.size
        complete = every.size == n and np.array_equal(np.sort(every), np.arange(n, dtype=np.uint64))
        print(f"| part | weight | documents | exact share | off by |")
        print(f"|---|---:|---:|---:|---:|")
        for name, p, w in zip(("train", "validation", "test"), parts, (969, 30, 1)):
            share = w * n / 1000
            print(f"| {name} | {w} | {len(p):,} | {share:,.1f} | {len(p) - share:+.1f} |")
        print(f"disjoint: {disjoint}, complete: {complete} (union {every.size:,} of {n:,})")
        whole = n // 1000 * 1000
        which = np.empty(n, dtype=np.int8)
        for k, p in enumerate(parts):
            which[p.records] = k
        per = np.stack([(which[:whole].reshape(-1, 1000) == k).sum(axis=1) for k in range(3)], axis=1)
        print(f"every one of the {whole // 1000:,} whole periods of 1,000 documents holds exactly 969/30/1: "
              f"{bool(np.all(per == [969, 30, 1]))}")

        # Loaders over the old store, before it grows.
        valid = parts[1]
        B = 512
        dl = zring.DataLoader({"t": valid}, batch_size=B, one_pass=True, num_workers=2)
        steps, seen, right, rows = len(dl), [], True, []
        t = time.perf_counter()
        for batch in dl:
            values, splits = batch["t"]
            idx = dl.last_indices
            seen.append(idx.copy())
            rows.append(idx.size)
            d = valid.records[idx].astype(np.int64)
            right &= bool(np.array_equal(values[splits[:-1]], d)) and bool(
                np.array_equal(np.diff(splits), doc_len(d)))
        took = time.perf_counter() - t
        try:
            next(dl)
            stopped = False
        except StopIteration:
            stopped = True
        seen_all = np.concatenate(seen)
        print(f"validation one-pass loader (batch {B}): len {steps}, delivered {len(rows)} steps "
              f"({rows[:-1].count(B)} full + last of {rows[-1]}), {seen_all.size:,} documents, each once in order: "
              f"{bool(np.array_equal(seen_all, np.arange(len(valid))))}, right tokens: {right}, StopIteration after "
              f"the pass: {stopped} ({took:.2f} s)")
        dl.close()

        lengths = doc_len(valid.records.astype(np.int64))
        stream = np.concatenate([np.append(np.arange(d, d + l, dtype=np.int32), -2)
                                 for d, l in zip(valid.records.astype(np.int64), lengths)])
        pk = zring.DataLoader(zring.pack(valid, 2048, labels=True, eod_id=-2, pad_id=-1), batch_size=8,
                              one_pass=True, num_workers=2)
        toks, pairs, n_steps = [], [], 0
        for b in pk:
            n_steps += 1
            real = b["segment_ids"] > 0
            toks.append(b["tokens"][real])
            m = b["loss_mask"] == 1
            pairs.append(np.stack([b["tokens"][m], b["labels"][m]], axis=1))
        toks_ok = np.array_equal(np.concatenate(toks), stream)
        pairs_ok = np.array_equal(np.concatenate(pairs), np.stack([stream[:-1], stream[1:]], axis=1))
        print(f"validation packed pass (seq_len 2048, labels, EOD, batch 8): {n_steps} steps = len {len(pk)}, "
              f"{stream.size:,} tokens each once in order: {toks_ok}, each label inside the pass once: {pairs_ok}")
        pk.close()

        train = zring.DataLoader({"t": parts[0]}, batch_size=B, mode=2, seed=7, num_workers=2)
        for _ in range(100):
            next(train)
        state = train.state()
        cycle = len(parts[0]) // B
        want = [train.next()["t"][0][:4].copy() for _ in range(5)]
        train.close()
        old = [p.records.copy() for p in parts]
        ds.close()

        t = time.perf_counter()
        zring.write_ragged(str(path), docs(n, n + extra), dtype=np.int32, codec="raw", append=True, progress=False)
        grown = zring.RaggedDataset(str(path))
        new = zring.split(grown, "969,30,1")
        print(f"appended {extra:,} documents and split again in {time.perf_counter() - t:.2f} s")
        moved = sum(int(np.count_nonzero(p.records[: o.size] != o)) for p, o in zip(new, old))
        kept = all(np.array_equal(p.records[: o.size], o) for p, o in zip(new, old))
        added = np.concatenate([p.records[o.size:] for p, o in zip(new, old)])
        print(f"| part | before | after | new documents |")
        print(f"|---|---:|---:|---:|")
        for name, p, o in zip(("train", "validation", "test"), new, old):
            print(f"| {name} | {o.size:,} | {len(p):,} | {len(p) - o.size:,} |")
        print(f"old documents moved between or within parts: {moved} (every part's old records a prefix: {kept}); "
              f"new documents each in exactly one part: "
              f"{bool(np.array_equal(np.sort(added), np.arange(n, n + extra, dtype=np.uint64)))}")
        resumed = zring.DataLoader({"t": new[0]}, state=state, num_workers=2)
        same = all(np.array_equal(resumed.next()["t"][0][:4], w) for w in want)
        print(f"train state (mode 2, saved at step 100, cycles of {cycle} steps) resumed over the grown store: next 5 steps "
              f"identical: {same}")
        resumed.close()
        try:
            zring.DataLoader({"t": new[1]}, state=state)
            refused = False
        except ValueError:
            refused = True
        print(f"the train state over the validation part is refused: {refused}")
        grown.close()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
