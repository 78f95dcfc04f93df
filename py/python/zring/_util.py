"""Argument conversion shared by the Python layer (no I/O here)."""

from __future__ import annotations

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
    if int(value) < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {int(value)}")
    return int(value)
