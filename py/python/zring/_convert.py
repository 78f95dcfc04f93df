"""Importers: Parquet files, Arrow IPC files (HuggingFace ``save_to_disk``
folders), folders of files and WebDataset tar shards into zring stores
(:func:`convert`, and ``zring convert`` on the command line).

Every importer streams: a Parquet file a row group at a time, Arrow files,
folders and tar shards a block of about ``block_bytes`` at a time, so memory
stays bounded whatever the source's size. Each block is handed to the engine as one
append, which compresses its records on every core. The whole destination is
built in a temporary directory beside it and renamed into place when every
store in it is complete and synced, like :func:`zring.write_dataset`, each
store's table sealed in format 2 (no entry per record for fixed-width
columns, 12 bytes a record for the others).

What each source becomes:

* Parquet (a file, or a directory of ``*.parquet`` files read in sorted
  order; needs ``pyarrow``): ``DST/<column>.zr`` per column (``columns=``
  picks some). Fixed-width numbers and booleans become a :class:`Dataset` of
  scalars; fixed-size lists (nested too) a :class:`Dataset` with that item
  shape; variable-length lists of numbers a :class:`RaggedDataset` of the
  element type; strings and binary a :class:`RaggedDataset` of uint8 (the
  UTF-8 bytes). Timestamps, dates, times and durations become int64 (int32
  for date32/time32) counts since the epoch in the column's unit, which the
  store's schema records (``unit``, ``arrow_type``); dictionary (categorical)
  columns become their values; a struct of ``bytes`` (binary) and ``path``
  (string), HuggingFace's ``Image()`` feature, becomes a
  :class:`RaggedDataset` of the encoded bytes whose names are the paths. A
  null is an error naming its column unless ``fill=`` is given: then a null
  number (or list element) becomes ``fill`` (a fill the column's type cannot
  hold exactly is an error) and a null list, string or binary an empty
  record. Any other type (other structs, maps, lists of strings) is an error;
  every such column is named in one message.
* Arrow IPC files (needs ``pyarrow``): a HuggingFace ``Dataset.save_to_disk``
  folder (its ``data-0000i-of-0000N.arrow`` files in the order its
  ``state.json`` lists them), an ``.arrow`` file, or a directory of them read
  in sorted order, in the stream format (what HuggingFace writes) or the file
  format. Each column becomes ``DST/<column>.zr`` exactly as a Parquet column
  does. A ``DatasetDict`` folder (``dataset_dict.json``, a folder per split)
  is refused with the splits named: convert one split at a time. A folder
  that holds ``save_to_disk`` folders is refused too, rather than stored as
  opaque files (``kind="folder"`` stores them so on purpose).
* A folder of files: one uint8 record per file in ``DST``, a
  :class:`RaggedDataset`, files in sorted order of their relative paths,
  which are kept (:attr:`RaggedDataset.names`); ``extensions=`` keeps only
  files with those extensions.
* WebDataset shards (a ``.tar`` file, or a directory of them read in sorted
  order): members are grouped into samples by key (the member's path up to
  the first dot of its file name) in shard order, and each extension becomes
  ``DST/<extension>.zr`` (a :class:`RaggedDataset` of uint8), record ``i`` of
  every store belonging to sample ``i``; the keys are kept in each store's
  names. A sample lacking an extension others have is an error naming it.
* A Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, named by
  its prefix or either file): one record per document in ``DST``, a
  :class:`RaggedDataset` of the token dtype, byte for byte
  (:mod:`zring._megatron`).
* A ``.npy`` file (:func:`zring.write_dataset`) and a loaderx store
  (:func:`zring.import_loaderx`), as before.

With ``workers=N`` a folder of many input files (``train-000NN-of-000MM.parquet``
files, HuggingFace Arrow files, tar shards, Megatron-LM partitions) becomes a
dataset of parts (:mod:`zring.parts`): each file is converted into one part,
by ``N`` worker processes at once, and the parts are committed in the files'
order, ``DST`` (a single store) or ``DST/<column>.zr`` (one per column or
extension) each a dataset of parts read as one dataset.

Names live in a ragged store of UTF-8 bytes, ``names/`` inside the store's
directory, record ``i`` naming record ``i``: read a name at a time (a billion
names are never one list in memory), and :meth:`zring.Zrecord.delete` and
``compact`` apply to them too, so they stay aligned. Stores converted by
earlier versions keep ``names.json`` (one JSON list), still read.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Iterable, Iterator

import numpy as np

from . import _megatron, _schema
from ._zrecord import NAMES_DIR, WRITE_CHUNK_BYTES, _finish, _open_for_write, _progress, _release, _target, write_dataset
from ._zring import Store, import_loaderx

def _write_names(store_dir: Path, names: Iterable[str]) -> None:
    """Writes ``names`` (streamed) as the store's names store."""
    from ._zrecord import write_ragged

    it = iter(names)
    first = next(it, None)
    if first is None:
        return

    def encoded() -> Iterator[np.ndarray]:
        yield np.frombuffer(first.encode("utf-8"), np.uint8)
        for n in it:
            yield np.frombuffer(n.encode("utf-8"), np.uint8)

    write_ragged(store_dir / NAMES_DIR, encoded(), dtype=np.uint8, codec="zstd", progress=False)


