"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) into a
zring :class:`RaggedDataset`, one record per document (:func:`convert`'s
``kind="megatron"``, ``zring convert PREFIX DST``).

The format, as megatron-core's ``IndexedDataset`` writes and reads it (all
integers little-endian):

==========================  =====================================================
``.idx`` bytes              what
==========================  =====================================================
9                           ``b"MMIDIDX\\x00\\x00"``
8 (u64)                     version, 1
1 (u8)                      token dtype code: 1 uint8, 2 int8, 3 int16, 4 int32,
                            5 int64, 6 float64, 7 float32, 8 uint16
8 (u64)                     ``S``, the number of sequences
8 (u64)                     ``D + 1``, the length of ``document_indices``
4 S (int32)                 each sequence's length in tokens
8 S (int64)                 each sequence's byte offset in ``.bin``
8 (D + 1) (int64)           ``document_indices``: document ``d`` is sequences
                            ``[document_indices[d], document_indices[d + 1])``
S (int8), optional          each sequence's mode (multimodal datasets only)
==========================  =====================================================

``.bin`` holds the tokens, sequence after sequence. Record ``d`` of the zring
store is document ``d``: its sequences' tokens concatenated, in the token
dtype, byte for byte. Where a document is made of several sequences (the
sentence-split mode of Megatron's preprocessing), the sequence boundaries
inside it are not kept; the document boundaries are. Multimodal datasets
(with sequence modes) are refused rather than stored without their modes.

The whole ``.idx`` is checked before anything is written (header, version,
dtype, size, document indices that start at 0, never go back and end at
``S``, sequences that lie inside ``.bin``), and every error names the file.
The tokens stream from a memory map of ``.bin``, about ``block_bytes`` per
append, so memory stays bounded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
#: Header, version, dtype code, sequence count, document count.
PREAMBLE_BYTES = 9 + 8 + 1 + 8 + 8
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def paths(src: Path) -> tuple[Path, Path] | None:
    """``(PREFIX.idx, PREFIX.bin)`` if ``src`` names a Megatron dataset: its
    prefix (what Megatron's ``--data-path`` takes) or either of its files."""
    text = str(src)
    for suffix in (".idx", ".bin"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    idx, bin_ = Path(text + ".idx"), Path(text + ".bin")
    if idx.is_file() and bin_.is_file():
        return idx, bin_
    return None


class Index:
    """A checked ``.idx`` file: the token dtype and the three arrays (memory
    mapped, not read into memory)."""

    def __init__(self, idx: Path, bin_bytes: int):
        self.path = idx
        size = idx.stat().st_size
        with open(idx, "rb") as f:
            head = f.read(PREAMBLE_BYTES)
        if len(head) < PREAMBLE_BYTES or head[:9] != HEADER:
            raise ValueError(f"{idx} is not a Megatron index: it does not start with {HEADER!r}")
        version = int.from_bytes(head[9:17], "little")
        if version != 1:
            raise ValueError(f"{idx}: Megatron index version {version}, only version 1 is known")
        code = head[17]
        if code not in DTYPES:
            raise ValueError(f"{idx}: token dtype code {code} is not one of Megatron's ({sorted(DTYPES)})")
        self.dtype = np.dtype(DTYPES[code])
        sequences = int.from_bytes(head[18:26], "little")
        doc_entries = int.from_bytes(head[26:34], "little")
        plain = PREAMBLE_BYTES + 12 * sequences + 8 * doc_entries
        if size == plain + sequences and sequences > 0:
            raise ValueError(f"{idx} is a multimodal Megatron dataset (it has sequence modes), which zring "
                             f"does not convert")
        if size != plain:
            raise ValueError(f"{idx} holds {size} bytes, but its header promises {sequences} sequences and "
                             f"{doc_entries} document indices ({plain} bytes): truncated or not a Megatron index")
        if doc_entries == 0:
            raise ValueError(f"{idx}: no document indices (a Megatron index has at least the leading 0)")
        whole = np.memmap(idx, dtype=np.uint8, mode="r")
        at = PREAMBLE_BYTES
        self.lengths = whole[at:at + 4 * sequences].view("<i4")
        at += 4 * sequences
        self.pointers = whole[at:at + 8 * sequences].view("<i8")
        at += 8 * sequences
        self.documents = whole[at:at + 8 * doc_entries].view("<i8")
        d = self.documents
        if d[0] != 0 or d[-1] != sequences or (len(d) > 1 and np.any(np.diff(d) < 0)):
            raise ValueError(f"{idx}: the document indices must start at 0, never decrease and end at the "
                             f"{sequences} sequences; got {d[:3].tolist()} ... {d[-3:].tolist()}")
        if sequences:
            if np.any(self.lengths < 0) or np.any(self.pointers < 0):
                raise ValueError(f"{idx}: a sequence has a negative length or offset")
            ends = self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize
            worst = int(np.argmax(ends))
            if int(ends[worst]) > bin_bytes:
                raise ValueError(f"{idx}: sequence {worst} ends at byte {int(ends[worst])} of the .bin file, "
                                 f"which holds {bin_bytes} bytes")

    @property
    def document_count(self) -> int:
        return len(self.documents) - 1


def convert(src: Path, dst: Path, codec: str, block_bytes: int, progress: bool | None,
            sink_type: Any, progress_bar: Any) -> dict[str, int]:
    """Writes one record per document of the dataset at ``src`` to a ragged
    store at ``dst`` (module docs)."""
    found = paths(src)
    if found is None:
        raise FileNotFoundError(f"{src} is not a Megatron dataset: {src}.idx and {src}.bin (or the same prefix "
                                f"beside the file given) must both exist")
    idx_path, bin_path = found
    bin_bytes = bin_path.stat().st_size
    index = Index(idx_path, bin_bytes)
    tokens = (np.memmap(bin_path, dtype=np.uint8, mode="r") if bin_bytes else np.zeros(0, np.uint8))
    width = index.dtype.itemsize
    docs = index.documents
    seq_lengths = index.lengths.astype(np.int64)
    # Tokens before each sequence, and before each document.
    seq_starts = np.concatenate([[0], np.cumsum(seq_lengths)])
    doc_tokens = seq_starts[docs]
    bar = progress_bar(index.document_count, f"convert {idx_path.stem}", progress)
    sink = sink_type(dst, index.dtype, None, codec, {"megatron": {"documents": index.document_count,
                                                                  "sequences": len(seq_lengths)}})
    ok = False
    try:
        d = 0
        per_block = max(1, block_bytes // width)
        while d < index.document_count:
            # Whole documents up to about block_bytes of tokens (at least one).
            stop = int(np.searchsorted(doc_tokens, doc_tokens[d] + per_block, side="right")) - 1
            stop = min(max(stop, d + 1), index.document_count)
            s0, s1 = int(docs[d]), int(docs[stop])
            ptr, lens = index.pointers[s0:s1], seq_lengths[s0:s1]
            nbytes = lens * width
            if s1 == s0:
                values = np.zeros(0, index.dtype)
            elif np.all(ptr[1:] == ptr[:-1] + nbytes[:-1]):
                # The usual layout: the block's sequences lie back to back.
                first = int(ptr[0])
                values = tokens[first:first + int(nbytes.sum())].view(index.dtype)
            else:
                values = np.concatenate([tokens[int(p):int(p) + int(n)] for p, n in zip(ptr, nbytes)]).view(index.dtype)
            sink.ragged(values, doc_tokens[d:stop + 1] - doc_tokens[d])
            if bar is not None:
                bar.update(stop - d)
            d = stop
        ok = True
    finally:
        if bar is not None:
            bar.close()
        sink.close(failed=not ok)
    return {"": sink.records}


def describe(src: Path) -> str | None:
    """Why ``src`` looks like half a Megatron dataset, if it does."""
    text = str(src)
    if not src.is_file():
        return None
    for suffix, other in ((".idx", ".bin"), (".bin", ".idx")):
        if text.endswith(suffix) and not os.path.exists(text[: -len(suffix)] + other):
            return f"{src} is half a Megatron dataset: {text[: -len(suffix)] + other} is missing"
    return None
