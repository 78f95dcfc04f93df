"""Token documents from three sources, mixed by weight, cut into training rows.

What it shows:

1. ``zring.write_ragged`` stores three sources of token documents ("web",
   "code", "math"; int32 tokens, 20 to 400 per document) as RaggedDatasets.
2. ``zring.mix`` weights them 0.7 / 0.2 / 0.1; the DataLoader draws every
   source with its own sampler and ``loader.last_sources`` names each row's
   source. The running count of each source's rows is always its share
   rounded down or up.
3. Each batch of documents is packed into rows of ``SEQ_LEN`` tokens by
   concatenating them and cutting (``concat_rows`` below; zring's own
   ``zring.pack`` does this inside the Rust loader, with segment ids and
   positions, and resumes exactly).
4. ``loader.state()`` saved after 5 steps resumes into the same batches.

Run: ``python examples/lm_mixture.py [--steps 20]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring

SEQ_LEN = 256
BATCH = 64
WEIGHTS = {"web": 0.7, "code": 0.2, "math": 0.1}


def documents(source: int, count: int) -> list[np.ndarray]:
    """``count`` documents whose first token names the source and index."""
    rng = np.random.default_rng(source)
    docs = []
    for i in range(count):
        doc = rng.integers(3, 32000, size=int(rng.integers(20, 400)), dtype=np.int32)
        doc[0] = source * 100_000 + i
        docs.append(doc)
    return docs


def concat_rows(values: np.ndarray, row_splits: np.ndarray, seq_len: int, eos: int = 2) -> np.ndarray:
    """The batch's documents end to end, each followed by ``eos``, cut into
    full rows of ``seq_len`` (the tail that does not fill a row is dropped)."""
    stream = np.insert(values, row_splits[1:], eos)
    rows = len(stream) // seq_len
    return stream[: rows * seq_len].reshape(rows, seq_len)


def loader_for(root: Path, **kw) -> zring.DataLoader:
    sources = [{"tokens": zring.RaggedDataset(root / f"{name}.zr")} for name in WEIGHTS]
    return zring.DataLoader(zring.mix(sources, weights=list(WEIGHTS.values())), batch_size=BATCH, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if args.steps < 8:
        ap.error("--steps must be at least 8 (the resume check replays steps 5 to 7)")

    with tempfile.TemporaryDirectory(prefix="zring-lm-") as tmp:
        root = Path(tmp)
        for s, name in enumerate(WEIGHTS):
            zring.write_ragged(root / f"{name}.zr", documents(s, 3000), dtype=np.int32)

        counts = np.zeros(len(WEIGHTS), np.int64)
        rows_made = 0
        expected = []
        with loader_for(root, mode=2, seed=7) as loader:
            for step in range(args.steps):
                values, row_splits = next(loader)["tokens"]
                sources = loader.last_sources
                # Each row's first token says where it came from.
                firsts = values[row_splits[:-1]] // 100_000
                if not np.array_equal(firsts, sources):
                    print("last_sources disagrees with the documents", file=sys.stderr)
                    return 1
                counts += np.bincount(sources, minlength=len(WEIGHTS))
                share = np.array(list(WEIGHTS.values())) * BATCH * (step + 1)
                if np.any(np.abs(counts - share) >= 1):
                    print(f"step {step}: source rows {counts} stray from {share}", file=sys.stderr)
                    return 1
                rows_made += len(concat_rows(values, row_splits, SEQ_LEN))
                if step == 4:
                    saved = loader.state()
                elif 5 <= step < 8:
                    expected.append(values.copy())
        # Resume: the three batches after step 5, again.
        with loader_for(root, state=saved) as resumed:
            for want in expected:
                if not np.array_equal(next(resumed)["tokens"][0], want):
                    print("the resumed loader delivered another batch", file=sys.stderr)
                    return 1
        print(f"rows per source {dict(zip(WEIGHTS, counts.tolist()))} after {args.steps} batches of {BATCH} "
              f"documents ({rows_made} packed rows of {SEQ_LEN}); resume after 5 steps exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