class _Sink:
    """One store being filled: fixed (``shape`` given) or ragged."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...] | None, codec: str,
                 extra: dict[str, Any] | None = None):
        self.path, self.dtype, self.shape, self.codec = path, np.dtype(dtype), shape, codec
        if shape is None:
            schema = _schema.ragged_schema(self.dtype, (), codec)
        else:
            schema = _schema.fixed_schema(self.dtype, shape, codec)
        # What the column was before it was stored (a timestamp's unit, say).
        schema.update(extra or {})
        # Written once: laid out for, and closed with, a format-2 table.
        self.store: Store = _open_for_write(path, schema, lambda _: False, "", sealable=True)
        self.records = 0

    def fixed(self, values: np.ndarray) -> None:
        """Appends ``len(values)`` records of shape ``self.shape``."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        n = len(values)
        if n:
            item = values.nbytes // n
            self.store.append_fixed(values.reshape(-1).view(np.uint8), item, self.codec)
        self.records += n

    def ragged(self, values: np.ndarray, offsets: np.ndarray) -> None:
        """Appends one record per ``offsets[i]:offsets[i + 1]`` slice of ``values``."""
        values = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64)
        n = len(offsets) - 1
        if n <= 0:
            return
        width = self.dtype.itemsize
        starts = ((offsets[:-1] - offsets[0]) * width).astype(np.uint64)
        lens = (np.diff(offsets) * width).astype(np.uint64)
        flat = values[offsets[0]:offsets[-1]].view(np.uint8) if len(values) else np.zeros(0, np.uint8)
        self.store.append(flat, starts, lens, self.codec)
        self.records += n

    def close(self, failed: bool = False) -> None:
        """Sync, seal the table in format 2 (``Store.seal``) and close; after a
        failure, close quietly (the failure is what the caller must see, not
        the poisoned writer's refusal)."""
        if failed:
            _release(self.store, True)
            return
        try:
            _finish(self.store, True)
        finally:
            self.store.close()


# --------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------

def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("converting Parquet or Arrow files needs pyarrow: pip install pyarrow") from None
    return pa, pq


def _parquet_files(src: Path) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.rglob("*.parquet") if p.is_file())
        if not files:
            raise ValueError(f"{src} holds no .parquet files")
        return files
    return [src]


class _Source:
    """How a Parquet column becomes a storable Arrow array: the storable type,
    the conversion of each chunk, what the schema records of the original,
    and, for image structs, the field whose strings name the records."""

    def __init__(self, typ: Any, convert: Any = None, extra: dict[str, Any] | None = None,
                 names: str | None = None):
        self.type, self.convert, self.extra, self.names = typ, convert or (lambda a: a), extra or {}, names


def _source(pa: Any, name: str, t: Any) -> _Source:
    """The :class:`_Source` of column ``name`` of Arrow type ``t`` (a
    ValueError naming the column and type when it has none)."""
    types = pa.types
    if types.is_timestamp(t) or types.is_duration(t) or types.is_date64(t) or types.is_time64(t):
        # Integers since the epoch (durations: counts) in the column's unit.
        unit = getattr(t, "unit", "ms")
        extra = {"arrow_type": str(t), "unit": unit}
        if getattr(t, "tz", None):
            extra["tz"] = t.tz
        return _Source(pa.int64(), lambda a: a.cast(pa.int64()), extra)
    if types.is_date32(t) or types.is_time32(t):
        return _Source(pa.int32(), lambda a: a.cast(pa.int32()),
                       {"arrow_type": str(t), "unit": getattr(t, "unit", "day")})
    if types.is_dictionary(t):
        # Categorical columns: stored as their values.
        inner = _source(pa, name, t.value_type)
        return _Source(inner.type, lambda a: inner.convert(a.dictionary_decode()), inner.extra, inner.names)
    if types.is_struct(t):
        fields = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        image = fields.get("bytes")
        if image is not None and (types.is_binary(image) or types.is_large_binary(image)):
            # HuggingFace's Image() feature: the encoded bytes, named by `path`.
            path = fields.get("path")
            names = "path" if path is not None and (types.is_string(path) or types.is_large_string(path)) else None
            return _Source(image, lambda a: a.field("bytes"), {"arrow_type": str(t)}, names)
    _plan_column(pa, name, t)  # raises, naming the column, for a type it cannot store
    return _Source(t)


def _plan_column(pa: Any, name: str, t: Any) -> tuple[str, np.dtype, tuple[int, ...] | None]:
    """(kind, dtype, item shape or None) for a column of Arrow type ``t``."""
    types = pa.types

    def numeric(x: Any) -> bool:
        return types.is_integer(x) or types.is_floating(x) or types.is_boolean(x)

    if numeric(t):
        return "scalar", np.dtype(t.to_pandas_dtype()), ()
    if types.is_fixed_size_list(t):
        shape, inner = [], t
        while types.is_fixed_size_list(inner):
            shape.append(inner.list_size)
            inner = inner.value_type
        if numeric(inner):
            return "fixed_list", np.dtype(inner.to_pandas_dtype()), tuple(shape)
    if (types.is_list(t) or types.is_large_list(t)) and numeric(t.value_type):
        return "list", np.dtype(t.value_type.to_pandas_dtype()), None
    if types.is_string(t) or types.is_large_string(t) or types.is_binary(t) or types.is_large_binary(t):
        return "bytes", np.dtype(np.uint8), None
    raise ValueError(f"column {name!r} of type {t}")


