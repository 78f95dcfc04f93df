"""Packed token rows for language-model training (:func:`zring.pack`).

``zring.DataLoader(zring.pack(docs, 2048), batch_size=32, mode=2)`` reads a
:class:`zring.RaggedDataset` of token documents (1-D records of an integer
dtype) as rows of ``seq_len`` tokens. Every batch is a dict of ``(B,
seq_len)`` arrays:

* ``"tokens"``: the tokens, in the store's dtype;
* ``"segment_ids"``: int32, ``1, 2, ...`` for the document pieces of a row
  in order, ``0`` for padding;
* ``"positions"``: int32, each token's offset in its document (0 in
  padding).

The documents come in the loader's sampling order (``mode`` and ``seed``: a
sampler over the documents, one at a time; cyclic mode reads each document
once per cycle of ``len(docs)`` documents). Two ways to make rows:

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
arrays. :attr:`DataLoader.last_indices` holds the rows' numbers in the
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
source, the weights count tokens. :attr:`DataLoader.last_sources` names each
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


class Packed:
    """A source of packed token rows; pass it to :class:`zring.DataLoader` in
    place of a stream dict. Made by :func:`zring.pack`, whose docstring says
    how the rows are built."""

    def __init__(self, source: RaggedDataset | Mixture, seq_len: int, mode: str, pad_id: int):
        if not _util.is_int(seq_len):
            raise TypeError(f"seq_len must be an int, got {type(seq_len).__name__} {seq_len!r}")
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
        dtypes = {str(d.dtype) for d in self.datasets}
        if len(dtypes) != 1:
            raise ValueError(f"a packed mixture's sources must hold one token dtype, got {sorted(dtypes)}")
        self.dtype: np.dtype = self.datasets[0].dtype
        if not _util.is_int(pad_id):
            raise TypeError(f"pad_id must be an int, got {type(pad_id).__name__} {pad_id!r}")
        info = np.iinfo(self.dtype)
        if not info.min <= pad_id <= info.max:
            raise ValueError(f"pad_id={pad_id} is not a {self.dtype} token ({info.min} ..= {info.max})")
        self.seq_len = int(seq_len)
        self.mode = mode
        self.pad_id = int(pad_id)
        # The pad token's bytes as the store holds tokens; the Rust loader
        # writes the low bytes of this integer in little-endian order.
        self._pad_bits = int.from_bytes(np.array(pad_id, dtype=self.dtype).tobytes(), "little")

    def spec(self) -> tuple[int, str, int, int]:
        """The ``pack=`` argument of the Rust loader."""
        return (self.seq_len, self.mode, self._pad_bits, self.dtype.itemsize)

    def __repr__(self) -> str:
        what = f"mixture of {len(self.datasets)}" if self.mixture is not None else repr(self.datasets[0])
        return f"zring.pack({what}, seq_len={self.seq_len}, mode={self.mode!r}, pad_id={self.pad_id})"


def pack(source: RaggedDataset | Mixture, seq_len: int, *, mode: str = "concat", pad_id: int = 0) -> Packed:
    """Rows of ``seq_len`` tokens from a RaggedDataset of token documents, or a
    :func:`zring.mix` of them, for :class:`zring.DataLoader` (module docs).

    Raises:
        ValueError: ``seq_len`` below 1, ``mode`` not ``"concat"`` or
            ``"first_fit"``, records that are not 1-D or not integers,
            sources of different dtypes, or a ``pad_id`` outside the dtype.
        TypeError: ``source`` is not a RaggedDataset (a fixed-size
            ``Dataset``, say) or a mixture of them.
    """
    return Packed(source, seq_len, mode, pad_id)


def _views(packed: Packed) -> list[tuple[str, Any]]:
    """What ``DataLoader`` needs to shape each packed column: dtype and row shape."""
    class _Column:
        def __init__(self, dtype: Any, seq_len: int):
            self.dtype, self.shape = np.dtype(dtype), (seq_len,)

    return [
        ("tokens", _Column(packed.dtype, packed.seq_len)),
        ("segment_ids", _Column("<i4", packed.seq_len)),
        ("positions", _Column("<i4", packed.seq_len)),
    ]


__all__: Sequence[str] = ["Packed", "pack"]
