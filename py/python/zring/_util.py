"""Argument conversion shared by the Python layer (no I/O here)."""

from __future__ import annotations

import math
import operator
from typing import Any, TypeVar

import numpy as np


def as_bytes(array: np.ndarray, name: str) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array, without copying.

    Raises ValueError when ``array`` is not C-contiguous: the caller asked for
    in-place I/O, and a silent copy would lose the result.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    return array.reshape(-1).view(np.uint8)


def as_writable_bytes(array: np.ndarray, name: str) -> np.ndarray:
    """Like :func:`as_bytes`, and the array must be writable."""
    flat = as_bytes(array, name)
    if not array.flags.writeable:
        raise ValueError(f"{name} is read-only; pass a writable array")
    return flat


def as_u64(values: Any, name: str) -> np.ndarray:
    """A contiguous uint64 array of non-negative integers from any int sequence."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and (arr < 0).any():
        raise ValueError(f"{name} must be non-negative, got {int(arr.min())}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.uint64)


def _cannot_hold(what: str, value: Any, dt: np.dtype, why: str) -> ValueError:
    value = value.item() if isinstance(value, np.generic) else value
    return ValueError(f"{what} holds {value!r}, which {dt} cannot hold ({why}); "
                      f"pass a dtype that holds every value, or convert the values first")


def as_dtype(values: Any, dt: np.dtype, what: str) -> np.ndarray:
    """``values`` as a C-contiguous array of ``dt``, or a ValueError naming a
    value ``dt`` cannot hold and ``dt``: NumPy's cast would store 70000 as
    4464 in uint16, 2**40 as 0 in int32 and 1e300 as inf in float32.

    Integers and booleans must lie in the dtype's range, floats bound for
    integers must be whole and finite as well, numbers bound for floats must
    not overflow to infinity (rounding to the nearest float is what floats
    do), complex numbers bound for reals must have no imaginary part, and
    strings must fit the width. The checks are NumPy reductions over the
    whole array (its minimum and maximum where that decides), never a
    Python loop per element. Other casts are NumPy's.
    """
    try:
        src = np.asarray(values)
    except OverflowError as e:
        raise ValueError(f"{what} holds a value {dt} cannot hold ({e})") from None
    if src.dtype == dt or src.size == 0 or np.can_cast(src.dtype, dt, "safe"):
        return np.ascontiguousarray(src, dtype=dt)
    if src.dtype.hasobject:
        # Python integers too large for any NumPy integer, say.
        try:
            return np.ascontiguousarray(src, dtype=dt)
        except (OverflowError, TypeError, ValueError) as e:
            raise ValueError(f"{what} holds a value {dt} cannot hold ({e})") from None
    kind, to = src.dtype.kind, dt.kind
    if kind == "c" and to != "c":
        imaginary = src.imag != 0
        if imaginary.any():
            raise _cannot_hold(what, src[imaginary].flat[0], dt, "it has an imaginary part")
        src, kind = src.real, src.real.dtype.kind
    if to in "biu" and kind in "biuf":
        if kind == "f":
            finite = np.isfinite(src)
            if not finite.all():
                raise _cannot_hold(what, src[~finite].flat[0], dt, "not a finite number")
            fraction = src != np.trunc(src)
            if fraction.any():
                raise _cannot_hold(what, src[fraction].flat[0], dt, "not a whole number")
        low, high = (0, 1) if to == "b" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
        for v in (src.min(), src.max()):
            if not low <= v.item() <= high:
                raise _cannot_hold(what, v, dt, f"{dt} holds {low} to {high}")
    elif to in "fc" and kind in "biufc":
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.ascontiguousarray(src, dtype=dt)
        overflowed = np.isinf(out) & ~np.isinf(src)
        if overflowed.any():
            raise _cannot_hold(what, src[overflowed].flat[0], dt, f"beyond {dt}'s largest, {np.finfo(dt).max}")
        return out
    elif to in "SU" and kind in "SU":
        width = dt.itemsize // (4 if to == "U" else 1)
        lengths = np.char.str_len(src)
        if lengths.max() > width:
            raise _cannot_hold(what, src.flat[int(lengths.argmax())], dt, f"longer than {width} characters")
    return np.ascontiguousarray(src, dtype=dt)


PAGE = 4096


def empty_rows(rows: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty((rows, *shape), dtype)``, starting on a page boundary when
    a row is a whole number of pages: the store then reads such rows from
    disk with O_DIRECT straight into the array instead of through a buffer."""
    dtype = np.dtype(dtype)
    row = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if row == 0 or row % PAGE or rows == 0:
        return np.empty((rows, *shape), dtype=dtype)
    raw = np.empty(rows * row + PAGE, dtype=np.uint8)
    at = -raw.ctypes.data % PAGE
    return raw[at:at + rows * row].view(dtype).reshape((rows, *shape))