def _fill_scalar(pa: Any, fill: Any, typ: Any, name: str) -> Any:
    """``fill`` as a scalar of column ``name``'s type ``typ``, or a ValueError
    when the type cannot hold it exactly (1.5 in an int64 column, -1 or 300
    in a uint8 one): silently writing another value would corrupt the data."""
    if pa.types.is_integer(typ):
        info = np.iinfo(typ.to_pandas_dtype())
        exact = isinstance(fill, (int, np.integer)) or (isinstance(fill, (float, np.floating)) and float(fill).is_integer())
        if not exact or not info.min <= int(fill) <= info.max:
            raise ValueError(f"fill value {fill!r} does not fit column {name!r} of type {typ} "
                             f"(integers from {info.min} to {info.max})")
        return pa.scalar(int(fill), type=typ)
    if pa.types.is_floating(typ):
        if not isinstance(fill, (int, float, np.integer, np.floating)):
            raise ValueError(f"fill value {fill!r} does not fit column {name!r} of type {typ}")
        with np.errstate(over="ignore"):
            value = np.array(fill).astype(typ.to_pandas_dtype())
        if np.isfinite(fill) and not np.isfinite(value):
            raise ValueError(f"fill value {fill!r} does not fit column {name!r} of type {typ} (out of range)")
        return pa.scalar(value.item(), type=typ)
    return pa.scalar(fill, type=typ)


def _fill_nulls(pa: Any, arr: Any, name: str, fill: Any, kind: str) -> Any:
    """``arr`` without nulls (``fill`` for numbers, empty for lists/bytes), or a ValueError."""
    import pyarrow.compute as pc

    if arr.null_count == 0 and not (kind in ("list", "fixed_list") and arr.values.null_count):
        return arr
    if fill is None:
        raise ValueError(f"column {name!r} holds nulls; pass fill= to say what to write for them")
    if kind == "scalar":
        return pc.fill_null(arr, _fill_scalar(pa, fill, arr.type, name))
    if kind == "bytes":
        return pc.fill_null(arr, pa.scalar(b"" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
                                           else "", type=arr.type))
    # lists: null elements become fill, null lists become empty lists
    values = (pc.fill_null(arr.values, _fill_scalar(pa, fill, arr.type.value_type, name))
              if arr.values.null_count else arr.values)
    if kind == "fixed_list":
        if arr.null_count:
            raise ValueError(f"column {name!r} holds null fixed-size lists, which have no empty form")
        return type(arr).from_arrays(values, arr.type.list_size)
    offsets = arr.offsets
    if arr.null_count:
        # A null list's offsets already span nothing in Arrow's layout only by
        # convention; rebuild them from the filled lengths.
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
        starts = arr.offsets.to_numpy()[:-1]
        keep = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]) if len(arr) else np.zeros(0, int)
        values = values.take(pa.array(keep, type=pa.int64()))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=arr.offsets.type)
    return type(arr).from_arrays(offsets, values)


def _numpy(pa: Any, arr: Any) -> np.ndarray:
    """Arrow array ``arr`` as NumPy: an integer or float array without nulls
    straight from its buffer (no copy), others by ``to_numpy``, which imports
    pandas where it is installed (seconds, in every worker process)."""
    t = arr.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t)) and arr.null_count == 0:
        dtype = np.dtype(t.to_pandas_dtype())
        if len(arr) == 0:
            return np.zeros(0, dtype)
        return np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr))[arr.offset:]
    return arr.to_numpy(zero_copy_only=False)


def _append_column(pa: Any, sink: _Sink, arr: Any, kind: str, shape: tuple[int, ...] | None) -> None:
    if isinstance(arr, pa.ChunkedArray):
        for chunk in arr.chunks:
            _append_column(pa, sink, chunk, kind, shape)
        return
    if kind == "scalar":
        sink.fixed(_numpy(pa, arr))
    elif kind == "fixed_list":
        flat = arr.flatten()
        while pa.types.is_fixed_size_list(flat.type):
            flat = flat.flatten()
        sink.fixed(_numpy(pa, flat).reshape((len(arr), *shape)))
    elif kind == "list":
        sink.ragged(_numpy(pa, arr.values), _numpy(pa, arr.offsets))
    else:  # bytes: the data buffer with the offsets buffer
        offsets_type = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=offsets_type)[arr.offset:arr.offset + len(arr) + 1]
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        sink.ragged(data, offsets)


