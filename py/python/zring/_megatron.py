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
#: Sequences checked at a time (their temporaries: about 24 bytes each).
CHECK_SEQUENCES = 1 << 20
#: Bytes of tokens gathered with one index array (8 bytes an index).
GATHER_BYTES = 1 << 20
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
        # In slices, so the check's temporaries stay small whatever the
        # index; in uint64 and by subtraction, so an offset near 2**63 cannot
        # wrap past the check (an int64 end would).
        for a in range(0, sequences, CHECK_SEQUENCES):
            lens, ptrs = self.lengths[a:a + CHECK_SEQUENCES], self.pointers[a:a + CHECK_SEQUENCES]
            if np.any(lens < 0) or np.any(ptrs < 0):
                raise ValueError(f"{idx}: a sequence has a negative length or offset")
            start = ptrs.astype(np.uint64)
            nbytes = lens.astype(np.uint64) * np.uint64(self.dtype.itemsize)
            past = (start > np.uint64(bin_bytes)) | (nbytes > np.uint64(bin_bytes) - np.minimum(start, np.uint64(bin_bytes)))
            if np.any(past):
                worst = int(np.argmax(past))
                end = int(start[worst]) + int(nbytes[worst])  # Python ints: exact
                raise ValueError(f"{idx}: sequence {a + worst} ends at byte {end} of the .bin file, which holds "
                                 f"{bin_bytes} bytes")

    @property
    def document_count(self) -> int:
        return len(self.documents) - 1


def convert(src: Path, dst: Path, codec: str, block_bytes: int, progress: bool | None,
            sink_type: Any, progress_bar: Any, counts: bool = True) -> dict[str, int]:
    """Writes one record per document of the dataset at ``src`` to a ragged
    store at ``dst`` (module docs). ``counts``: record the dataset's document
    and sequence counts in the store's schema (not in a part of a dataset of
    parts, whose parts' schemas must be alike)."""
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
    described = {"documents": index.document_count, "sequences": len(seq_lengths)} if counts else {}
    sink = sink_type(dst, index.dtype, None, codec, {"megatron": described})
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
                values = gather(tokens, ptr, nbytes).view(index.dtype)
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


def gather(tokens: np.ndarray, ptr: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """The bytes of sequences at offsets ``ptr`` of ``nbytes`` each, back to
    back: runs of sequences that lie back to back are copied as one slice,
    the rest through an index array of at most :data:`GATHER_BYTES` entries
    at a time, so scattered sequences cost no Python call each."""
    ptr = ptr.astype(np.int64)
    nbytes = nbytes.astype(np.int64)
    out = np.empty(int(nbytes.sum()), np.uint8)
    # Where each sequence goes in `out`, and the runs of back-to-back ones.
    at = np.concatenate([[0], np.cumsum(nbytes)])
    breaks = np.flatnonzero(ptr[1:] != ptr[:-1] + nbytes[:-1]) + 1
    run_first = np.concatenate([[0], breaks])
    run_end = np.concatenate([breaks, [len(ptr)]])
    run_ptr = ptr[run_first]
    run_at = at[run_first]
    run_len = at[run_end] - run_at
    k = 0
    while k < len(run_first):
        if run_len[k] >= GATHER_BYTES:
            o, p, n = int(run_at[k]), int(run_ptr[k]), int(run_len[k])
            out[o:o + n] = tokens[p:p + n]
            k += 1
            continue
        # Small runs up to GATHER_BYTES: one index array for them all.
        stop = int(np.searchsorted(run_at, run_at[k] + GATHER_BYTES, side="right"))
        stop = max(k + 1, min(stop, len(run_first)))
        while stop > k + 1 and run_len[stop - 1] >= GATHER_BYTES:
            stop -= 1
        lens = run_len[k:stop]
        base = int(run_at[k])
        total = int(lens.sum())
        shift = np.repeat(run_ptr[k:stop] - (run_at[k:stop] - base), lens)
        out[base:base + total] = tokens[np.arange(total, dtype=np.int64) + shift]
        k = stop
    return out


def describe(src: Path) -> str | None:
    """Why ``src`` looks like half a Megatron dataset, if it does."""
    text = str(src)
    if not src.is_file():
        return None
    for suffix, other in ((".idx", ".bin"), (".bin", ".idx")):
        if text.endswith(suffix) and not os.path.exists(text[: -len(suffix)] + other):
            return f"{src} is half a Megatron dataset: {text[: -len(suffix)] + other} is missing"
    return None
