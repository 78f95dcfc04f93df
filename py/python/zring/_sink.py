"""The store a converter fills, one column or file type at a time (fixed
or ragged, appended a block at a time, sealed on close), and the names
store beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from . import _schema, _util
from ._zrecord import NAMES_DIR, _finish, _open_for_write, _release
from ._zring import Store


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
                 extra: dict[str, Any] | None = None, cast: np.dtype | None = None, what: str = ""):
        # ``cast``: convert's ``dtype=``, what every value is stored as
        # (checked: a value it cannot hold is an error naming ``what``).
        self.cast, self.what = cast, what
        if cast is not None:
            extra = {**(extra or {}), "converted_from": str(np.dtype(dtype))}
            dtype = cast
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

    def _values(self, values: np.ndarray) -> np.ndarray:
        if self.cast is None:
            return np.ascontiguousarray(values, dtype=self.dtype)
        try:
            return _util.as_dtype(values, self.dtype, self.what)
        except ValueError as e:
            src = np.asarray(values).dtype
            raise ValueError(
                f"{e}: dtype={self.dtype} narrows {src} only where every value fits; pass a wider dtype, or "
                f"none to keep {src} (nothing was written)"
            ) from None

    def fixed(self, values: np.ndarray) -> None:
        """Appends ``len(values)`` records of shape ``self.shape``."""
        values = self._values(values)
        n = len(values)
        if n:
            item = values.nbytes // n
            self.store.append_fixed(values.reshape(-1).view(np.uint8), item, self.codec)
        self.records += n

    def ragged(self, values: np.ndarray, offsets: np.ndarray) -> None:
        """Appends one record per ``offsets[i]:offsets[i + 1]`` slice of ``values``."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if self.cast is not None and len(offsets):
            # Only the slice stored is checked (an Arrow chunk's values may
            # extend past its offsets).
            values, offsets = np.asarray(values).reshape(-1)[offsets[0]:offsets[-1]], offsets - offsets[0]
        values = self._values(values).reshape(-1)
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