def _row_groups(pq: Any, files: Sequence[Path], schema: Any, names: Sequence[str]) -> Iterator[Any]:
    """The row groups of ``files`` (columns ``names``) in order, each read on
    a helper thread while the caller appends the one before: pyarrow decodes
    without the GIL, so decoding overlaps the engine's compression. At most
    two row groups are in memory."""
    from concurrent.futures import ThreadPoolExecutor

    def groups() -> Iterator[tuple[Any, int]]:
        for f in files:
            pf = pq.ParquetFile(f)
            if pf.schema_arrow.names != schema.names or any(
                    pf.schema_arrow.field(c).type != schema.field(c).type for c in names):
                raise ValueError(f"{f} has another schema than {files[0]}")
            for g in range(pf.num_row_groups):
                yield pf, g

    with ThreadPoolExecutor(1, thread_name_prefix="zring-parquet") as pool:
        pending = None
        for pf, g in groups():
            nxt = pool.submit(pf.read_row_group, g, columns=list(names))
            if pending is not None:
                yield pending.result()
            pending = nxt
        if pending is not None:
            yield pending.result()


def _plan(pa: Any, schema: Any, first: Path, columns: Sequence[str] | None) -> tuple[list[str], dict[str, _Source], dict[str, Any]]:
    """The columns to convert of a source whose Arrow schema is ``schema``
    (read from ``first``), with each one's :class:`_Source` and plan; a
    ValueError naming every column that cannot be stored."""
    names = list(columns) if columns else list(schema.names)
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise ValueError(f"{first} has no column(s) {missing}; it has {schema.names}")
    sources: dict[str, _Source] = {}
    plans = {}
    unmappable = []
    for c in names:
        try:
            sources[c] = _source(pa, c, schema.field(c).type)
            plans[c] = _plan_column(pa, c, sources[c].type)
        except ValueError as e:
            unmappable.append(str(e))
    if unmappable:
        # Every one, not the first: a user fixes them in one go.
        raise ValueError(
            f"cannot map {', '.join(unmappable)} to a zring store (numbers, timestamps and dates, fixed-size "
            f"lists of numbers, lists of numbers, strings, binary, dictionary (categorical) columns of those, "
            f"and image structs of bytes and path are supported); leave them out with columns="
        )
    return names, sources, plans


def _convert_columns(pa: Any, src: Path, dst: Path, sources: dict[str, _Source], plans: dict[str, Any],
                     tables: Iterable[Any], total: int, fill: Any, codec: str, progress: bool | None) -> dict[str, int]:
    """Appends each column of every table of ``tables`` (in order) to its
    store ``DST/<column>.zr``: what Parquet and Arrow sources share."""
    bar = _progress(total, f"convert {src.name}", progress)
    sinks: dict[str, _Sink] = {}
    named: dict[str, _Sink] = {}  # image columns: their records' names, from `path`
    ok = False
    try:
        for c, (kind, dt, shape) in plans.items():
            sinks[c] = _Sink(dst / f"{c}.zr", dt, None if kind in ("list", "bytes") else shape, codec,
                             sources[c].extra)
            if sources[c].names:
                named[c] = _Sink(dst / f"{c}.zr" / NAMES_DIR, np.dtype(np.uint8), None, "zstd")
        for table in tables:
            for c, (kind, _, shape) in plans.items():
                for chunk in table.column(c).chunks:
                    if c in named:
                        paths = chunk.field(sources[c].names)
                        _append_column(pa, named[c], _fill_nulls(pa, paths, c, "", "bytes"), "bytes", None)
                    arr = sources[c].convert(chunk)
                    _append_column(pa, sinks[c], _fill_nulls(pa, arr, c, fill, kind), kind, shape)
            if bar is not None:
                bar.update(table.num_rows)
        ok = True
    finally:
        if bar is not None:
            bar.close()
        for s in [*sinks.values(), *named.values()]:
            s.close(failed=not ok)
    return {c: s.records for c, s in sinks.items()}


def _convert_parquet(src: Path, dst: Path, columns: Sequence[str] | None, fill: Any, codec: str,
                     progress: bool | None) -> dict[str, int]:
    pa, pq = _pyarrow()
    files = _parquet_files(src)
    schema = pq.ParquetFile(files[0]).schema_arrow
    names, sources, plans = _plan(pa, schema, files[0], columns)
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return _convert_columns(pa, src, dst, sources, plans, _row_groups(pq, files, schema, names), total, fill,
                            codec, progress)


# --------------------------------------------------------------------------
# Arrow IPC files (HuggingFace save_to_disk folders)
# --------------------------------------------------------------------------

#: What HuggingFace's ``Dataset.save_to_disk`` writes beside its Arrow files.
HF_STATE = "state.json"
HF_INFO = "dataset_info.json"
#: What ``DatasetDict.save_to_disk`` writes beside one folder per split.
HF_DICT = "dataset_dict.json"


def _is_hf_dataset(d: Path) -> bool:
    """Whether directory ``d`` is a HuggingFace ``save_to_disk`` folder of one split."""
    return (d / HF_STATE).is_file() and (d / HF_INFO).is_file()


