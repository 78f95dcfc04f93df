"""zring stores as data sources for Grain and for PyTorch's DataLoader.

* :class:`GrainSource` has the shape of Grain's ``RandomAccessDataSource``
  (``__len__``, ``__getitem__``, ``__repr__``) plus batched reads
  (``__getitems__``, and ``_getitems``, which Grain's batched-read protocol
  calls), so Grain gathers a batch of records with one store read.
* :class:`TorchDataset` is a map-style PyTorch Dataset with
  ``__getitems__``: torch's fetcher hands it the whole list of indices of a
  batch at once. It subclasses ``torch.utils.data.Dataset`` when torch is
  importable and is a plain class with the same protocol otherwise.

Neither grain nor torch is imported by ``import zring``; this module imports
torch only if it is installed.

A source is one store (a sample is an array) or several named stores of one
length (a sample is a dict of arrays, record ``i`` of each). Both pickle by
path: a worker process (Grain's or torch's, fork or spawn) reopens the
stores read-only instead of receiving their contents.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .dataset import Dataset, RaggedDataset

try:  # optional: only the base class of TorchDataset depends on it
    import torch.utils.data as _torch_data
except ImportError:  # pragma: no cover - exercised only without torch
    _torch_data = None

__all__ = ["GrainSource", "TorchDataset"]

_Store = Union[Dataset, RaggedDataset]


def _open(path: Path) -> _Store:
    """Opens ``path`` as a Dataset, or as a RaggedDataset if it is ragged."""
    try:
        return Dataset(path)
    except ValueError as exc:
        if "ragged" not in str(exc):
            raise
        return RaggedDataset(path)


def _paths(source: Any) -> tuple[str | None, dict[str, Path]]:
    """``("dict", {name: path})`` for a mapping of stores, ``(None, {"": path})`` for one store."""
    def one(s: Any) -> Path:
        if isinstance(s, (Dataset, RaggedDataset)):
            return Path(s.path)
        if isinstance(s, (str, os.PathLike)):
            return Path(s)
        raise TypeError(f"expected a path, Dataset or RaggedDataset, got {type(s).__name__}")

    if isinstance(source, Mapping):
        if not source:
            raise ValueError("need at least one stream")
        for name in source:
            if not isinstance(name, str):
                raise TypeError(f"stream names must be str, got {name!r}")
        return "dict", {name: one(s) for name, s in source.items()}
    return None, {"": one(source)}


class _Source:
    """Shared by both adapters: reads samples from one store or a dict of stores."""

    def __init__(self, source: Any):
        """``source``: a path, a Dataset/RaggedDataset, or ``{name: path or dataset}``.

        Raises:
            FileNotFoundError, NotAStoreError: A path holds no dataset.
            ValueError: Named stores of different lengths.
        """
        kind, paths = _paths(source)
        self._setup(kind, paths)

    def _setup(self, kind: str | None, paths: dict[str, Path]) -> None:
        self._kind = kind
        self._paths = paths
        self._stores = {name: _open(p) for name, p in paths.items()}
        lengths = {name: len(s) for name, s in self._stores.items()}
        if len(set(lengths.values())) != 1:
            self.close()
            raise ValueError(f"all streams must have the same length, got {lengths}")
        self._len = next(iter(lengths.values()))

    @property
    def paths(self) -> Path | dict[str, Path]:
        """The store path, or ``{name: path}``."""
        return dict(self._paths) if self._kind else self._paths[""]

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: Any) -> Any:
        """Sample ``index``: an array, or ``{name: array}`` for named stores."""
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise TypeError(f"{type(self).__name__} indices must be integers, got {type(index).__name__}")
        i = index.__index__()
        samples = {name: s[i] for name, s in self._stores.items()}
        return samples if self._kind else samples[""]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, as a list, read with one batched gather per store."""
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise ValueError(f"indices must be one-dimensional, got shape {idx.shape}")
        columns = {name: _split(s, s.__getitems__(idx), idx.size) for name, s in self._stores.items()}
        if not self._kind:
            return columns[""]
        return [{name: col[k] for name, col in columns.items()} for k in range(idx.size)]

    def close(self) -> None:
        """Release the stores. Safe to call twice."""
        for s in getattr(self, "_stores", {}).values():
            s.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickle by path; the receiving process reopens the stores.
        paths = {n: str(p) for n, p in self._paths.items()} if self._kind else str(self._paths[""])
        return (type(self), (paths,))

    def __repr__(self) -> str:
        # Stable across processes and runs: Grain keys checkpoints on it.
        paths = {n: str(p) for n, p in self._paths.items()} if self._kind else str(self._paths[""])
        return f"{type(self).__name__}({paths!r}, len={self._len})"


def _split(store: _Store, data: Any, n: int) -> list[np.ndarray]:
    """One batched read as a list of per-sample arrays (views, no copies)."""
    if isinstance(store, RaggedDataset):
        values, splits = data
        return [values[splits[k]:splits[k + 1]] for k in range(n)]
    return list(data)


class GrainSource(_Source):
    """A Grain ``RandomAccessDataSource`` over zring stores.

    ``len(src)``, ``src[i]`` and ``src.__getitems__(indices)`` (one batched
    read); Grain's batched-read hook ``_getitems`` is the same method.
    Pickles by path, so Grain's worker processes reopen the stores.

    Example::

        source = zring.adapters.GrainSource({"image": "data/img", "label": "data/lbl"})
        ds = grain.MapDataset.source(source).shuffle(seed=0).batch(256)
    """

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        return self.__getitems__(indices)


_TorchBase: Any = _torch_data.Dataset if _torch_data is not None else object


class TorchDataset(_Source, _TorchBase):
    """A map-style PyTorch Dataset over zring stores, with batched ``__getitems__``.

    torch's DataLoader calls ``__getitems__`` with all indices of a batch,
    so a batch is one store read; the default collate then stacks the
    samples into tensors. Pickles by path, so worker processes started with
    spawn reopen the stores (forked workers inherit them, which zring
    supports).

    Example::

        ds = zring.adapters.TorchDataset({"x": "data/x", "y": "data/y"})
        loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2)
    """
