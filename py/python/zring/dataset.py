"""Array views over a store: :class:`Dataset` (fixed shape), :class:`RaggedDataset`.

The dtype and shape come from the store's ``schema.json``. Reads decode
straight into a freshly allocated output array; nothing is staged in a
temporary buffer. Datasets open the store read-only, so any number of them
(in any number of processes) can read one store at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import _schema, _util
from . import _zring
from ._zring import CorruptError, Parts, Store

#: The manifest that makes a folder a dataset of parts (:mod:`zring.parts`).
_PARTS_MANIFEST = "manifest.json"


def _open(path: str | os.PathLike[str], ragged: bool,
          cache_bytes: int | None = None,
          rank_parts: tuple[int, int] | None = None) -> tuple[Path, Store, dict[str, Any]]:
    p = Path(path)
    rank_parts = None if rank_parts is None else _rank_parts(rank_parts)
    if not p.is_dir():
        raise FileNotFoundError(f"{p} is not a directory; expected a dataset written by write_dataset")
    if os.path.lexists(p / _PARTS_MANIFEST) or ((p / "parts").is_dir() and not (p / "head.zr").exists()):
        # A dataset of parts (or one whose manifest was removed or replaced,
        # which the engine refuses naming it): one read-only handle over
        # every part (or a rank's).
        store = Parts(str(p), cache_bytes=_util.cache_bytes(cache_bytes), rank_parts=rank_parts)
        if rank_parts is not None and len(store) == 0:
            rank, ranks = rank_parts
            store.close()
            raise ValueError(
                f"rank_parts=({rank}, {ranks}): rank {rank} reads no part of {p}, which has fewer parts than "
                f"{ranks} ranks; run at most as many ranks as it has parts (zring parts {p} lists them), or "
                "write it in more parts"
            )
    elif rank_parts is not None:
        raise ValueError(f"rank_parts= reads a dataset of parts (zring.parts); {p} has no {_PARTS_MANIFEST}")
    else:
        store = Store(str(p), "r", cache_bytes=_util.cache_bytes(cache_bytes))
    try:
        text = store.schema()
        where = str(p / _schema.SCHEMA)
        if text is None:
            raise FileNotFoundError(
                f"{where} not found; {p} is a raw store, not a dataset (open it with Zrecord)"
            )
        schema = _schema.loads(text, where)
        if ragged and not schema.get("ragged"):
            raise ValueError(f"{p} is a fixed-shape dataset; open it with Dataset")
        if not ragged and schema.get("ragged"):
            raise ValueError(f"{p} is a ragged dataset; open it with RaggedDataset")
        try:
            first = int(store.lengths(np.zeros(1, dtype=np.uint64))[0]) if len(store) else None
        except CorruptError:
            # A damaged table is the read's to report, naming what it reads.
            first = None
        _schema.check_records(schema, _schema.decode_dtype(schema), first, where)
    except BaseException:
        store.close()
        raise
    return p, store, schema


def _rank_parts(rank_parts: Any) -> tuple[int, int]:
    """A ``rank_parts`` argument checked: a pair of ints from 0 to 2**32 - 1
    (not floats: 1.5 was truncated to 1)."""
    try:
        rank, ranks = rank_parts
    except (TypeError, ValueError):
        raise TypeError(f"rank_parts must be a (rank, ranks) pair, got {rank_parts!r}") from None
    return (_util.integer(rank, "rank_parts' rank", 0, _util.U32_MAX),
            _util.integer(ranks, "rank_parts' ranks", 0, _util.U32_MAX))


class _Base(_util.Closeable):
    path: Path
    codec: str
    dtype: np.dtype
    _store: Store | None
    rank_parts: tuple[int, int] | None = None

    @property
    def _s(self) -> Store:
        if self._store is None:
            raise ValueError(f"{type(self).__name__} {str(self.path)!r} is closed")
        return self._store

    def __len__(self) -> int:
        return len(self._s)

    def _records(self, idx: np.ndarray) -> np.ndarray:
        """The store's records of the indices ``idx`` (a split maps them)."""
        return idx

    def _subset(self) -> tuple[np.ndarray, int] | None:
        """What the Rust loader reads of the store: None, all of it (a split
        gives its records and key)."""
        return None

    def verify(self) -> dict[str, Any]:
        """Read and check every record; raises CorruptError/ChecksumError on damage."""
        return self._s.verify()

    def stats(self) -> dict[str, Any]:
        """Storage usage of the underlying store, and under ``"reads"`` its
        read policy and what reads have done (:meth:`read_stats`)."""
        return {**self._s.stats(), "reads": self._s.read_stats()}

    def read_stats(self) -> dict[str, Any]:
        """The read policy in force (``policy``, ``policy_reason``,
        ``budget_bytes``) and the reads since open: ``cache_hits``,
        ``page_cache_hits``, ``hit_rate``, ``bytes_read`` (of them
        ``bytes_into_place``: read with O_DIRECT straight into the batch,
        as a DataLoader's rows of 4 KiB multiples are), ``bytes_from_cache``,
        ... Cheap (no table scan)."""
        return self._s.read_stats()

    @property
    def names(self) -> Sequence[str] | None:
        """The record names kept with the store (the relative paths of a
        converted folder, the sample keys of converted tar shards), or None:
        a sequence read on demand (``len``, ``names[i]``, slices, iteration),
        never one list of every name; deletes through :class:`Zrecord` keep it
        aligned with the records."""
        if not hasattr(self, "_names"):

            self._names = read_names(self.path, len(self), intent=self._s.names_intent)
        return self._names

    def fingerprint(self) -> dict[str, Any]:
        """``{"records", "content"}`` of the underlying store (see
        :meth:`zring.Zrecord.fingerprint`); O(1)."""
        return self._s.fingerprint()

    def close(self) -> None:
        """Release the store. Safe to call twice."""
        store, self._store = getattr(self, "_store", None), None
        if store is not None:
            store.close()
        hold, self._cache_hold = getattr(self, "_cache_hold", None), None
        if hold is not None:
            hold.close()

    def _staged(self, path: Any, rank_parts: Any, cache: Any, cache_disk_bytes: Any,
                storage_options: Any) -> Any:
        """``path`` itself, or for a URL the local copy of its share staged
        in ``cache`` (:mod:`zring.remote`), held until close."""
        from . import remote

        #: The URL the dataset was opened from (its staged copy is
        #: :attr:`path`), or None for a local path.
        self.url: str | None = None
        if not remote.is_url(path):
            for name, v in (("cache", cache), ("cache_disk_bytes", cache_disk_bytes),
                            ("storage_options", storage_options)):
                if v is not None:
                    raise ValueError(f"{name}= is for datasets in object storage (s3://, gs://, az://); "
                                     f"{path} is a local path")
            return path
        local, self._cache_hold, self._remote_share = remote._open_local(
            path, cache, None if rank_parts is None else _rank_parts(rank_parts), cache_disk_bytes, storage_options)
        self.url = path
        return local

    def _attach_lines(self, cache: Any, cache_disk_bytes: Any, storage_options: Any) -> None:
        """A share staged lazily (larger than ``cache_disk_bytes``): its
        chunk files filled line by line as they are read."""
        from . import remote

        #: The line cache of a share larger than its cap, else None.
        self._lines = None
        if self.url is not None and self._remote_share is not None:
            self._lines = _zring.LineCache(self._store, self.url, remote.options(storage_options),
                                           os.fspath(cache), int(cache_disk_bytes), self.rank_parts)

    def remote_stats(self) -> dict[str, Any] | None:
        """For a dataset in object storage read through a cache smaller than
        its share: lines and bytes fetched and evicted, fills served from
        the cache and fills that fetched, seconds spent fetching, and the
        bytes the cache holds against its cap. None otherwise."""
        return None if getattr(self, "_lines", None) is None else dict(self._lines.stats())