def _arrow_files(src: Path) -> list[Path]:
    """The Arrow IPC files of ``src`` in row order: a file; a ``save_to_disk``
    folder's data files in the order its ``state.json`` lists them (sorted
    ``*.arrow`` names when it lists none); or a directory's ``*.arrow`` files
    in sorted order."""
    if not src.is_dir():
        return [src]
    listed: list[Path] = []
    if (src / HF_STATE).is_file():
        try:
            state = json.loads((src / HF_STATE).read_text(encoding="utf-8"))
            listed = [src / f["filename"] for f in state.get("_data_files", [])]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{src / HF_STATE} is not the state.json of a HuggingFace save_to_disk folder "
                             f"({type(e).__name__}: {e})") from None
        absent = [str(p) for p in listed if not p.is_file()]
        if absent:
            raise ValueError(f"{src / HF_STATE} lists data files that are missing: {absent}")
    files = listed or sorted(p for p in src.rglob("*.arrow") if p.is_file())
    if not files:
        raise ValueError(f"{src} holds no .arrow files")
    return files


def _ipc_reader(pa: Any, f: Path) -> Any:
    """A reader of Arrow IPC file ``f``: the stream format (what HuggingFace
    writes) or the file format, memory-mapped so batches are read without
    copies; a ValueError naming ``f`` when it is neither."""
    import pyarrow.ipc as ipc

    source = pa.memory_map(str(f))
    try:
        try:
            return ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            return ipc.open_file(source)
    except pa.ArrowInvalid as e:
        source.close()
        raise ValueError(f"{f} is not an Arrow IPC stream or file ({e})") from None


def _ipc_batches(pa: Any, f: Path) -> Iterator[Any]:
    """The record batches of Arrow IPC file ``f``, in order."""
    reader = _ipc_reader(pa, f)
    try:
        if hasattr(reader, "get_batch"):  # the file format
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
        else:
            yield from reader
    except (pa.ArrowInvalid, OSError) as e:
        # A file cut short (a copy interrupted; pyarrow reports a short
        # message body as an OSError): name it among the shards.
        raise ValueError(f"{f}: not a complete Arrow IPC file ({e}); nothing was written") from e


def _arrow_tables(pa: Any, files: Sequence[Path], schema: Any, names: Sequence[str],
                  block_bytes: int) -> Iterator[Any]:
    """Tables of about ``block_bytes`` (columns ``names``, one chunk each)
    from the record batches of ``files`` in order. HuggingFace writes batches
    of 1,000 rows; gathering them makes each append big enough to spread its
    compression over every core."""
    block: list[Any] = []
    size = 0
    for f in files:
        for batch in _ipc_batches(pa, f):
            if batch.schema.names != schema.names or any(
                    batch.schema.field(c).type != schema.field(c).type for c in names):
                raise ValueError(f"{f} has another schema than {files[0]}")
            batch = batch.select(list(names))
            block.append(batch)
            size += batch.nbytes
            if size >= block_bytes:
                yield pa.Table.from_batches(block).combine_chunks()
                block, size = [], 0
    if block:
        yield pa.Table.from_batches(block).combine_chunks()


def _convert_arrow(src: Path, dst: Path, columns: Sequence[str] | None, fill: Any, codec: str, block_bytes: int,
                   progress: bool | None) -> dict[str, int]:
    pa, _ = _pyarrow()
    files = _arrow_files(src)
    schema = _ipc_reader(pa, files[0]).schema
    names, sources, plans = _plan(pa, schema, files[0], columns)
    # Memory-mapped: counting rows reads message headers, not the data.
    total = sum(b.num_rows for f in files for b in _ipc_batches(pa, f))
    return _convert_columns(pa, src, dst, sources, plans, _arrow_tables(pa, files, schema, names, block_bytes),
                            total, fill, codec, progress)


# --------------------------------------------------------------------------
# Folders and tar shards
# --------------------------------------------------------------------------

