"""Raw byte records (:class:`Zrecord`) and NumPy-to-store conversion.

A store holds opaque byte records in a dense index space ``0..len``; what the
bytes mean is the caller's business. :func:`write_dataset` and
:func:`write_ragged` add a ``schema.json`` so :class:`zring.Dataset` and
:class:`zring.RaggedDataset` can read the records back as arrays.

Every call that touches the disk runs in the Rust engine with the GIL
released, so several Python threads can gather at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from . import _schema, _util
from ._zring import CorruptError, Staging, Store, ZringError, check_replaceable

#: loaderx's name for the base error class; an alias of :class:`ZringError`.
ZrecordError = ZringError

#: Largest dictionary trained when no ``dict_size`` is given, and the smallest.
DICT_MAX = 1 << 20
DICT_MIN = 8 << 10
#: Dictionary training looks at no more records and bytes than this.
DICT_MAX_SAMPLES = 8192
DICT_SAMPLE_BYTES = 256 << 20
#: Default upper bound on the bytes handed to one append call.
WRITE_CHUNK_BYTES = 64 << 20
#: The store of a store's record names (a ragged store of UTF-8 bytes).
NAMES_DIR = "names"
#: A delete's intent, kept while its records are committed and its names
#: not yet (see :meth:`Zrecord.delete`).
NAMES_INTENT = "names.intent"


def read_intent(path: Path, raw: Callable[[], bytes | None]) -> tuple[int, int, np.ndarray]:
    """The interrupted delete of the store at ``path``: the record counts
    before and after it and the indices it deletes. ``raw`` reads the
    intent through the store (its directory's descriptor); one that cannot
    be read or parsed is a CorruptError naming it."""
    try:
        op = json.loads((raw() or b"").decode("utf-8"))
        return int(op["records_before"]), int(op["records_after"]), np.asarray(op["indices"], dtype=np.uint64)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptError(f"corrupted store: {path / NAMES_INTENT}: unreadable ({exc}); restore the store from a "
                           "copy") from None


def pending_delete(path: Path, records: int, names: int,
                   raw: Callable[[], bytes | None]) -> tuple[int, dict[int, int]] | None:
    """For a reader of a store whose delete was interrupted after its
    records' commit and before its names' (``records`` records, ``names``
    names, the intent still there): the names' view the finished delete
    would leave, as (its length, {new index: old index} for the holes the
    delete filled), so a read-only handle reads the right names without
    writing. ``None`` when no intent explains the counts."""
    try:
        if raw() is None:
            return None
    except OSError:
        return None
    before, after, indices = read_intent(path, raw)
    if (records, names) != (after, before) or before == after:
        return None
    # The engine's delete: holes filled by the last record, highest first.
    moved: dict[int, int] = {}
    n = before
    for i in sorted({int(i) for i in indices}, reverse=True):
        last = n - 1
        src = moved.pop(last, last)
        if i != last:
            moved[i] = src
        n -= 1
    return (n, moved) if n == after else None


def names_mismatch(path: Path, records: int, names: int) -> CorruptError:
    """The error for a store whose names and records disagree in number."""
    hint = ""
    if (path / NAMES_INTENT).exists():
        hint = (f"; a delete was interrupted between its two commits ({NAMES_INTENT} is there): "
                f"open the store writable (zring.Zrecord({str(path)!r})) to finish it")
    return CorruptError(
        f"corrupted store: {path / NAMES_DIR}: {names} names for {records} records in {path}{hint}"
    )


class Zrecord(_util.Closeable):
    """A store of opaque byte records with a dense index space ``0..len``.

    Opening takes the store's single-writer lock (``readonly=False``, the
    default) and creates the store when the directory holds none. Pass
    ``readonly=True`` to read a store another process is writing or to open a
    loaderx store in place.

    Deleting swaps the last record into each hole, so an index names the same
    record only until the next :meth:`delete`.
    """

    def __init__(self, path: str | os.PathLike[str], codec: str = "zstd", *, readonly: bool = False,
                 cache_bytes: int | None = None):
        """Open (or create) the store at ``path``.

        Args:
            path: Directory holding the store.
            codec: Default compression for :meth:`append`: ``"raw"``,
                ``"zstd"`` or ``"zstd_dict"`` (needs :meth:`train_dict` first).
            readonly: Open without the writer lock; writes then raise.
            cache_bytes: Memory budget of the read policy (see
                :class:`zring.Dataset`); detected when None.

        Raises:
            ValueError: ``codec`` names no codec.
            LockedError: Another writer holds the store.
            NotAStoreError: ``path`` holds something that is not a store.
            CorruptError: ``path`` holds store files but no ``head.zr``
                (nothing is changed), or its record names (``names/``)
                and records differ in number.
        """
        self.codec = _schema.check_codec(codec)
        self.path = Path(path)
        self._store: Store | None = None
        self._store = Store(str(self.path), "r" if readonly else "a", codec=codec,
                            cache_bytes=_util.cache_bytes(cache_bytes))
        try:
            self._check_names(readonly)
        except BaseException:
            self.close()
            raise

    def _check_names(self, readonly: bool) -> None:
        """Finishes a delete interrupted between its records and its names
        (writable handles), then checks that names and records agree in
        number: a mismatch is a CorruptError naming both counts, unless a
        read-only handle finds it is the interrupted delete's (which its
        names then apply as they read, :func:`pending_delete`)."""
        if not (self.path / NAMES_DIR).is_dir():
            return
        if not readonly and self._has_intent():
            with self._names_store() as names:
                self._replay(names)
        with Store(str(self.path / NAMES_DIR), "r") as names:
            count = len(names)
        if count != len(self._s) and pending_delete(self.path, len(self._s), count, self._s.names_intent) is None:
            raise names_mismatch(self.path, len(self._s), count)

    def _has_intent(self) -> bool:
        """Whether a delete left its intent (one that cannot be read counts:
        :meth:`_replay` reports it)."""
        try:
            return self._s.names_intent() is not None
        except OSError:
            return True

    def _replay(self, names: "Zrecord") -> None:
        """Brings ``names`` to the state the intent of a delete describes.
        Its records are committed or not (the record count says which); the
        names follow them, then the intent goes. The engine reads, writes
        and removes the intent through the store directory's descriptor
        (never through a link)."""
        before, after, indices = read_intent(self.path, self._s.names_intent)
        n, m = len(self._s), len(names)
        if n == after and m == before and before != after:
            names._s.delete(indices)
            names.sync()
        elif (n, m) not in ((after, after), (before, before)):
            raise CorruptError(
                f"corrupted store: {self.path / NAMES_INTENT}: a delete from {before} to {after} records, but the "
                f"store holds {n} records and {m} names"
            )
        self._s.set_names_intent(None)

    @property
    def _s(self) -> Store:
        if self._store is None:
            raise ValueError(f"Zrecord {str(self.path)!r} is closed")
        return self._store

    def __len__(self) -> int:
        return len(self._s)

    def sync(self) -> None:
        """Make every appended record and the record table durable on disk."""
        self._s.sync()

    def lengths(self, idxs: Any) -> np.ndarray:
        """Logical (uncompressed) byte length of each record, as uint32."""
        idx = _util.as_u64(idxs, "idxs")
        return self._s.lengths(idx).astype(np.uint32)

    def gather(self, idxs: Any, dst: np.ndarray, stride: int) -> None:
        """Decode records ``idxs`` into ``dst`` in place, one every ``stride`` bytes.

        Every record must be exactly ``stride`` bytes long, and ``dst`` must
        be C-contiguous, writable and at least ``len(idxs) * stride`` bytes.
        """
        idx = _util.as_u64(idxs, "idxs")
        self._s.gather(idx, _util.as_writable_bytes(dst, "dst"), int(stride))

    def gather_var(self, idxs: Any, dst: np.ndarray, offsets: Any) -> None:
        """Decode variable-length records ``idxs`` into ``dst`` at byte ``offsets``."""
        idx = _util.as_u64(idxs, "idxs")
        off = _util.as_u64(offsets, "offsets")
        self._s.gather_var(idx, _util.as_writable_bytes(dst, "dst"), off)

    def append(self, src: np.ndarray, n: int, item_len: int, codec: str | None = None) -> int:
        """Append ``n`` records of ``item_len`` bytes each, taken in order from ``src``.

        Returns the index given to the first new record.
        """
        flat = _util.as_bytes(src, "src")
        n, item_len = int(n), int(item_len)
        if n < 0 or item_len < 0:
            raise ValueError(f"n and item_len must be non-negative, got n={n}, item_len={item_len}")
        if flat.size < n * item_len:
            raise ValueError(
                f"src holds {flat.size} bytes, fewer than n * item_len = {n} * {item_len}"
            )
        if codec is not None:
            _schema.check_codec(codec)
        self._refuse_unnamed()
        return self._s.append_fixed(flat[: n * item_len], item_len, codec)

    def append_var(self, src: np.ndarray, offsets: Any, lens: Any, codec: str | None = None) -> int:
        """Append records of different lengths: record ``i`` is ``src[offsets[i]:][:lens[i]]``.

        Returns the index given to the first new record.
        """
        flat = _util.as_bytes(src, "src")
        off = _util.as_u64(offsets, "offsets")
        ln = _util.as_u64(lens, "lens")
        if off.size != ln.size:
            raise ValueError(f"offsets has {off.size} entries but lens has {ln.size}")
        if codec is not None:
            _schema.check_codec(codec)
        self._refuse_unnamed()
        return self._s.append(flat, off, ln, codec)

    def _refuse_unnamed(self) -> None:
        if (self.path / NAMES_DIR).is_dir():
            raise ValueError(
                f"{self.path} keeps a name for each record ({NAMES_DIR}/); records appended without names would "
                f"misalign them: convert the source again, or remove {self.path / NAMES_DIR} first"
            )

    def train_dict(self, samples: Any, sizes: Any, target: int) -> int:
        """Train a zstd dictionary on concatenated ``samples`` and install it.

        ``sizes`` gives each sample's byte length; ``target`` caps the size.
        Returns the dictionary's size in bytes. Needed before appending with
        ``codec="zstd_dict"``.
        """
        buf = np.ascontiguousarray(samples)
        flat = _util.as_bytes(buf, "samples")
        sz = _util.as_u64(sizes, "sizes")
        return self._s.train_dict(flat, sz, int(target))

    def has_dict(self) -> bool:
        """True when the store has a trained zstd dictionary."""
        return self._s.has_dict()

    def delete(self, idxs: Any) -> None:
        """Remove records, keeping the index space dense (the tail fills holes).

        The bytes stay on disk until :meth:`compact`. Duplicates and any order
        are accepted. A store with record names (``names/``) deletes them
        too, as one change: a names store another handle holds raises
        LockedError before anything changes, and a crash between the two
        commits is finished by the next writable open.
        """
        idx = _util.as_u64(idxs, "idxs")
        names = self._names_store()
        if names is None:
            self._s.delete(idx)
            return
        # The record names (a store of their own) move exactly as the records
        # do, under one intent: their lock is taken first (a names store held
        # by another handle fails the delete before anything changes), the
        # intent is durable before the records commit, and a crash between
        # the two commits is finished by the next writable open.
        with names:
            n = len(self._s)
            if len(names) != n:
                raise names_mismatch(self.path, n, len(names))
            after = n - int(np.unique(idx).size)
            self._s.set_names_intent(json.dumps(
                {"op": "delete", "records_before": n, "records_after": after, "indices": idx.tolist()}
            ).encode())
            try:
                self._s.delete(idx)
            except BaseException:
                if len(self._s) == n:
                    self._s.set_names_intent(None)
                raise
            self._replay(names)

    def compact(self, format: int | None = None) -> dict[str, Any]:
        """Reclaim the space deleted records left behind; returns a report dict.

        ``format=2`` (or 1) also rewrites the record table in that format,
        even when nothing was deleted: format 2 keeps no per-record entry for
        raw records of one length (a checksum per block of at least 4 KiB of
        them) and 12 bytes for any other record, against 32 bytes in format
        1. Crash-safe: a crash leaves the old store or the new one. Records
        appended later get format-1 entries after the sealed part; a
        :meth:`delete` rewrites the table in format 1. ``None`` keeps the
        store's format.
        """
        if format is not None and (isinstance(format, bool) or format not in (1, 2)):
            raise ValueError(f"compact: format must be 1 or 2 (or None to keep the store's), not {format!r}")
        # Compaction keeps every record's index, so names and records stay
        # aligned whichever compacts first; the names' lock is still taken
        # first, so a names store held elsewhere changes nothing.
        names = self._names_store()
        if names is None:
            return self._s.compact(format)
        with names:
            report = self._s.compact(format)
            names.compact(format)
        return report

    def _names_store(self) -> "Zrecord | None":
        """The store of this store's record names, open for writing (its
        lock taken), if the store has names. A ``names/`` directory without a
        head is an error (the engine's), never skipped."""
        p = self.path / NAMES_DIR
        return Zrecord(p) if p.is_dir() else None

    def stats(self) -> dict[str, Any]:
        """Storage usage: ``records``, ``live_bytes``, ``chunk_bytes``, ``reclaimable``, ...,
        and under ``"reads"`` the read policy and what reads have done."""
        return {**self._s.stats(), "reads": self._s.read_stats()}

    def read_stats(self) -> dict[str, Any]:
        """The read policy in force and the reads since open (no table scan)."""
        return self._s.read_stats()

    def fingerprint(self) -> dict[str, Any]:
        """``{"records", "content"}``: the record count and a 32-bit checksum
        over every record's stored checksum and length, in index order. Kept
        in the store's head, so O(1); compaction keeps it, appends, deletes
        and other data change it. What :mod:`zring.jax` checkpoints check."""
        return self._s.fingerprint()

    def verify(self) -> dict[str, Any]:
        """Read and check every record; raises CorruptError/ChecksumError on damage."""
        return self._s.verify()

    def close(self) -> None:
        """Release the store (and its writer lock). Safe to call twice."""
        store, self._store = self._store, None
        if store is not None:
            store.close()


    def __repr__(self) -> str:
        state = "closed" if self._store is None else f"{len(self)} records"
        return f"Zrecord({str(self.path)!r}, codec={self.codec!r}, {state})"


# ---------------------------------------------------------------- conversion


def _progress(total: int, desc: str, progress: bool | None):
    """A tqdm bar when asked for (or, by default, when stderr is a terminal).

    tqdm is a dependency of zring; should it be missing all the same, an
    explicit ``progress=True`` warns instead of drawing nothing silently."""
    asked = bool(progress)
    if progress is None:
        try:
            progress = sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):
            progress = False
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        if asked:
            warnings.warn("progress=True needs tqdm, which is not installed (pip install tqdm): "
                          "writing without a progress bar", stacklevel=2)
        return None
    # A terminal that reports a 0x0 size (a fresh pty, some containers) makes
    # tqdm hide the bar (no room for it); assume a classic 80x24 there.
    size: dict[str, int] = {}
    try:
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
        if cols <= 0:
            size["ncols"] = 80
        if rows <= 0:
            size["nrows"] = 24
    except (AttributeError, OSError, ValueError):
        pass
    return tqdm(total=total, desc=desc, unit="rec", unit_scale=True, file=sys.stderr, **size)


