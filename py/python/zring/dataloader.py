"""The endless, step-based loader (loaderx's ``DataLoader``).

Gathering runs in Rust threads that work a few steps ahead; ``next()``
waits for the next step with the GIL released, wraps each stream's bytes as
a NumPy array without copying, then applies ``transform`` on the calling
thread.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import numpy as np

from . import _util, _zring
from .dataset import Dataset, RaggedDataset


def _identity(batch: Any) -> Any:
    return batch


def _nonneg(name: str, value: Any, minimum: int = 0) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


class DataLoader(_util.Closeable):
    """An endless iterator of batches over named streams.

    A batch is a dict ``{name: samples}``: for a :class:`Dataset` stream an
    array ``(B, *shape)``, for a :class:`RaggedDataset` stream a packed
    ``(values, row_splits)``. Every stream is gathered at the same indices,
    so record ``i`` lines up across streams.

    zring additions: ``state=`` with :meth:`state` resumes exactly,
    ``shard=(index, count)`` delivers one contiguous slice of each global
    batch, :meth:`stats` reports the pipeline's timings, and
    :attr:`last_indices` holds the indices of the batch last returned.
    """

    def __init__(self, streams: Mapping[str, Dataset | RaggedDataset], num_workers: int = 4,
                 batch_size: int = 256, prefetch_size: int = 4, mode: int = 1, seed: int = 42,
                 transform: Callable[[dict[str, Any]], Any] = _identity, *,
                 state: dict[str, Any] | None = None, shard: tuple[int, int] | None = None):
        """Start gathering.

        Args:
            streams: Named datasets, all of the same length.
            num_workers: Gather threads (>= 1). While ``min(num_workers,
                prefetch_size)`` is below the core count each gather also
                uses zring's decode pool; from there on each thread gathers
                alone.
            batch_size: Records per step (before sharding).
            prefetch_size: Steps gathered ahead of the consumer (>= 1).
            mode: 0 sequential, 1 iid (with replacement), 2 cyclic (without).
            seed: Sampler seed.
            transform: Applied to each batch dict on the consumer thread.
            state: A dict from :meth:`state`; it fixes batch_size, mode, seed
                and the next step, overriding those arguments.
            shard: ``(index, count)``; the count must divide the batch.

        Raises:
            ValueError: No streams, streams of different lengths, or an
                argument out of range.
            TypeError: A stream is not a zring Dataset or RaggedDataset.
        """
        self._loader = None
        self.streams = dict(streams)
        if not self.streams:
            raise ValueError("need at least one stream")
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        specs = []
        self._views: list[tuple[str, Any]] = []
        for name, ds in self.streams.items():
            if not isinstance(name, str):
                raise TypeError(f"stream names must be str, got {name!r}")
            if isinstance(ds, Dataset):
                specs.append((name, ds._s, ds.record_bytes))
            elif isinstance(ds, RaggedDataset):
                specs.append((name, ds._s, None))
            else:
                raise TypeError(
                    f"stream {name!r} is a {type(ds).__name__}; DataLoader reads zring "
                    "Dataset and RaggedDataset streams"
                )
            self._views.append((name, ds))
        lengths = {name: len(ds) for name, ds in self.streams.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"all streams must have the same length, got {lengths}")
        if shard is not None:
            try:
                shard = (_nonneg("shard index", shard[0]), _nonneg("shard count", shard[1], 1))
            except (TypeError, IndexError):
                raise TypeError(f"shard must be an (index, count) pair, got {shard!r}") from None
        if state is not None and not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from DataLoader.state(), got {type(state).__name__}")
        self.transform = transform
        self._loader = _zring.Loader(
            specs,
            batch_size=_nonneg("batch_size", batch_size, 1),
            mode=_nonneg("mode", mode),
            seed=_nonneg("seed", seed),
            shard=shard,
            depth=_nonneg("prefetch_size", prefetch_size, 1),
            threads=_nonneg("num_workers", num_workers, 1),
            state=None if state is None else json.dumps(dict(state)),
        )
        self.last_indices: np.ndarray | None = None
        self.last_step: int | None = None

    def __len__(self) -> int:
        raise TypeError("an endless loader has no length")

    def __iter__(self) -> "DataLoader":
        return self

    def __next__(self) -> Any:
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        step, indices, columns = self._loader.next()
        batch: dict[str, Any] = {}
        for (name, ds), (_, data, offsets) in zip(self._views, columns):
            if offsets is None:
                batch[name] = data.view(ds.dtype).reshape((len(indices), *ds.shape))
            else:
                values = data.view(ds.dtype).reshape((-1, *ds.item_shape))
                row_bytes = ds.row_bytes or 1
                batch[name] = (values, (offsets // np.uint64(row_bytes)).astype(np.int64))
        self.last_indices, self.last_step = indices, step
        try:
            return self.transform(batch)
        except Exception as exc:
            note = f"raised by the DataLoader transform at step {step}"
            if hasattr(exc, "add_note"):
                exc.add_note(note)
                raise
            raise RuntimeError(f"{note}: {exc!r}") from exc

    def next(self) -> Any:
        """The next batch (same as ``next(loader)``)."""
        return self.__next__()

    def state(self) -> dict[str, Any]:
        """Where the loader is: pass it as ``state=`` to resume with the next batch."""
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        return self._loader.state()

    def stats(self) -> dict[str, Any]:
        """Pipeline statistics: steps, records and bytes gathered, and wait/gather percentiles (µs)."""
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        return self._loader.stats()

    def close(self) -> None:
        """Stop the gather threads. Safe to call twice; batches already returned stay valid."""
        loader, self._loader = getattr(self, "_loader", None), None
        if loader is not None:
            loader.close()