def _bytes_records(sink: _Sink, items: Iterable[bytes], block_bytes: int) -> None:
    """Appends each item as one uint8 record, in blocks of about ``block_bytes``."""
    block: list[bytes] = []
    size = 0

    def flush() -> None:
        nonlocal block, size
        if not block:
            return
        lens = np.array([len(b) for b in block], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        sink.ragged(np.frombuffer(b"".join(block), dtype=np.uint8), offsets)
        block, size = [], 0

    for b in items:
        block.append(b)
        size += len(b)
        if size >= block_bytes:
            flush()
    flush()


def _convert_folder(src: Path, dst: Path, extensions: Sequence[str] | None, codec: str, block_bytes: int,
                    progress: bool | None) -> dict[str, int]:
    wanted = {e.lower().lstrip(".") for e in extensions} if extensions else None
    rels = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in files:
            if wanted is None or f.rsplit(".", 1)[-1].lower() in wanted and "." in f:
                rels.append(os.path.relpath(os.path.join(root, f), src))
    rels.sort()
    if not rels:
        raise ValueError(f"{src} holds no files" + (f" with extensions {sorted(wanted)}" if wanted else ""))
    bar = _progress(len(rels), f"convert {src.name}", progress)
    sink = _Sink(dst, np.dtype(np.uint8), None, codec)
    ok = False
    try:
        def read() -> Iterator[bytes]:
            for r in rels:
                yield (src / r).read_bytes()
                if bar is not None:
                    bar.update(1)
        _bytes_records(sink, read(), block_bytes)
        ok = True
    finally:
        if bar is not None:
            bar.close()
        sink.close(failed=not ok)
    _write_names(dst, [r.replace(os.sep, "/") for r in rels])
    return {"": sink.records}


def _tar_files(src: Path) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.rglob("*.tar") if p.is_file())
        if not files:
            raise ValueError(f"{src} holds no .tar shards")
        return files
    return [src]


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's split of a member name: key up to the first dot of the
    file name, extension after it."""
    head, _, base = name.rpartition("/")
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return (f"{head}/{stem}" if head else stem), ext


def _samples(shards: Sequence[Path]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample, in shard order."""
    for shard in shards:
        key, sample = None, {}
        try:
            with tarfile.open(shard, mode="r|*") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    k, ext = _split_key(m.name)
                    if not ext:
                        raise ValueError(f"{shard}: member {m.name!r} has no extension, so no store to go to")
                    if k != key:
                        if key is not None:
                            yield key, sample
                        key, sample = k, {}
                    if ext in sample:
                        raise ValueError(f"{shard}: sample {k!r} has two {ext!r} members")
                    f = tf.extractfile(m)
                    sample[ext] = f.read() if f is not None else b""
        except (tarfile.TarError, EOFError) as e:
            # A shard cut short (a copy interrupted) or not a tar file: name it,
            # among the hundreds a dataset may have.
            raise ValueError(f"{shard}: not a complete tar shard ({e}); nothing was written") from e
        if key is not None:
            yield key, sample


def _convert_tar(src: Path, dst: Path, codec: str, block_bytes: int, progress: bool | None) -> dict[str, int]:
    shards = _tar_files(src)
    bar = _progress(0, f"convert {src.name}", progress)
    sinks: dict[str, _Sink] = {}
    keys: list[str] = []
    blocks: dict[str, list[bytes]] = {}
    size = 0

    def flush() -> None:
        nonlocal size
        for ext, items in blocks.items():
            _bytes_records(sinks[ext], items, block_bytes)
            items.clear()
        size = 0

    ok = False
    try:
        for key, sample in _samples(shards):
            if not sinks:
                for ext in sorted(sample):
                    if not ext.replace(".", "").replace("_", "").replace("-", "").isalnum():
                        raise ValueError(f"extension {ext!r} of sample {key!r} cannot name a store")
                    sinks[ext] = _Sink(dst / f"{ext}.zr", np.dtype(np.uint8), None, codec)
                    blocks[ext] = []
            if sample.keys() != sinks.keys():
                raise ValueError(
                    f"sample {key!r} has members {sorted(sample)}, the first sample had {sorted(sinks)}: "
                    "every sample needs the same extensions"
                )
            for ext, b in sample.items():
                blocks[ext].append(b)
                size += len(b)
            keys.append(key)
            if bar is not None:
                bar.update(1)
            if size >= block_bytes:
                flush()
        if not sinks:
            raise ValueError(f"{src} holds no samples")
        flush()
        ok = True
    finally:
        if bar is not None:
            bar.close()
        for s in sinks.values():
            s.close(failed=not ok)
    for ext in sinks:
        _write_names(dst / f"{ext}.zr", keys)
    return {ext: s.records for ext, s in sinks.items()}


# --------------------------------------------------------------------------
# One part per input file (workers=)
# --------------------------------------------------------------------------

def _megatron_prefixes(src: Path) -> list[Path]:
    """The prefixes of the Megatron-LM datasets (``PREFIX.bin`` + ``PREFIX.idx``)
    in directory ``src`` (its partitions), in sorted order; ``[]`` when it
    holds anything else."""
    files = [p for p in src.rglob("*") if p.is_file()]
    if not files or any(p.suffix.lower() not in (".bin", ".idx") for p in files):
        return []
    prefixes = sorted({p.with_suffix("") for p in files})
    if any(_megatron.paths(p) is None for p in prefixes):
        return []
    return prefixes


def _input_files(src: Path, kind: str) -> list[Path]:
    """The input files of ``src``, one part each, in order."""
    if kind == "parquet":
        return _parquet_files(src)
    if kind == "arrow":
        return _arrow_files(src)
    if kind == "tar":
        return _tar_files(src)
    if kind == "megatron":
        return _megatron_prefixes(src) if src.is_dir() else [src]
    raise ValueError(
        f"workers= writes one part per input file of Parquet, Arrow, tar or Megatron-LM files; {src} is a "
        f"{kind} source, which converts into one store: leave workers= out"
    )