class Dataset(_Base):
    """Fixed-shape samples stored one per record.

    ``ds[i]`` is one sample shaped :attr:`shape`; ``ds[slice]``, ``ds[list]``,
    ``ds[int_array]`` and ``ds[bool_mask]`` return a stacked batch shaped
    ``(n, *shape)``. Negative indices count from the end.
    """

    def __init__(self, path: str | os.PathLike[str], *, cache_bytes: int | None = None,
                 rank_parts: tuple[int, int] | None = None, cache: str | os.PathLike[str] | None = None,
                 cache_disk_bytes: int | None = None, storage_options: dict[str, Any] | None = None):
        """Open the dataset at ``path`` (written by :func:`write_dataset`, or by loaderx).

        A folder with a ``manifest.json`` is a dataset of parts
        (:mod:`zring.parts`) and opens as one dataset over its committed
        parts. With ``rank_parts=(rank, ranks)`` only the parts rank
        ``rank`` of ``ranks`` reads (:func:`zring.parts.rank_plan`) are
        opened and make the dataset, so a host needs only its own parts
        (and the manifest); a :class:`DataLoader` or
        :func:`zring.jax.global_loader` over it is that rank's loader
        (docs: "Datasets beyond one host").

        ``path`` may be a URL in object storage (``s3://``, ``gs://``,
        ``az://``, ``file://``; :mod:`zring.remote`, docs/remote.rst).
        Opening it stages the dataset (with ``rank_parts``, that rank's
        share) into ``cache``, a folder on local disk, and opens the local
        copy: the dataset's ``path`` is then the copy, and its ``url`` the
        URL (None for a local path). Objects already in the cache with an
        unchanged ETag are not fetched again. ``cache_disk_bytes`` caps the
        cache folder; other datasets no process has open are removed to
        make room. A dataset of parts whose share is larger than the cap is
        staged lazily: its chunk files are filled line by line as they are
        read, a :class:`DataLoader` over it refuses modes 1 and 2 (use
        ``mode=3``), and :meth:`remote_stats` counts the lines fetched and
        evicted. A single
        store larger than the cap is refused. ``storage_options`` is a dict
        of the store's configuration keys (``aws_endpoint``,
        ``aws_region``, ...) and the tier's own (``timeout``,
        ``max_retries``, ``cache_line_bytes``, ...); credentials otherwise
        come from the environment. These three arguments are for URLs only.

        ``cache_bytes`` is the memory the process may fill with store data (page
        cache or zring's record caches), one budget for the whole process:
        the latest statement still live of :func:`zring.set_cache_bytes`, of
        the datasets opened with ``cache_bytes`` and of the DataLoaders given
        ``cache_bytes`` (each withdrawn when it closes, in any order). By
        default
        ``ZRING_CACHE_BYTES``, else the cgroup memory limit less what every
        process in the cgroup uses (split evenly among zring processes for
        their record caches), else ``MemAvailable``. It decides the read
        policy (see docs/internals.md, "Reads").

        The dataset reads the store as it was when opened, whatever other
        handles or processes append, delete or compact; a store replaced
        under it (``overwrite=True``) raises :class:`StaleError` on a read
        that needs a file it had not opened yet.

        Raises:
            FileNotFoundError: ``path`` is missing or has no ``schema.json``.
            ValueError: ``path`` is a ragged dataset; ``rank_parts`` over
                a folder that is not a dataset of parts, or naming a rank
                that gets no part (more ranks than parts); a URL without
                ``cache``, or ``cache``, ``cache_disk_bytes`` or
                ``storage_options`` with a local path; a share the cap
                cannot hold (the message names the bytes needed); an
                unknown storage option.
            NotAStoreError: ``path`` holds no store (or a part is missing).
            StaleError: an object in the bucket was replaced while it was
                fetched.
            TimeoutError: the bucket did not answer within the deadline.
        """
        self._store = None
        path = self._staged(path, rank_parts, cache, cache_disk_bytes, storage_options)
        self.path, self._store, schema = _open(path, ragged=False, cache_bytes=cache_bytes,
                                               rank_parts=rank_parts)
        self._attach_lines(cache, cache_disk_bytes, storage_options)
        #: ``(rank, ranks)`` when opened with ``rank_parts=`` (only that
        #: rank's parts), else None.
        self.rank_parts: tuple[int, int] | None = None if rank_parts is None else _rank_parts(rank_parts)
        #: The dtype of a sample.
        self.dtype: np.dtype = _schema.decode_dtype(schema)
        #: The shape of one sample (a batch is ``(n, *shape)``).
        self.shape: tuple[int, ...] = tuple(int(d) for d in schema["shape"])
        #: The codec the store was written with (``raw``, ``zstd`` or ``zstd_dict``).
        self.codec: str = schema.get("codec", "zstd")
        self._itemsize = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def record_bytes(self) -> int:
        """Bytes in one sample."""
        return self._itemsize

    def __getitem__(self, idx: Any) -> np.ndarray:
        """One sample for an integer; a stacked batch for a slice, sequence or mask."""
        if _util.is_int(idx):
            i = _util.scalar_index(idx, len(self))
            return self.__getitems__(np.array([i], dtype=np.uint64))[0]
        if isinstance(idx, slice):
            idx = np.arange(*idx.indices(len(self)), dtype=np.int64)
        elif isinstance(idx, tuple):
            raise IndexError("multi-axis indexing is not supported; index the result instead")
        return self.__getitems__(idx)

    def __getitems__(self, idxs: Any) -> np.ndarray:
        """Gather records into an array shaped ``(len(idxs), *self.shape)``."""
        idx = self._records(_util.indices(idxs, len(self)))
        out = _util.empty_rows(idx.size, self.shape, self.dtype)
        self._s.gather(idx, out.reshape(-1).view(np.uint8), self._itemsize)
        return out

    def __repr__(self) -> str:
        return f"Dataset({str(self.path)!r}, len={len(self) if self._store else 'closed'}, dtype={self.dtype}, shape={self.shape})"