def _dict_target(sample_bytes: int, dict_size: int | None) -> int:
    if dict_size is not None:
        if int(dict_size) <= 0:
            raise ValueError(f"dict_size must be positive, got {dict_size}")
        return int(dict_size)
    return min(DICT_MAX, max(DICT_MIN, sample_bytes // 100))


def _release(store: Store, failed: bool) -> None:
    """Close a store being written. After a failure, quietly: the failure is
    what the caller must see (a full disk as the ``OSError`` it is), not any
    error of the close that follows it."""
    if not failed:
        store.close()
        return
    try:
        store.close()
    except Exception:  # noqa: BLE001 - the first failure is already propagating
        pass


@contextlib.contextmanager
def _target(path: Path, overwrite: bool, append: bool):
    """Where to build the store for ``path``, and its publication.

    By default (and with ``overwrite``) the store is built in a temporary
    directory beside ``path`` and renamed into place once complete and
    synced; an exception removes it, leaving ``path`` as it was. An existing
    ``path`` is an error unless ``overwrite`` (which replaces it, in one
    rename where the system can swap directories) or ``append`` (which
    writes into it, as loaderx does).
    """
    if overwrite and append:
        raise ValueError("overwrite=True and append=True exclude each other")
    exists = os.path.lexists(path)
    if append:
        yield path
        return
    if exists and not overwrite:
        raise FileExistsError(
            f"{path} already exists; pass overwrite=True to replace it, or append=True to add records to it"
        )
    if exists:
        # FileExistsError naming the path unless it is a store, a directory
        # of stores or empty; the engine's replace checks again before it
        # removes anything.
        check_replaceable(str(path))
    # The engine makes the directory (with the mode any directory made here
    # gets), renames it into place, swapping it for an existing store in one
    # step where the file system can, and fsyncs the parent.
    staging = Staging(path, overwrite)
    try:
        yield Path(staging.path)
        staging.publish()
    except BaseException:
        staging.discard()
        raise


def _open_for_write(path: Path, schema: dict[str, Any], same: Callable[[dict[str, Any]], bool],
                    describe: str, sealable: bool = False, level: int | None = None) -> Store:
    """Open (or create) the store and check or write its schema. ``sealable``
    (a store written once) lays the records out for ``Store.seal``; ``level``
    is the zstd level of the records appended (None: the default, 3)."""
    # The engine makes the directory (through the descriptor of a staging
    # directory it lies in: never through a link).
    store = Store(str(path), "a", codec=schema["codec"], level=level, sealable=sealable)
    try:
        text = store.schema()
        if text is None:
            store.set_schema(_schema.dumps(schema))
        else:
            existing = _schema.loads(text, str(path / _schema.SCHEMA))
            if not same(existing):
                raise ValueError(
                    f"{path} holds records described as {_describe(existing)}, "
                    f"cannot append {describe}"
                )
    except BaseException:
        store.close()
        raise
    return store


def _finish(store: Store, seal: bool) -> None:
    """Make a store's records durable; a store written once (``seal``) also
    gets its table in format 2 where its records allow, by rewriting the
    table alone (``Store.seal``: 20 million int64 labels then take 1.001x
    their bytes on disk instead of 5x, ragged records 12.05 bytes of table
    each instead of 32). Appends keep the table's format."""
    if seal:
        store.seal()
    else:
        store.sync()


def _describe(schema: dict[str, Any]) -> str:
    dt = schema.get("dtype_name") or schema.get("dtype")
    if schema.get("ragged"):
        return f"ragged {dt} rows of shape {tuple(schema.get('item_shape', ()))}"
    return f"{dt} samples of shape {tuple(schema.get('shape', ()))}"


def write_dataset(path: str | os.PathLike[str], array: Any, codec: str = "zstd",
                  chunk_bytes: int = WRITE_CHUNK_BYTES, dict_size: int | None = None,
                  *, progress: bool | None = None, overwrite: bool = False, append: bool = False,
                  level: int | None = None) -> int:
    """Store ``array`` one record per slice along axis 0; returns the record count.

    The array is read in blocks of at most ``chunk_bytes`` bytes, so a
    ``np.load(..., mmap_mode='r')`` array converts without being loaded whole.
    A ``schema.json`` records dtype and sample shape for :class:`Dataset`.

    A new store's record table is sealed in format 2 before it is renamed
    into place: raw records of one length (int64 labels; ``"zstd"`` keeps a
    record raw when it does not shrink) then take no table entry at all, so
    20 million labels take 1.001x their bytes instead of 5x. ``append=True``
    keeps the table's format (appended records get 32-byte entries; see
    :meth:`Zrecord.compact`).

    The store is built in a temporary directory beside ``path`` and renamed
    into place once complete and durable: an exception part-way (or a
    crash) leaves nothing at ``path`` (a crash may leave the hidden
    ``.NAME.*.partial`` directory beside it, which is safe to delete and which
    the next write to ``path`` removes). A ``path`` that exists already is an
    error unless ``overwrite=True`` (replace it; only a store whose
    ``head.zr`` reads as one, a directory of stores or an empty directory is
    replaced, and anything else raises with every file kept) or ``append=True`` (add the records to it if dtype
    and shape agree, loaderx's behaviour; an exception part-way then keeps the
    records appended before it).

    Args:
        path: Destination directory.
        array: Samples stacked along axis 0 (a 1-D array gives scalar samples).
        codec: ``"zstd"`` (default), ``"raw"`` or ``"zstd_dict"``.
        chunk_bytes: Upper bound on the bytes submitted per append.
        dict_size: Dictionary size cap for ``"zstd_dict"``; adapts when None.
        progress: Show a tqdm bar; by default only when stderr is a terminal.
        overwrite: Replace an existing store at ``path``.
        append: Add to an existing store at ``path`` (or create it).
        level: zstd level of ``"zstd"`` records (default 3, as loaderx).
            Every level writes the same format: each record its own zstd
            frame, read back by any reader. Level 2 or 1 compress faster
            (records of up to 16 KiB: level 2 in about 0.75x the CPU time of
            level 3; see ``bench-results/writes.md``), usually to a slightly
            lower ratio.

    Raises:
        FileExistsError: ``path`` exists and neither ``overwrite`` nor
            ``append`` is set (or ``overwrite`` is, and it is not a store, a
            directory of stores or an empty directory: nothing is removed).
        ValueError: Bad codec, a 0-d array, a schema mismatch on append,
            both ``overwrite`` and ``append``, or a ``level`` that is not a
            zstd level or is given with another codec than ``"zstd"``.
        CorruptError: ``append`` names a directory holding store files but
            no ``head.zr`` (nothing is changed), or a damaged ``schema.json``.
        TypeError: The dtype holds Python objects.
    """
    _schema.check_codec(codec)
    level = _schema.check_level(level, codec)
    array = np.asanyarray(array)
    if array.ndim < 1:
        raise ValueError("array must have a sample axis (ndim >= 1), got a 0-d array")
    if int(chunk_bytes) <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    dtype = _schema.check_dtype(array.dtype)
    shape = tuple(int(d) for d in array.shape[1:])
    itemsize = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    schema = _schema.fixed_schema(dtype, shape, codec)
    encoded = _schema.encode_dtype(dtype)

    def same(existing: dict[str, Any]) -> bool:
        return (not existing.get("ragged")
                and {k: existing.get(k) for k in ("dtype", "dtype_name")} ==
                {k: encoded.get(k) for k in ("dtype", "dtype_name")}
                and tuple(existing.get("shape", ())) == shape)

    path = Path(path)
    count = len(array)
    with _target(path, overwrite, append) as where:
        _write_fixed(where, path.name, array, codec, dtype, shape, itemsize, schema, same, chunk_bytes,
                     dict_size, progress, seal=not append, level=level)
    return count


def _write_fixed(where: Path, name: str, array: Any, codec: str, dtype: np.dtype, shape: tuple[int, ...],
                 itemsize: int, schema: dict[str, Any], same: Callable[[dict[str, Any]], bool],
                 chunk_bytes: int, dict_size: int | None, progress: bool | None, seal: bool,
                 level: int | None = None) -> None:
    count = len(array)
    store = _open_for_write(where, schema, same, f"{dtype} samples of shape {shape}", sealable=seal, level=level)
    bar = _progress(count, f"write {name}", progress)
    ok = False
    try:
        if codec == "zstd_dict" and count and not store.has_dict():
            k = min(count, DICT_MAX_SAMPLES, max(1, DICT_SAMPLE_BYTES // max(itemsize, 1)))
            picks = np.unique(np.linspace(0, count - 1, k).astype(np.int64))
            rows = np.ascontiguousarray(array[picks], dtype=dtype)
            flat = rows.reshape(-1).view(np.uint8)
            sizes = np.full(len(picks), itemsize, dtype=np.uint64)
            store.train_dict(flat, sizes, _dict_target(flat.size, dict_size))
        step = max(1, int(chunk_bytes) // max(itemsize, 1))
        for start in range(0, count, step):
            block = np.ascontiguousarray(array[start:start + step], dtype=dtype)
            store.append_fixed(block.reshape(-1).view(np.uint8), itemsize, codec)
            if bar is not None:
                bar.update(len(block))
        _finish(store, seal)
        ok = True
    finally:
        if bar is not None:
            bar.close()
        _release(store, not ok)


def write_ragged(path: str | os.PathLike[str], arrays: Iterable[Any], dtype: Any = None,
                 item_shape: Iterable[int] | None = None, codec: str = "zstd",
                 chunk_bytes: int = WRITE_CHUNK_BYTES, dict_size: int | None = None,
                 *, progress: bool | None = None, overwrite: bool = False, append: bool = False,
                 level: int | None = None) -> int:
    """Store variable-length arrays, one record each; returns the record count.

    Each array is ``(rows, *item_shape)``; ``dtype`` and ``item_shape`` are
    taken from the first array when omitted. Open the result with
    :class:`RaggedDataset`. ``overwrite`` and ``append`` as for
    :func:`write_dataset`: by default the store is built beside ``path`` and
    renamed into place when complete, so an exception (an iterable that
    raises part-way, a bad array) leaves nothing at ``path``. A new store's
    table is sealed in format 2 (12 bytes a record instead of 32);
    ``append=True`` keeps the table's format. ``level``: the zstd level of
    ``"zstd"`` records, as for :func:`write_dataset`.

    Raises:
        FileExistsError: ``path`` exists and neither ``overwrite`` nor
            ``append`` is set.
        ValueError: No arrays, a bad codec, an array whose row shape is not
            ``item_shape``, a value ``dtype`` cannot hold (70000 for uint16,
            1.5 or 2**40 for int32; named with the dtype, and nothing is
            written), both ``overwrite`` and ``append``, or a bad ``level``.
    """
    _schema.check_codec(codec)
    level = _schema.check_level(level, codec)
    if int(chunk_bytes) <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    it = iter(arrays)
    try:
        first = np.asarray(next(it))
    except StopIteration:
        raise ValueError("no arrays to write") from None
    dt = _schema.check_dtype(first.dtype if dtype is None else dtype)
    if item_shape is None:
        ishape = tuple(int(d) for d in first.shape[1:])
    else:
        ishape = tuple(int(d) for d in item_shape)
    schema = _schema.ragged_schema(dt, ishape, codec)
    encoded = _schema.encode_dtype(dt)

    def same(existing: dict[str, Any]) -> bool:
        return (bool(existing.get("ragged"))
                and {k: existing.get(k) for k in ("dtype", "dtype_name")} ==
                {k: encoded.get(k) for k in ("dtype", "dtype_name")}
                and tuple(existing.get("item_shape", ())) == ishape)

    rank = 1 + len(ishape)

    def prepared(i: int, a: Any) -> np.ndarray:
        # The usual case (a C-contiguous array of the dtype and row shape)
        # skips the checked cast: a million small documents spend their time
        # here.
        if type(a) is np.ndarray and a.dtype == dt and a.ndim == rank and a.shape[1:] == ishape \
                and a.flags.c_contiguous:
            return a
        a = _util.as_dtype(a, dt, f"array {i}")
        if a.ndim < 1 or tuple(a.shape[1:]) != ishape:
            raise ValueError(
                f"array {i} has shape {a.shape}; expected (rows, *{ishape})"
            )
        return a

    path = Path(path)
    with _target(path, overwrite, append) as where:
        return _write_var(where, path.name, chain([first], it), codec, dt, ishape, schema, same, prepared,
                          chunk_bytes, dict_size, progress, seal=not append, level=level)


def _write_var(where: Path, name: str, arrays: Iterable[Any], codec: str, dt: np.dtype,
               ishape: tuple[int, ...], schema: dict[str, Any], same: Callable[[dict[str, Any]], bool],
               prepared: Callable[[int, Any], np.ndarray], chunk_bytes: int, dict_size: int | None,
               progress: bool | None, seal: bool, level: int | None = None) -> int:
    store = _open_for_write(where, schema, same, f"ragged {dt} rows of shape {ishape}", sealable=seal,
                            level=level)
    bar = _progress(0, f"write {name}", progress)
    total = 0
    need_dict = codec == "zstd_dict" and not store.has_dict()
    block: list[np.ndarray] = []
    block_bytes = 0
    # One block is appended by a thread (the engine releases the GIL) while
    # this one gathers the next: the caller's arrays and the engine's copy,
    # checksums and compression run on two cores. At most one append is in
    # flight, so memory stays about two blocks.
    pool = ThreadPoolExecutor(1, thread_name_prefix="zring-write")
    pending: Future[None] | None = None
    pending_records = 0

    def settle() -> None:
        """Waits for the append in flight (raising its error) and counts it."""
        nonlocal pending, pending_records, total
        if pending is not None:
            f, pending = pending, None
            f.result()
            total += pending_records
            if bar is not None:
                bar.update(pending_records)
            pending_records = 0

    def flush() -> None:
        nonlocal block, block_bytes, need_dict, pending, pending_records
        if not block:
            return
        lens = np.fromiter((a.nbytes for a in block), dtype=np.uint64, count=len(block))
        offsets = np.zeros(len(block), dtype=np.uint64)
        np.cumsum(lens[:-1], out=offsets[1:])
        src = np.concatenate(block).reshape(-1).view(np.uint8) if block_bytes else np.zeros(0, dtype=np.uint8)
        if need_dict:
            k = min(len(block), DICT_MAX_SAMPLES)
            end = int(offsets[k - 1] + lens[k - 1])
            store.train_dict(src[:end], lens[:k], _dict_target(end, dict_size))
            need_dict = False
        settle()
        pending = pool.submit(store.append, src, offsets, lens, codec)
        pending_records = len(block)
        block, block_bytes = [], 0

    ok = False
    try:
        for i, a in enumerate(arrays):
            a = prepared(i, a)
            block.append(a)
            block_bytes += a.nbytes
            if block_bytes >= chunk_bytes:
                flush()
        flush()
        settle()
        _finish(store, seal)
        ok = True
    finally:
        pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
        _release(store, not ok)
    return total