def _convert_file(kind: str, src: str, where: str, columns: Sequence[str] | None, fill: Any, codec: str,
                  block_bytes: int) -> dict[str, tuple[Any, str | None]]:
    """Converts input file ``src`` as :func:`convert` would, then stages each
    of its stores as a part of its dataset under ``where`` (``where`` itself
    for a single store, ``where/<column>.zr`` per column); returns
    ``{column: (PartInfo, schema)}``. Runs in a worker process."""
    from . import parts

    import shutil
    import uuid

    root, file = Path(where), Path(src)
    work = root / f".convert-{uuid.uuid4().hex}"
    work.mkdir()
    try:
        out = work / "out"
        if kind == "parquet":
            counts = _convert_parquet(file, out, columns, fill, codec, False)
        elif kind == "arrow":
            counts = _convert_arrow(file, out, columns, fill, codec, block_bytes, False)
        elif kind == "tar":
            counts = _convert_tar(file, out, codec, block_bytes, False)
        else:
            counts = _megatron.convert(file, out, codec, block_bytes, False, _Sink, _progress, counts=False)
        staged = {}
        for name in counts:
            if name:
                staged[name] = parts._stage(root / f"{name}.zr", out / f"{name}.zr")
            else:
                staged[name] = parts._stage(root, out)
        return staged
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops handing out files and
    removes what was written (one traceback, not one per worker)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _convert_parts(kind: str, src: Path, where: Path, workers: int, columns: Sequence[str] | None, fill: Any,
                   codec: str, block_bytes: int, progress: bool | None) -> dict[str, int]:
    """One part per input file of ``src``, converted by ``workers`` processes
    (this one when 1) and committed, in the files' order, as a dataset of
    parts per store (module docs)."""
    from . import parts

    files = _input_files(src, kind)
    args = (columns, fill, codec, block_bytes)
    bar = _progress(len(files), f"convert {src.name}", progress)
    results: list[dict[str, tuple[Any, str | None]]] = []
    try:
        if workers == 1:
            for f in files:
                results.append(_convert_file(kind, str(f), str(where), columns, fill, codec, block_bytes))
                if bar is not None:
                    bar.update(1)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # Spawned, not forked: the parent may hold pyarrow's and the
            # engine's threads.
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(min(workers, len(files)), mp_context=ctx, initializer=_ignore_sigint) as pool:
                futures = [pool.submit(_convert_file, kind, str(f), str(where), *args) for f in files]
                try:
                    for fut in futures:
                        results.append(fut.result())
                        if bar is not None:
                            bar.update(1)
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
    finally:
        if bar is not None:
            bar.close()
    first = results[0]
    for f, r in zip(files, results):
        if r.keys() != first.keys():
            raise ValueError(f"{f} converts into stores {sorted(r)}, {files[0]} into {sorted(first)}: every input "
                             f"file needs the same columns")
        for name, (_info, schema) in r.items():
            if schema != first[name][1]:
                raise ValueError(f"{f} has another schema than {files[0]}" + (f" (column {name!r})" if name else ""))
    counts = {}
    for name in first:
        root = where / f"{name}.zr" if name else where
        infos = [r[name][0] for r in results]
        parts.commit(root, infos, mode="overwrite")
        counts[name] = sum(i.records for i in infos)
    return counts


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

#: The kinds of source :func:`convert` reads.
KINDS = ("parquet", "arrow", "folder", "tar", "npy", "loaderx", "megatron")


def _hf_folders(src: Path) -> list[Path]:
    """The HuggingFace ``save_to_disk`` folders (of a split, or of a
    ``DatasetDict``) at or under ``src``."""
    found = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        if HF_DICT in files or (HF_STATE in files and HF_INFO in files):
            found.append(Path(root))
    return found