def pad(values: np.ndarray, row_splits: Any, max_len: int | None = None,
        pad_value: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """Turn a packed ``(values, row_splits)`` batch into a dense padded array.

    Returns ``(padded, lengths)``: ``padded`` is ``(B, max_len, *tail)``,
    ``lengths`` the row count of each record. ``max_len`` defaults to the
    longest record; a record longer than an explicit ``max_len`` raises
    ValueError rather than being cut.
    """
    values = np.asarray(values)
    splits = np.asarray(row_splits)
    if splits.ndim != 1 or splits.size == 0:
        raise ValueError(f"row_splits must be 1-D with at least one entry, got shape {splits.shape}")
    lengths = np.diff(splits)
    if lengths.size and lengths.min() < 0:
        raise ValueError("row_splits must be non-decreasing")
    if int(splits[-1]) > len(values):
        raise ValueError(f"row_splits ends at {int(splits[-1])} but values has {len(values)} rows")
    b = int(lengths.size)
    longest = int(lengths.max()) if b else 0
    ml = longest if max_len is None else int(max_len)
    if longest > ml:
        raise ValueError(f"a record has {longest} rows, over max_len={ml}")
    padded = np.full((b, ml, *values.shape[1:]), pad_value, dtype=values.dtype)
    if b:
        # Row r of the packed values lands at (its record, its row within it).
        rec = np.repeat(np.arange(b), lengths)
        first = splits[0]
        pos = np.arange(int(splits[-1]) - int(first)) - np.repeat(splits[:-1] - first, lengths)
        padded[rec, pos] = values[int(first):int(splits[-1])]
    return padded, lengths


class RaggedDataset(_Base):
    """Variable-length records, each ``(rows, *item_shape)``.

    A batch comes back packed, as ``(values, row_splits)``: every row of every
    record in one flat array, record ``k`` being
    ``values[row_splits[k]:row_splits[k + 1]]``. ``ds[i]`` is record ``i``
    alone, shaped ``(rows, *item_shape)``.
    """

    def __init__(self, path: str | os.PathLike[str], *, cache_bytes: int | None = None,
                 rank_parts: tuple[int, int] | None = None, cache: str | os.PathLike[str] | None = None,
                 cache_disk_bytes: int | None = None, storage_options: dict[str, Any] | None = None):
        """Open the ragged dataset at ``path`` (written by :func:`write_ragged`).
        ``cache_bytes``, a dataset of parts and ``rank_parts``, and a URL in
        object storage with ``cache``, ``cache_disk_bytes`` and
        ``storage_options``, as for :class:`Dataset`.

        Raises:
            FileNotFoundError: ``path`` is missing or has no ``schema.json``.
            ValueError: ``path`` is a fixed-shape dataset; the other
                arguments as for :class:`Dataset`.
        """
        self._store = None
        path = self._staged(path, rank_parts, cache, cache_disk_bytes, storage_options)
        self.path, self._store, schema = _open(path, ragged=True, cache_bytes=cache_bytes,
                                               rank_parts=rank_parts)
        self._attach_lines(cache, cache_disk_bytes, storage_options)
        #: ``(rank, ranks)`` when opened with ``rank_parts=``, else None.
        self.rank_parts: tuple[int, int] | None = None if rank_parts is None else _rank_parts(rank_parts)
        #: The dtype of the values.
        self.dtype: np.dtype = _schema.decode_dtype(schema)
        #: The shape of one row of a record (a record is ``(rows, *item_shape)``).
        self.item_shape: tuple[int, ...] = tuple(int(d) for d in schema["item_shape"])
        #: The codec the store was written with (``raw``, ``zstd`` or ``zstd_dict``).
        self.codec: str = schema.get("codec", "zstd")
        self._row_bytes = int(np.prod(self.item_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes in one row of a record."""
        return self._row_bytes

    def __getitem__(self, idx: Any):
        """Record ``idx`` as ``(rows, *item_shape)``; a packed batch for anything else."""
        if _util.is_int(idx):
            i = _util.scalar_index(idx, len(self))
            values, _ = self.__getitems__(np.array([i], dtype=np.uint64))
            return values
        if isinstance(idx, slice):
            idx = np.arange(*idx.indices(len(self)), dtype=np.int64)
        return self.__getitems__(idx)

    def _rows(self, idx: np.ndarray) -> np.ndarray:
        byte_lens = self._s.lengths(idx).astype(np.int64)
        if self._row_bytes == 0:
            return np.zeros(idx.size, dtype=np.int64)
        bad = byte_lens % self._row_bytes
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"record {int(idx[k])} holds {int(byte_lens[k])} bytes, not a whole number "
                f"of {self._row_bytes}-byte rows"
            )
        return byte_lens // self._row_bytes

    def __getitems__(self, idxs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Gather records into packed ``(values, row_splits)``."""
        idx = self._records(_util.indices(idxs, len(self)))
        rows = self._rows(idx)
        row_splits = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(rows, out=row_splits[1:])
        values = np.empty((int(row_splits[-1]), *self.item_shape), dtype=self.dtype)
        offsets = (row_splits[:-1] * self._row_bytes).astype(np.uint64)
        self._s.gather_var(idx, values.reshape(-1).view(np.uint8), offsets)
        return values, row_splits

    def getitems_padded(self, idxs: Any, max_len: int | None = None,
                        pad_value: Any = 0) -> tuple[np.ndarray, np.ndarray]:
        """Gather records straight into a dense padded batch; see :func:`pad`."""
        idx = self._records(_util.indices(idxs, len(self)))
        rows = self._rows(idx)
        b = int(idx.size)
        longest = int(rows.max()) if b else 0
        ml = longest if max_len is None else int(max_len)
        if longest > ml:
            raise ValueError(f"a record has {longest} rows, over max_len={ml}")
        padded = np.full((b, ml, *self.item_shape), pad_value, dtype=self.dtype)
        offsets = np.arange(b, dtype=np.uint64) * np.uint64(ml * self._row_bytes)
        self._s.gather_var(idx, padded.reshape(-1).view(np.uint8), offsets)
        return padded, rows

    def __repr__(self) -> str:
        return f"RaggedDataset({str(self.path)!r}, dtype={self.dtype}, item_shape={self.item_shape})"


#: The single JSON list earlier versions wrote.
LEGACY_NAMES = "names.json"


class Names(Sequence[str]):
    """A store's record names, read on demand: ``len``, ``names[i]``,
    ``names[a:b]`` (a list), iteration (in blocks), ``==`` with a list."""

    _BLOCK = 65_536

    def __init__(self, path: Path, pending: tuple[int, dict[int, int]] | None = None):
        """``pending``: a delete interrupted before the names followed
        (``_zrecord.pending_delete``), applied as the names are read."""
        self._ds = RaggedDataset(path)
        self._len = len(self._ds)
        self._moved_from = self._moved_to = np.zeros(0, dtype=np.int64)
        if pending is not None:
            self._len, moved = pending
            keys = np.array(sorted(moved), dtype=np.int64)
            self._moved_from = keys
            self._moved_to = np.array([moved[int(k)] for k in keys], dtype=np.int64)

    def __len__(self) -> int:
        return self._len

    def _block(self, start: int, stop: int) -> list[str]:
        if start >= stop:
            return []
        rows = np.arange(start, stop, dtype=np.int64)
        a, b = np.searchsorted(self._moved_from, [start, stop])
        rows[self._moved_from[a:b] - start] = self._moved_to[a:b]
        values, splits = self._ds[rows]
        raw = values.tobytes()
        return [raw[a:b].decode("utf-8") for a, b in zip(splits[:-1], splits[1:])]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            return self._block(start, stop)
        n = len(self)
        k = int(i)
        if not -n <= k < n:
            raise IndexError(f"name {k} is out of range for {n} records")
        k %= n
        return self._block(k, k + 1)[0]

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), self._BLOCK):
            yield from self._block(start, min(len(self), start + self._BLOCK))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Names, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<zring names of {len(self)} records>"


def read_names(path: str | os.PathLike[str], records: int | None = None,
               intent: Callable[[], bytes | None] | None = None) -> Sequence[str] | None:
    """The names kept with the store at ``path``, or None. With ``records``
    (the store's record count), names of another count are a CorruptError
    naming both counts, unless ``intent`` (the store's ``names_intent``)
    holds the delete that was interrupted between the records and the
    names: the names then read as that delete leaves them, nothing written."""
    from ._zrecord import NAMES_DIR, names_mismatch, pending_delete

    p = Path(path)
    if (p / NAMES_DIR).is_dir():
        names = Names(p / NAMES_DIR)
        if records is not None and len(names) != records:
            pending = pending_delete(p, records, len(names), intent) if intent is not None else None
            if pending is None:
                raise names_mismatch(p, records, len(names))
            names = Names(p / NAMES_DIR, pending)
        return names
    legacy = p / LEGACY_NAMES
    try:
        text = legacy.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    names = json.loads(text)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{legacy} is not a JSON list of strings")
    return names
