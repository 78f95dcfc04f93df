"""JAX input pipelines over zring: device prefetch, multi-process global batches, checkpoints."""

from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import DataLoader, Dataset, Mixture, RaggedDataset

STATE_FORMAT: int

class StateMismatchError(ValueError):
    """A saved loader state does not fit the streams or arguments it is resumed with."""

def fingerprint(streams: Mapping[str, Union[Dataset, RaggedDataset]]) -> dict[str, Any]:
    """Record count and schema hash of each stream."""

PACKED_KEYS: tuple[str, ...]

def checkpoint_state(
    streams: Union[Mapping[str, Union[Dataset, RaggedDataset]], Mixture, Any],
    sampler_state: Mapping[str, Any],
    loader_state: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """The JSON-able checkpoint dict for a sampler state (a mixture's with its
    row order; a packed source's with the DataLoader's own state)."""

def restore_loader(
    streams: Union[Mapping[str, Union[Dataset, RaggedDataset]], Mixture, Any],
    state: Mapping[str, Any],
    *,
    shard: Optional[tuple[int, int]] = None,
    **loader_kwargs: Any,
) -> DataLoader:
    """A DataLoader that continues a checkpoint exactly."""

class DevicePrefetch:
    """Batches put on device ahead of the consumer."""

    loader: Iterable[Any]
    size: int
    sharding: Any
    def __init__(
        self,
        loader: Iterable[Any],
        size: int = 2,
        sharding: Any = None,
        *,
        _put: Callable[[Any, Any], Any] = ...,
    ) -> None: ...
    def __iter__(self) -> "DevicePrefetch": ...
    def __next__(self) -> Any: ...
    def state(self) -> dict[str, Any]:
        """Checkpoint dict at the consumer's position."""
    def close(self) -> None:
        """Drop held batches and close the loader."""
    def __enter__(self) -> "DevicePrefetch": ...
    def __exit__(self, *exc: object) -> None: ...

def device_prefetch(loader: Iterable[Any], size: int = 2, sharding: Any = None) -> DevicePrefetch:
    """Keep size batches on the device(s) ahead of the consumer."""

class RowPlan:
    """Which rows of a global batch one process reads."""

    global_batch_size: int
    blocks: list[tuple[int, int]]
    ranges: list[tuple[int, int]]
    shard: Optional[tuple[int, int]]
    positions: npt.NDArray[np.int64]
    def __init__(self, blocks: Sequence[tuple[int, int]], global_batch_size: int) -> None: ...
    def __len__(self) -> int: ...

def process_rows(sharding: Any, global_shape: Sequence[int], devices: Optional[Iterable[Any]] = None) -> RowPlan:
    """The rows of dimension 0 that devices hold."""

class GlobalLoader:
    """Iterator of global batches for one process of a JAX run."""

    streams: Union[dict[str, Dataset], Mixture, Any]
    process_index: int
    process_count: int
    global_batch_size: int
    shardings: dict[str, Any]
    global_shapes: dict[str, tuple[int, ...]]
    plans: dict[str, RowPlan]
    plan: RowPlan
    full_batch: bool
    loader: DataLoader
    #: (rank, ranks) when this process is a rank reading only its own parts, else None.
    rank_parts: Optional[tuple[int, int]]
    def __init__(
        self,
        streams: Union[Mapping[str, Dataset], Mixture, Any],
        global_batch_size: int,
        sharding: Any,
        *,
        mode: Optional[int] = None,
        seed: Optional[int] = None,
        state: Optional[Mapping[str, Any]] = None,
        process_index: Optional[int] = None,
        process_count: Optional[int] = None,
        prefetch: int = 2,
        rank_parts: Optional[tuple[int, int]] = None,
        **loader_kwargs: Any,
    ) -> None: ...
    def __iter__(self) -> "GlobalLoader": ...
    def __next__(self) -> dict[str, Any]: ...
    @property
    def last_step(self) -> Optional[int]:
        """The step of the global batch last returned."""
    @property
    def last_indices(self) -> Optional[npt.NDArray[np.uint64]]:
        """This process's record indices of the batch last returned."""
    @property
    def last_sources(self) -> Optional[npt.NDArray[np.uint32]]:
        """A mixture's source of each of this process's rows of the batch
        last returned."""
    def state(self) -> dict[str, Any]:
        """Checkpoint dict at the consumer's position."""
    def close(self) -> None:
        """Stop the gather threads."""
    def __enter__(self) -> "GlobalLoader": ...
    def __exit__(self, *exc: object) -> None: ...

def global_loader(
    streams: Union[Mapping[str, Dataset], Mixture, Any],
    global_batch_size: int,
    sharding: Any,
    *,
    mode: Optional[int] = None,
    seed: Optional[int] = None,
    state: Optional[Mapping[str, Any]] = None,
    process_index: Optional[int] = None,
    process_count: Optional[int] = None,
    prefetch: int = 2,
    rank_parts: Optional[tuple[int, int]] = None,
    **loader_kwargs: Any,
) -> GlobalLoader:
    """Global jax.Array batches for this process of a multi-process run, over
    stream dicts, zring.mix mixtures or zring.pack packed sources; with
    rank_parts (or datasets opened with it) each process a rank reading only
    its own parts."""