def _kind(src: Path) -> str:
    if _megatron.paths(src) is not None:
        return "megatron"
    half = _megatron.describe(src)
    if half:
        raise ValueError(half)
    if src.is_file():
        suffix = src.suffix.lower()
        if suffix == ".npy":
            return "npy"
        if suffix == ".parquet":
            return "parquet"
        if suffix == ".tar":
            return "tar"
        if suffix == ".arrow":
            return "arrow"
        raise ValueError(f"cannot convert {src}: expected a .npy, .parquet, .arrow or .tar file, or a directory")
    if src.is_dir():
        if (src / "meta.zr").is_file():
            return "loaderx"
        if (src / HF_DICT).is_file():
            splits = sorted(p.name for p in src.iterdir() if p.is_dir() and _is_hf_dataset(p))
            raise ValueError(
                f"{src} is a HuggingFace DatasetDict saved with save_to_disk (splits {splits}); convert one "
                f"split's folder at a time, such as {src / (splits[0] if splits else 'train')}"
            )
        if _is_hf_dataset(src):
            return "arrow"
        entries = [p for p in src.rglob("*") if p.is_file()]
        if _megatron_prefixes(src):
            return "megatron"
        if entries and all(p.suffix.lower() == ".parquet" for p in entries):
            return "parquet"
        if entries and all(p.suffix.lower() == ".tar" for p in entries):
            return "tar"
        if entries and all(p.suffix.lower() == ".arrow" for p in entries):
            return "arrow"
        nested = _hf_folders(src)
        if nested:
            # Its Arrow files stored as opaque byte records would convert
            # "successfully" into something no one can read as the dataset.
            raise ValueError(
                f"{src} holds HuggingFace save_to_disk folders ({', '.join(str(p) for p in nested[:3])}"
                f"{', ...' if len(nested) > 3 else ''}); convert each of them, or pass kind='folder' to store "
                f"every file as a byte record"
            )
        return "folder"
    raise FileNotFoundError(f"{src} does not exist")


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, columns: Sequence[str] | None = None,
            fill: Any = None, extensions: Sequence[str] | None = None, codec: str = "zstd",
            kind: str | None = None, overwrite: bool = False, block_bytes: int = WRITE_CHUNK_BYTES,
            progress: bool | None = None, workers: int | None = None) -> dict[str, int]:
    """Converts ``src`` into zring stores at ``dst`` (module docs); returns
    the records written per store (``""`` for a single store at ``dst``).

    Args:
        src: A ``.parquet`` file or a directory of them, a HuggingFace
            ``save_to_disk`` folder or ``.arrow`` (Arrow IPC) files, a folder
            of files, a ``.tar`` shard or a directory of them, a ``.npy``
            file, a loaderx store, or a Megatron-LM indexed dataset (its
            prefix, or its ``.idx`` or ``.bin`` file). ``kind`` overrides the
            guess (``"parquet"``, ``"arrow"``, ``"folder"``, ``"tar"``,
            ``"npy"``, ``"loaderx"``, ``"megatron"``).
        dst: The store (``.npy``, loaderx, folder, Megatron) or the directory of stores
            (Parquet and Arrow: one per column; tar: one per extension) to
            create.
        columns: Parquet or Arrow columns to convert (default: all).
        fill: What a null becomes (default: a null is an error); a value the
            column's type cannot hold exactly (1.5 in an integer column, -1 in
            an unsigned one) is a ValueError.
        extensions: Folder files to keep, by extension (default: all).
        codec: ``"zstd"`` (default), ``"raw"`` or ``"zstd_dict"`` is not
            offered here (a dictionary needs a sample of the whole column).
        overwrite: Replace an existing ``dst``.
        block_bytes: Bytes handed to one append (folders, tar, Arrow).
        progress: Show a tqdm bar; by default only when stderr is a terminal.
        workers: Write one part per input file (a Parquet, Arrow or tar
            file, or a Megatron-LM dataset of a folder of them, such as
            ``train-000NN-of-000MM.parquet`` files or Megatron partitions),
            converted by this many worker processes, and commit them in the
            files' order: ``dst`` (or ``dst/<column>.zr`` per column) is then
            a dataset of parts (:mod:`zring.parts`), read as one dataset by
            :class:`Dataset` and :class:`RaggedDataset`. Every file must
            convert into the same columns of the same dtypes and shapes.
            Default: one store, the files converted in order by this process.

    Raises:
        FileExistsError: ``dst`` exists and ``overwrite`` is not set, or it
            is set and ``dst`` is not a store, a directory of stores or an
            empty directory (nothing is removed).
        ValueError: A column or member that cannot be mapped, a null without
            ``fill``, a sample missing an extension, an unknown ``kind``, a
            HuggingFace ``DatasetDict`` folder (convert one split's folder) or
            a folder holding ``save_to_disk`` folders (unless
            ``kind="folder"``).
        ImportError: A Parquet or Arrow source without pyarrow installed.
    """
    src, dst = Path(src), Path(dst)
    if codec not in ("zstd", "raw"):
        raise ValueError(f"codec must be 'zstd' or 'raw' for convert, got {codec!r}")
    if int(block_bytes) <= 0:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    kind = kind or _kind(src)
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers= must be a positive number of processes, got {workers!r}")
    if kind == "megatron" and workers is None and src.is_dir():
        found = _megatron_prefixes(src)
        raise ValueError(
            f"{src} holds {len(found)} Megatron-LM datasets (partitions); pass workers=N to write one part "
            f"per dataset, or convert one prefix, such as {found[0] if found else src / 'PREFIX'}"
        )
    if workers is not None:
        _input_files(src, kind)  # a ValueError for a kind that is not in files
        if os.path.lexists(dst) and not overwrite:
            raise FileExistsError(f"{dst} already exists; pass overwrite=True to replace it")
        with _target(dst, overwrite, False) as where:
            return _convert_parts(kind, src, where, int(workers), columns, fill, codec, int(block_bytes), progress)
    if os.path.lexists(dst) and not overwrite:
        # Said here rather than by the writers convert builds on, whose
        # message offers an append convert does not have.
        raise FileExistsError(f"{dst} already exists; pass overwrite=True to replace it")
    if kind == "npy":
        n = write_dataset(dst, np.load(src, mmap_mode="r"), codec=codec, overwrite=overwrite, progress=progress)
        return {"": n}
    with _target(dst, overwrite, False) as where:
        if kind == "loaderx":
            # Built in the (empty) staging directory, which the engine holds
            # by descriptor.
            stats = import_loaderx(str(src), str(where))
            return {"": int(stats["records"])}
        if kind == "parquet":
            return _convert_parquet(src, where, columns, fill, codec, progress)
        if kind == "arrow":
            return _convert_arrow(src, where, columns, fill, codec, int(block_bytes), progress)
        if kind == "folder":
            return _convert_folder(src, where, extensions, codec, int(block_bytes), progress)
        if kind == "megatron":
            return _megatron.convert(src, where, codec, int(block_bytes), progress, _Sink, _progress)
        return _convert_tar(src, where, codec, int(block_bytes), progress)
