"""The ``schema.json`` a dataset store carries: per-sample dtype and shape.

The file has the same fields as loaderx writes (``format``, ``version``,
``dtype``, ``shape`` or ``ragged``/``item_shape``, ``codec``), so a store
written by either library describes itself the same way. ``dtype`` holds
NumPy's ``dtype.str`` (byte order, kind, size: ``"<f4"``).

``dtype.str`` alone does not name every fixed-size dtype: ml_dtypes types
such as bfloat16 and structured dtypes all collapse to a void code like
``"<V2"``. For those the schema carries one more field that readers which do
not know it can ignore: ``dtype_name`` (``"bfloat16"``, resolved through
ml_dtypes when it is installed) or ``dtype_descr`` (``dtype.descr`` of a
structured dtype). A reader that lacks ml_dtypes still opens the store and
sees the raw void bytes' size correctly only if it asks for them; zring
raises a clear TypeError instead of guessing.

The engine stores the file with a CRC-32C (a ``"crc32c"`` member it adds on
write and checks and removes on read; files written before it have none),
so a flipped bit is a :class:`CorruptError` naming the file. :func:`loads`
checks the fields themselves: anything else wrong with them is a
:class:`CorruptError` naming the file too, never a bare ``KeyError``.
Files without the checksum (zring 0.1.0's, loaderx's) are still read, and
:func:`check_records` checks every schema against the store's records
before a reader sizes anything from it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ._zring import CorruptError

SCHEMA = "schema.json"
FORMAT = "loaderx-zrecord"
VERSION = 1
CODECS = ("raw", "zstd", "zstd_dict")


def check_level(level: Any, codec: str) -> int | None:
    """Return ``level`` (None or a zstd level for codec ``"zstd"``), else raise ValueError."""
    if level is None:
        return None
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not -131072 <= int(level) <= 22:
        raise ValueError(f"level must be a zstd level, an int from -131072 to 22 (default 3), got {level!r}")
    if codec != "zstd":
        raise ValueError(f"level applies to codec \"zstd\" only, not {codec!r}: leave level=None")
    return int(level)


def check_codec(codec: Any) -> str:
    """Return ``codec`` if it names a codec, else raise ValueError."""
    if not isinstance(codec, str) or codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}, expected one of {sorted(CODECS)}")
    return codec


def _ml_dtypes():
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 & co. with NumPy)
    except ImportError:
        return None
    return ml_dtypes


def check_dtype(dtype: Any) -> np.dtype:
    """Normalise ``dtype`` and reject the ones a record cannot hold."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        # "bfloat16" and friends only resolve after ml_dtypes is imported.
        if isinstance(dtype, str) and _ml_dtypes() is not None:
            dt = np.dtype(dtype)
        else:
            raise TypeError(f"{dtype!r} is not a NumPy dtype: {exc}") from None
    if dt.hasobject:
        raise TypeError(
            f"dtype {dt} holds Python objects; a record stores fixed-size values only "
            "(bool, integers, floats, complex, bytes/str, datetimes, structured, ml_dtypes)"
        )
    if dt.itemsize == 0:
        raise TypeError(f"dtype {dt!r} has no fixed size; give a size such as 'S8' or '<U4'")
    return dt


def encode_dtype(dt: np.dtype) -> dict[str, Any]:
    """The schema fields that name ``dt`` (``dtype`` plus a hint when needed)."""
    fields: dict[str, Any] = {"dtype": dt.str}
    try:
        if np.dtype(dt.str) == dt:
            return fields
    except TypeError:  # e.g. float8_e5m2 reports "<f1", which NumPy cannot parse
        pass
    if dt.names is not None:
        fields["dtype_descr"] = dt.descr
    else:
        # An extension dtype (ml_dtypes): its name is what resolves it again.
        fields["dtype_name"] = dt.name
    return fields


def _descr(obj: Any) -> Any:
    # JSON turns dtype.descr's tuples into lists; np.dtype wants tuples back.
    if isinstance(obj, list):
        return [tuple(_descr(x) for x in item) if isinstance(item, list) else item for item in obj]
    return obj


def decode_dtype(schema: dict[str, Any]) -> np.dtype:
    """Invert :func:`encode_dtype`."""
    if "dtype_descr" in schema:
        return np.dtype(_descr(schema["dtype_descr"]))
    name = schema.get("dtype_name")
    if name is not None:
        if _ml_dtypes() is None:
            raise TypeError(
                f"this store holds {name} values; install ml_dtypes to read them"
            )
        return np.dtype(name)
    return np.dtype(schema["dtype"])


