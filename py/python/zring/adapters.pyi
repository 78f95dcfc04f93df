"""zring stores as data sources for Grain and for PyTorch's DataLoader."""

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from . import Dataset, RaggedDataset

_One = Union[str, os.PathLike[str], Dataset, RaggedDataset]
_Source = Union[_One, Mapping[str, _One]]

class _SourceBase:
    def __init__(self, source: _Source) -> None: ...
    @property
    def paths(self) -> Union[Path, dict[str, Path]]:
        """The store path, or {name: path}."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Any: ...
    def __getitems__(self, indices: Sequence[int]) -> list[Any]: ...
    def close(self) -> None:
        """Release the stores."""

class GrainSource(_SourceBase):
    """A Grain RandomAccessDataSource over zring stores."""

    def _getitems(self, indices: Sequence[int]) -> list[Any]: ...

class TorchDataset(_SourceBase):
    """A map-style PyTorch Dataset over zring stores, with batched __getitems__."""
