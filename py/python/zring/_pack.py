"""Packed token rows for language-model training (:func:`zring.pack`).

``zring.DataLoader(zring.pack(docs, 2048, labels=True), batch_size=32, mode=2)`` reads a
:class:`zring.RaggedDataset` of token documents (1-D records of an integer
dtype) as rows of ``seq_len`` tokens. Every batch is a dict of ``(B,
seq_len)`` arrays:

* ``"tokens"``: the tokens, in one dtype (``dtype=``; default the
  narrowest integer dtype that holds every source's: a mixture of a uint16
  Megatron import and int32 stores delivers int32);
* ``"segment_ids"``: int32, ``1, 2, ...`` for the document pieces of a row
  in order, ``0`` for padding;
* ``"positions"``: int32, each token's offset in its document (0 in
  padding).

With ``labels=True`` two more ``(B, seq_len)`` columns:

* ``"labels"``: each token's next token. In concat mode the last label of
  row ``g`` is the first token of row ``g + 1``: a row is ``seq_len + 1``
  tokens of the stream overlapping the next row by one (Megatron's
  ``seq_length + 1`` samples, split into ``tokens`` and ``labels``), so
  over a cycle every adjacent pair of tokens is one ``(token, label)``
  once and no target goes untrained; nothing to shift in the loss.
* ``"loss_mask"``: uint8, 1 where the label is to be trained, 0 on padding
  and, with ``mask_boundaries=True``, at each document's last token (its
  EOD with ``eod_id``), whose label is the next document's first token
  (Megatron's ``eod_mask_loss``).

In first-fit mode a row stands alone: labels follow the row, a document
piece cut at ``seq_len`` takes its document's next token as its last label,
and the last token of a row, of padding and of a document followed by
padding is masked with ``pad_id`` as its label.

``eod_id=`` / ``bos_id=`` add a token after / before every document as the
packer reads it (nothing is stored): a document of ``n`` tokens counts
``n + 2`` everywhere (rows, positions, a mixture's token shares), BOS at
position 0.

``pad_id`` is only needed where rows are padded (first fit): there it is
required, since no token id is free in every vocabulary. Runs saved before
it was required used 0: resume them with ``pad_id=0``.

Sources of different integer dtypes pack together without a rewrite: each
source's tokens are widened to the delivered dtype as they are copied. A
narrower ``dtype=`` than a source's is allowed; a token that does not fit
fails the step with an error naming the source, the document and the
value. (A loader of records over such a mixture, without ``pack``, refuses
it: it delivers each stream in one dtype.)

The documents come in the loader's sampling order (``mode`` and ``seed``: a
sampler over the documents, one at a time; cyclic mode reads each document
once per cycle of ``len(docs)`` documents). Mode 3 draws them a window of
blocks of consecutive documents at a time, and a loader of one shard reads
each source's windows ahead in large reads, as for records (the guide's
"Mode 3"): on data larger than memory, the fastest way to pack. Two ways to
make rows:

* ``mode="concat"``: the documents back to back, cut every ``seq_len``
  tokens; row ``g`` of the stream is tokens ``g * seq_len`` up to ``(g + 1) *
  seq_len``. Nothing is padded, a document cut at a row's end goes on in the
  next row (its positions going on), and a row may span the end of a cycle.
* ``mode="first_fit"``: the documents of each window of 1,024 (a cycle's
  last window is shorter) placed in order, each into the first row that
  still has room for it, a new row when none has; rows are padded with
  ``pad_id`` and segment 0. A document longer than ``seq_len`` is not
  dropped: it is cut into pieces of ``seq_len`` tokens and a shorter last
  piece, each placed like a document, positions counting on through the
  document. So a row holds whole documents, or one piece of a longer one.
  On lengths uniform in 50..4,000 at seq_len 1,024, 0.99 of the tokens are
  real.

A step's rows are the next ``batch_size`` rows of the stream, a pure
function of the seed, the step and the stores: ``state()`` is the loader's
usual few integers (plus the packing), ``state=`` resumes exactly,
``shard=(k, n)`` delivers rows ``k * B / n`` up to ``(k + 1) * B / n`` of
each global batch. Packing runs in the Rust loader's threads, which copy
the tokens from the store into the batch buffers (only the documents cut at
the ends of a stretch go through a scratch buffer); Python sees finished
arrays. :attr:`zring.DataLoader.last_indices` holds the rows' numbers in the
stream.

The loader finds a row without replaying the stream: per cycle of the
document order it keeps an index of the tokens (concat, one integer every
64 documents) or rows (first fit, one per window) before each mark, built
by one pass over the documents' lengths (no token is read) when the cycle
is first reached. A packed loader therefore costs ``8 / 64`` bytes per
document (concat) and ``8 / 1,024`` (first fit) for each of up to 4 cycle
indices, plus up to 8 packed first-fit windows (32 bytes per piece). In
concat mode over sequential or cyclic order every cycle holds the same
tokens, so seeking anywhere costs one index; otherwise (first fit, iid
order) a run resumed in cycle ``c`` sums the ``c`` cycles before it once.

A ``zring.mix([docs_a, docs_b], [0.7, 0.3])`` of RaggedDatasets packs each
source into its own row stream; each batch holds each source's share of the
rows (as for any mixture), and since every row is ``seq_len`` tokens of one
source, the weights count tokens. :attr:`zring.DataLoader.last_sources` names each
row's source. Source ``k`` orders its documents with seed ``seed + k``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _util
from ._mix import Mixture
from .dataset import Dataset, RaggedDataset

_MODES = ("concat", "first_fit")


def _documents(ds: Any, what: str) -> RaggedDataset:
    if isinstance(ds, Dataset):
        raise TypeError(
            f"{what} is a Dataset of fixed-size records; zring.pack reads a RaggedDataset of 1-D token "
            f"documents (write them with zring.write_ragged)"
        )
    if not isinstance(ds, RaggedDataset):
        raise TypeError(f"{what} is a {type(ds).__name__}; zring.pack reads a RaggedDataset of 1-D token documents")
    if ds.item_shape != ():
        raise ValueError(
            f"{what} ({ds.path}) holds records of shape (n, {', '.join(map(str, ds.item_shape))}); "
            f"zring.pack needs 1-D records of tokens, shape (n,)"
        )
    if ds.dtype.kind not in "iu":
        raise ValueError(f"{what} ({ds.path}) holds {ds.dtype}; zring.pack needs integer tokens")
    return ds


def _token(value: Any, name: str, dtype: np.dtype) -> int | None:
    """``value`` checked to be a token of ``dtype``; the bits of one
    little-endian token of it (what the Rust loader writes)."""
    if value is None:
        return None
    if not _util.is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{name}={value} is not a {dtype} token ({info.min} ..= {info.max})")
    return int.from_bytes(np.array(value, dtype=dtype).astype(dtype.newbyteorder("<")).tobytes(), "little")


class Packed:
    """A source of packed token rows; pass it to :class:`zring.DataLoader` in
    place of a stream dict. Made by :func:`zring.pack`, whose docstring says
    how the rows are built."""

    def __init__(self, source: RaggedDataset | Mixture, seq_len: int, mode: str, pad_id: int | None,
                 labels: bool = False, mask_boundaries: bool = False, eod_id: int | None = None,
                 bos_id: int | None = None, dtype: Any = None):
        from ._curriculum import Ramp, _gcd

        #: A sequence-length ramp (:mod:`zring._curriculum`), else None.
        self.seq_ramp: Ramp | None = None
        if isinstance(seq_len, Ramp):
            if mode != "concat":
                raise ValueError('a seq_len ramp needs mode="concat": first-fit rows are padded bins, which do not '
                                 "join into longer rows")
            self.seq_ramp = seq_len
            seq_len = _gcd(seq_len.distinct())
        if not _util.is_int(seq_len):
            raise TypeError(f"seq_len must be an int or a zring.ramp, got {type(seq_len).__name__} {seq_len!r}")
        if not 1 <= seq_len <= 2**31 - 1:
            raise ValueError(f"seq_len must be at least 1 (and below 2**31), got {seq_len}")
        if mode not in _MODES:
            raise ValueError(f"mode must be \"concat\" or \"first_fit\", got {mode!r}")
        if isinstance(source, Mixture):
            if source.names != ["tokens"] or any(len(s) != 1 for s in source.sources):
                raise ValueError(
                    f"a packed mixture's sources are RaggedDatasets (zring.mix([docs_a, docs_b], weights)), "
                    f"got sources with streams {source.names}"
                )
            self.datasets = [_documents(s["tokens"], f"source {k}") for k, s in enumerate(source.sources)]
            self.mixture: Mixture | None = source
        else:
            self.datasets = [_documents(source, "source")]
            self.mixture = None
        if dtype is None:
            widest = np.result_type(*[d.dtype for d in self.datasets])
            if widest.kind not in "iu":
                raise ValueError(
                    f"the sources hold {', '.join(str(d.dtype) for d in self.datasets)}, which no integer dtype holds "
                    f"all of; pass dtype= (np.int64, say): a token it cannot hold is then an error"
                )
            self.dtype: np.dtype = widest
        else:
            self.dtype = np.dtype(dtype)
            if self.dtype.kind not in "iu":
                raise ValueError(f"dtype must be an integer dtype, got {self.dtype}")
        self.dtype = self.dtype.newbyteorder("=")
        if not isinstance(labels, bool) or not isinstance(mask_boundaries, bool):
            raise TypeError("labels and mask_boundaries must be True or False")
        if mask_boundaries and not labels:
            raise ValueError("mask_boundaries=True masks labels: pass labels=True with it")
        if pad_id is None and mode == "first_fit":
            raise ValueError(
                "mode=\"first_fit\" pads rows: pass pad_id= (a token id your model ignores; runs saved before "
                "pad_id had to be given used pad_id=0: pass pad_id=0 to resume them)"
            )
        self.seq_len = int(seq_len)
        self.mode = mode
        self.labels = labels
        #: The batch's arrays, in order.
        self.names = ["tokens", "segment_ids", "positions"] + (["labels", "loss_mask"] if labels else [])
        self.mask_boundaries = mask_boundaries
        self.pad_id = None if pad_id is None else int(pad_id)
        self.eod_id = None if eod_id is None else int(eod_id)
        self.bos_id = None if bos_id is None else int(bos_id)
        # The Rust loader writes the low bytes of these integers, little-endian.
        self._pad_bits = _token(pad_id, "pad_id", self.dtype) or 0
        self._eod_bits = _token(eod_id, "eod_id", self.dtype)
        self._bos_bits = _token(bos_id, "bos_id", self.dtype)

    def with_seq_len(self, seq_len: int) -> "Packed":
        """The same packing in rows of ``seq_len`` tokens, without a ramp."""
        import copy

        out = copy.copy(self)
        out.seq_len, out.seq_ramp = int(seq_len), None
        return out

    def spec(self) -> tuple[Any, ...]:
        """The ``pack=`` argument of the Rust loader."""
        return (self.seq_len, self.mode, self._pad_bits, self.dtype.itemsize, self.dtype.kind == "i", self.labels,
                self.mask_boundaries, self._eod_bits, self._bos_bits,
                [(d.dtype.itemsize, d.dtype.kind == "i", str(d.path)) for d in self.datasets])

    def __repr__(self) -> str:
        what = f"mixture of {len(self.datasets)}" if self.mixture is not None else repr(self.datasets[0])
        extra = "".join(f", {k}={v!r}" for k, v in (("labels", self.labels), ("mask_boundaries", self.mask_boundaries),
                                                      ("eod_id", self.eod_id), ("bos_id", self.bos_id)) if v)
        return (f"zring.pack({what}, seq_len={self.seq_len}, mode={self.mode!r}, pad_id={self.pad_id}{extra}, "
                f"dtype={self.dtype})")


def pack(source: RaggedDataset | Mixture, seq_len: int, *, mode: str = "concat", pad_id: int | None = None,
         labels: bool = False, mask_boundaries: bool = False, eod_id: int | None = None, bos_id: int | None = None,
         dtype: Any = None) -> Packed:
    """Rows of ``seq_len`` tokens from a RaggedDataset of token documents, or a
    :func:`zring.mix` of them, for :class:`zring.DataLoader`.

    Each batch is a dict of ``(batch_size, seq_len)`` arrays: ``tokens``
    (``dtype``), ``segment_ids`` (int32: ``1, 2, ...`` for the document
    pieces of a row in order, 0 on padding), ``positions`` (int32: each
    token's offset in its document) and, with ``labels=True``, ``labels``
    (each token's next token) and ``loss_mask`` (uint8, 0 where the label
    is not trained). ``mode="concat"`` cuts the documents, back to back in
    the loader's sampling order, every ``seq_len`` tokens and never pads;
    ``mode="first_fit"`` places the documents of each window of 1,024 into
    the first row with room (longer ones cut into pieces of ``seq_len``) and
    pads the rest of each row. Step ``t``'s rows are a pure function of the
    seed, the step and the stores: ``DataLoader.state()`` and ``state=``
    resume exactly, ``shard=`` splits each batch. Over a mixture each source
    packs its own rows, so the weights count tokens.

    Every rule (labels at row and document edges, EOD and BOS, dtypes,
    memory, resume cost) is in the "Language-model input" page of the API
    reference (``docs/lm.rst``; in Python, ``help(zring._pack)``).

    Args:
        source: A RaggedDataset of 1-D integer documents, or a ``zring.mix``
            of them (their dtypes may differ).
        seq_len: Tokens per row, or a :func:`zring.ramp` of the step (a
            sequence-length curriculum, concat mode: :mod:`zring._curriculum`).
        mode: ``"concat"`` or ``"first_fit"``.
        pad_id: The token written into padding. Concat mode never pads and
            needs none; ``"first_fit"`` requires it (no token id is assumed
            to be free).
        labels: Add ``labels`` (each token's next token; in concat mode the
            last label of a row is the next row's first token, so rows
            overlap by one and every token is some row's target) and
            ``loss_mask`` (uint8, 0 where the label is not to be trained).
        mask_boundaries: With ``labels``: ``loss_mask`` 0 at every
            document's last token (its EOD with ``eod_id``), whose label
            would be the next document's first token.
        eod_id: A token added after every document (not stored).
        bos_id: A token added before every document (not stored).
        dtype: The delivered token dtype; default the narrowest integer
            dtype that holds every source's dtype (uint16 and int32: int32).
            A narrower one is allowed: a token it cannot hold fails the step
            with an error naming the source, the document and the value.

    Raises:
        ValueError: ``seq_len`` below 1, ``mode`` not ``"concat"`` or
            ``"first_fit"``, records that are not 1-D or not integers,
            sources whose dtypes no integer dtype holds together (uint64 and
            int64) without ``dtype=``, ``first_fit`` without ``pad_id``, a
            ``pad_id``, ``eod_id`` or ``bos_id`` outside the dtype, or
            ``mask_boundaries`` without ``labels``.
        TypeError: ``source`` is not a RaggedDataset (a fixed-size
            ``Dataset``, say) or a mixture of them.
    """
    return Packed(source, seq_len, mode, pad_id, labels, mask_boundaries, eod_id, bos_id, dtype)


def _views(packed: Packed) -> list[tuple[str, Any]]:
    """What ``DataLoader`` needs to shape each packed column: dtype and row shape."""
    class _Column:
        def __init__(self, dtype: Any, seq_len: int):
            self.dtype, self.shape = np.dtype(dtype), (seq_len,)

    views = [
        ("tokens", _Column(packed.dtype, packed.seq_len)),
        ("segment_ids", _Column("<i4", packed.seq_len)),
        ("positions", _Column("<i4", packed.seq_len)),
    ]
    if packed.labels:
        views += [("labels", _Column(packed.dtype, packed.seq_len)), ("loss_mask", _Column("u1", packed.seq_len))]
    return views


__all__: Sequence[str] = ["Packed", "pack"]
