"""Packing long documents: bytes read per step against bytes delivered.

A packed loader cuts documents at row edges. Over documents of 8 M tokens
a step of 4 rows of 4,096 ``uint16`` tokens delivers 32 KiB of tokens; it
read each cut document whole (16 MiB a step, 512x). The packer now reads
a piece of a raw document as a span of it, and keeps one decoded document
per worker for compressed ones.

The documents: ``--docs`` documents of ``--tokens`` ``uint16`` tokens
(uniform in 0..255, so that zstd has something to compress)
(default 4 of 8,388,608: 16 MiB each), written once with ``--codec``
(default raw) to ``$ZRING_BENCH_DIR`` (or a temporary directory). Each
measurement: ``DataLoader(zring.pack(docs, 4096), batch_size=4, mode=2,
num_workers=2, prefetch_size=4)``, ``--steps`` steps, after emptying the
page cache (as root; otherwise a note says the cache was warm). Reported:

* engine counters: the stored bytes the loader's reads touched (the
  store's ``read_stats``: read from disk, from the page cache, from the
  record cache), per step gathered (the loader's ``steps_gathered``: it
  runs up to ``prefetch_size`` steps ahead of the consumer);
* ``/proc/self/io`` ``read_bytes``: bytes this process read from the block
  device (cold cache only; includes the record table and readahead);
* the ratio of each to the token bytes a step delivers, and ms per step.

    python benches/pack_long.py                       # raw, 500 steps
    python benches/pack_long.py --codec zstd --steps 300
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import zring  # noqa: E402

SEQ_LEN = 4096
BATCH = 4
LOADER = dict(batch_size=BATCH, mode=2, seed=0, num_workers=2, prefetch_size=4)


def store(root: Path, docs: int, tokens: int, codec: str) -> Path:
    path = root / f"pack-long-{docs}x{tokens}-{codec}"
    if not path.exists():
        rng = np.random.default_rng(0)
        t = time.perf_counter()
        zring.write_ragged(str(path), [rng.integers(0, 256, size=tokens, dtype=np.uint16) for _ in range(docs)],
                           codec=codec, progress=False)
        common.note(f"wrote {docs} documents of {tokens} tokens ({codec}) in {time.perf_counter() - t:.0f} s")
    return path


def measure(path: Path, steps: int) -> dict:
    cold = os.geteuid() == 0
    if cold:
        common.drop_caches()
    ds = zring.RaggedDataset(str(path))
    with zring.DataLoader(zring.pack(ds, SEQ_LEN), **LOADER) as dl:
        # Building the loader reads every document's length (the record table).
        r0 = dl.stats()["reads"]["tokens"]
        io0 = common.proc_read_bytes()
        t = time.perf_counter()
        for _ in range(steps):
            batch = next(dl)
        secs = time.perf_counter() - t
        assert batch["tokens"].shape == (BATCH, SEQ_LEN)
        delivered = batch["tokens"].nbytes
        dl_stats = dl.stats()
    io = common.proc_read_bytes() - io0
    r = dl_stats["reads"]["tokens"]
    touched = sum(r[k] - r0[k] for k in ("bytes_read", "bytes_from_page_cache", "bytes_from_cache"))
    gathered = dl_stats["steps_gathered"]
    ds.close()
    return {
        "cold": cold,
        "delivered": delivered,
        "steps": steps,
        "gathered": gathered,
        "touched_per_step": touched / gathered,
        "io_per_step": io / gathered,
        "ms_per_step": secs / steps * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8 << 20)
    ap.add_argument("--codec", default="raw", choices=["raw", "zstd"])
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_args()
    root = os.environ.get("ZRING_BENCH_DIR")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        path = store(Path(root) if root else Path(tmp), args.docs, args.tokens, args.codec)
        m = measure(path, args.steps)
    if not m["cold"]:
        common.note("not root: the page cache was not emptied, /proc/self/io read_bytes is not meaningful")
    d = m["delivered"]
    print(f"{args.docs} documents of {args.tokens:,} tokens ({args.codec}), rows of {SEQ_LEN}, batch {BATCH}: "
          f"{m['steps']} steps delivered, {m['gathered']} gathered")
    print(f"  delivered per step:        {d:>12,} B")
    print(f"  engine counters per step:  {m['touched_per_step']:>12,.0f} B  ({m['touched_per_step'] / d:.2f}x)")
    print(f"  /proc/self/io per step:    {m['io_per_step']:>12,.0f} B  ({m['io_per_step'] / d:.2f}x)")
    print(f"  time per step:             {m['ms_per_step']:>12.2f} ms")


if __name__ == "__main__":
    main()
