"""Parquet sources for :func:`zring.convert`: each Arrow column's storable
type and conversion (shared with the Arrow IPC importer), its nulls and
fills, and the row groups read and appended a block at a time."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence
from typing import Any, Iterable, Iterator

import numpy as np

from ._zrecord import NAMES_DIR, _progress
from ._sink import _Sink


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
                     tables: Iterable[Any], total: int, fill: Any, codec: str, progress: bool | None,
                     cast: np.dtype | None = None) -> dict[str, int]:
    """Appends each column of every table of ``tables`` (in order) to its
    store ``DST/<column>.zr``: what Parquet and Arrow sources share."""
    bar = _progress(total, f"convert {src.name}", progress)
    sinks: dict[str, _Sink] = {}
    named: dict[str, _Sink] = {}  # image columns: their records' names, from `path`
    ok = False
    try:
        for c, (kind, dt, shape) in plans.items():
            numeric = kind != "bytes"
            sinks[c] = _Sink(dst / f"{c}.zr", dt, None if kind in ("list", "bytes") else shape, codec,
                             sources[c].extra, cast if numeric else None, f"column {c!r} of {src}")
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
                     progress: bool | None, cast: np.dtype | None = None) -> dict[str, int]:
    pa, pq = _pyarrow()
    files = _parquet_files(src)
    schema = pq.ParquetFile(files[0]).schema_arrow
    names, sources, plans = _plan(pa, schema, files[0], columns)
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return _convert_columns(pa, src, dst, sources, plans, _row_groups(pq, files, schema, names), total, fill,
                            codec, progress, cast)