def indices(idx: Any, length: int) -> np.ndarray:
    """Normalise a batch index to a contiguous uint64 array.

    Accepts an integer sequence or array (negative values count from the end,
    as in NumPy) or a boolean mask of exactly ``length`` entries. An index
    outside ``[-length, length)`` raises IndexError naming it.
    """
    arr = np.asarray(idx)
    if arr.dtype == np.bool_:
        if arr.ndim != 1 or arr.shape[0] != length:
            raise IndexError(
                f"boolean index has shape {arr.shape}, expected ({length},) to match the dataset"
            )
        return np.flatnonzero(arr).astype(np.uint64)
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise IndexError(
            f"indices must be integers or a boolean mask, got dtype {arr.dtype}"
        )
    if arr.ndim != 1:
        raise IndexError(f"indices must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "u":
        if arr.size and int(arr.max()) >= length:
            raise IndexError(f"index {int(arr.max())} is out of range for length {length}")
        return np.ascontiguousarray(arr, dtype=np.uint64)
    arr = arr.astype(np.int64)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < -length or hi >= length:
        bad = lo if lo < -length else hi
        raise IndexError(f"index {bad} is out of range for length {length}")
    if lo < 0:
        arr = np.where(arr < 0, arr + length, arr)
    return np.ascontiguousarray(arr, dtype=np.uint64)


def scalar_index(idx: Any, length: int) -> int:
    """Normalise one integer index (negative counts from the end)."""
    i = operator.index(idx)
    if i < -length or i >= length:
        raise IndexError(f"index {i} is out of range for length {length}")
    return i + length if i < 0 else i


def is_int(idx: Any) -> bool:
    """True for Python and NumPy integers, but not for bools."""
    return isinstance(idx, (int, np.integer)) and not isinstance(idx, (bool, np.bool_))


U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
_BOUNDS = {U32_MAX: "2**32 - 1", U64_MAX: "2**64 - 1"}


def integer(value: Any, name: str, low: int = 0, high: int = U64_MAX) -> int:
    """``value`` checked to be an int from ``low`` to ``high`` (by default a
    u64: 0 to 2**64 - 1); the one check of the integer arguments the Python
    layer passes to the Rust core, where a float was truncated (1.5 became
    1) and a value out of range was a bare OverflowError.

    Raises TypeError naming ``name`` for anything but a Python or NumPy
    integer (a float, even 2.0, a string, a bool), and ValueError naming it
    and its range for an integer outside the range.
    """
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if not low <= v <= high:
        raise ValueError(f"{name} must be >= {low} and <= {_BOUNDS.get(high, high)}, got {v}")
    return v


def weights(values: Any, name: str, positive: bool = False) -> list[float]:
    """Mixture weights checked: a sequence of finite numbers >= 0 whose sum
    is finite (only their ratios matter; weights summing past the largest
    float, 1.8e308, normalised to zeros). A string (``'11'`` read as two
    ones) and a bool are not weights. With ``positive`` none may be 0;
    otherwise the callers check which may be.

    Raises TypeError or ValueError naming ``name``.
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__} {values!r}")
    out = []
    for w in values:
        if isinstance(w, (str, bytes, bool, np.bool_)) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a sequence of numbers, got {type(w).__name__} {w!r} in {values!r}")
        out.append(float(w))
    if positive and not all(math.isfinite(w) and w > 0 for w in out):
        raise ValueError(f"{name} must be positive and finite, got {out}")
    if not all(math.isfinite(w) and w >= 0 for w in out):
        raise ValueError(f"{name} must be finite and >= 0, got {out}")
    if not math.isfinite(sum(out)):
        raise ValueError(f"{name} sum to more than the largest float (about 1.8e308), got {out}; "
                         f"scale them down (only their ratios matter)")
    return out


_C = TypeVar("_C", bound="Closeable")


class Closeable:
    """``with`` support and close-on-garbage-collection for objects with ``close()``."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        # The error that ended the block is the one to see: a failure to
        # close after it (often its consequence) becomes a note on it.
        try:
            self.close()
        except Exception as e:
            note = getattr(exc, "add_note", None)  # Python 3.11+
            if note is not None:
                note(f"closing {type(self).__name__} also failed: {type(e).__name__}: {e}")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def cache_bytes(value: Any) -> int | None:
    """Checks a ``cache_bytes=`` argument: None or a non-negative int."""
    if value is None:
        return None
    if not is_int(value):
        raise TypeError(f"cache_bytes must be an int number of bytes or None, got {value!r}")
    return integer(value, "cache_bytes")