def fixed_schema(dt: np.dtype, shape: tuple[int, ...], codec: str) -> dict[str, Any]:
    """The schema of a fixed-shape dataset."""
    return {
        "format": FORMAT,
        "version": VERSION,
        **encode_dtype(dt),
        "shape": list(shape),
        "codec": codec,
    }


def ragged_schema(dt: np.dtype, item_shape: tuple[int, ...], codec: str) -> dict[str, Any]:
    """The schema of a ragged dataset."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "ragged": True,
        **encode_dtype(dt),
        "item_shape": list(item_shape),
        "codec": codec,
    }


def dumps(schema: dict[str, Any]) -> str:
    """Serialise a schema the way it is stored on disk."""
    return json.dumps(schema, indent=2) + "\n"


def _dims(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                           for d in value)


#: The largest record the engine stores (lengths are 32-bit).
MAX_RECORD_BYTES = (1 << 32) - 1


def check_records(schema: dict[str, Any], dt: np.dtype, first_len: int | None, where: str) -> int:
    """The bytes of one sample (or of one row of a ragged record) that
    ``schema`` describes, checked against the records before anything is
    sized from it: a sample never exceeds the largest record, and a store's
    first record (``first_len``; ``None`` for an empty store) holds one sample
    (a whole number of rows). ``schema.json`` files written before it had a
    checksum, or by loaderx, carry none, so a damaged ``shape`` (``[2**40]``)
    is caught here, as a :class:`CorruptError` naming the file, instead of
    sizing a 4 TiB buffer."""
    ragged = bool(schema.get("ragged"))
    dims = schema["item_shape" if ragged else "shape"]
    size = math.prod(dims) * dt.itemsize  # Python ints: no wrap at 2**63
    what = "a row" if ragged else "a sample"

    def bad(why: str) -> CorruptError:
        return CorruptError(f"corrupted store: {where}: {why}; restore the file from a copy of the store")

    if size > MAX_RECORD_BYTES:
        raise bad(f"{what} of {dt} and shape {tuple(dims)} takes {size} bytes, more than a record holds "
                  f"({MAX_RECORD_BYTES})")
    if first_len is not None:
        if not ragged and first_len != size:
            raise bad(f"its {dt} samples of shape {tuple(dims)} take {size} bytes, but the store's records "
                      f"are {first_len} bytes")
        if ragged and (first_len % size if size else first_len):
            raise bad(f"its rows of {dt} and shape {tuple(dims)} take {size} bytes, which does not divide "
                      f"the store's first record ({first_len} bytes)")
    return size


def loads(text: str, where: str) -> dict[str, Any]:
    """Parse and check a stored schema; anything wrong with it is a
    :class:`CorruptError` naming ``where`` (the file)."""
    def bad(why: str) -> CorruptError:
        return CorruptError(f"corrupted store: {where}: {why}; restore the file from a copy of the store")

    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(schema, dict) or schema.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} schema (a JSON object with \"format\": \"{FORMAT}\")")
    ragged = schema.get("ragged", False)
    if not isinstance(ragged, bool):
        raise bad(f"\"ragged\" is {ragged!r}, not true or false")
    dims = "item_shape" if ragged else "shape"
    if not _dims(schema.get(dims)):
        raise bad(f"\"{dims}\" is {schema.get(dims)!r}, not a list of non-negative integers")
    if "codec" in schema and schema["codec"] not in CODECS:
        raise bad(f"\"codec\" is {schema['codec']!r}, not one of {list(CODECS)}")
    for key, kind in (("dtype", str), ("dtype_name", str), ("dtype_descr", list)):
        if key in schema and not isinstance(schema[key], kind):
            raise bad(f"\"{key}\" is {schema[key]!r}, not a {kind.__name__}")
    if not any(k in schema for k in ("dtype", "dtype_name", "dtype_descr")):
        raise bad("it names no dtype (\"dtype\")")
    if schema.get("dtype_name") is None or _ml_dtypes() is not None:
        # Without ml_dtypes an extension dtype cannot be checked here:
        # decode_dtype says to install it.
        try:
            decode_dtype(schema)
        except (TypeError, ValueError) as exc:
            raise bad(f"its dtype does not resolve ({exc})") from None
    return schema
