"""zring: a persistent record store and endless step-based data loader (loaderx-compatible)."""

import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from ._zring import (
    ChecksumError as ChecksumError,
    CorruptError as CorruptError,
    LockedError as LockedError,
    NotAStoreError as NotAStoreError,
    PoisonedError as PoisonedError,
    StaleError as StaleError,
    Store as Store,
    UnsupportedVersionError as UnsupportedVersionError,
    ZringError as ZringError,
    import_loaderx as import_loaderx,
    set_cache_bytes as set_cache_bytes,
)

__version__: str

_Path = Union[str, os.PathLike[str]]
_Index = Union[int, slice, Iterable[int], npt.NDArray[Any]]

ZrecordError = ZringError

def write_dataset(
    path: _Path,
    array: npt.ArrayLike,
    codec: str = "zstd",
    chunk_bytes: int = ...,
    dict_size: Optional[int] = None,
    *,
    progress: Optional[bool] = None,
    overwrite: bool = False,
    append: bool = False,
    level: Optional[int] = None,
) -> int:
    """Store array one record per slice along axis 0; returns the record count.

    Built beside path and renamed into place when complete; an existing path
    is FileExistsError unless overwrite=True (replace; only a store, a
    directory of stores or an empty directory, else FileExistsError with
    every file kept) or append=True (add).
    A new store's table is sealed in format 2 (no entry per record for raw
    records of one length); append=True keeps the table's format.
    level: zstd level of "zstd" records (default 3; same format at any level)."""

def write_ragged(
    path: _Path,
    arrays: Iterable[npt.ArrayLike],
    dtype: Any = None,
    item_shape: Optional[Iterable[int]] = None,
    codec: str = "zstd",
    chunk_bytes: int = ...,
    dict_size: Optional[int] = None,
    *,
    progress: Optional[bool] = None,
    overwrite: bool = False,
    append: bool = False,
    level: Optional[int] = None,
) -> int:
    """Store variable-length arrays one record each; returns the record count.

    Built beside path and renamed into place when complete; an existing path
    is FileExistsError unless overwrite=True (replace; only a store, a
    directory of stores or an empty directory, else FileExistsError with
    every file kept) or append=True (add).
    A new store's table is sealed in format 2 (12 bytes a record);
    append=True keeps the table's format. A value dtype cannot hold (70000 for uint16, 1.5 for int32) is a
    ValueError naming the value and the dtype. level: zstd level of "zstd" records (default 3)."""

class Schedule:
    """Mixture weights over the steps (from schedule); pass it to mix."""
    points: list[tuple[int, list[float]]]
    interpolate: str
    #: The points with each stair of a "step" schedule as a jump.
    corners: list[tuple[int, list[float]]]
    @property
    def sources(self) -> int: ...
    def mean_weights(self) -> list[float]: ...
    def weights_at(self, step: float) -> npt.NDArray[np.float64]:
        """The normalised weights at step (after a jump there, the later)."""
    def targets(self, steps: float, batch_size: int) -> npt.NDArray[np.float64]:
        """Each source's target after steps steps: batch_size times the
        integral of its weight (computed in NumPy, for checking)."""

def schedule(
    points: Union[Mapping[int, Sequence[float]], Sequence[tuple[int, Sequence[float]]]],
    *,
    interpolate: str = "linear",
) -> Schedule:
    """Mixture weights as a function of the step: (step, weights) points
    from step 0, linear between them ("linear") or held until the next
    ("step"), the last held after; each source's rows so far within a row of
    the integral of its weight; a state resumed under another schedule
    follows it from the saved step on. ValueError for points out of order,
    negative weights, weights summing past the largest float, or a source
    of weight 0 everywhere; TypeError for a step that is not an int (1.5)
    or weights that are not numbers (the string "11")."""

class Mixture:
    """Stream dicts and their weights (from mix); pass it to DataLoader."""
    sources: list[dict[str, Union[Dataset, RaggedDataset]]]
    #: The weights' schedule, or None for fixed weights.
    schedule: Optional[Schedule]
    weights: npt.NDArray[np.float64]
    names: list[str]
    lengths: list[int]
    given_weights: list[float]
    #: Per stream whose sources differ in dtype (integer documents, for
    #: pack), the sources' dtypes.
    mixed_dtypes: dict[str, list[np.dtype[Any]]]
    def allocation(self, rows: int, batch_size: Optional[int] = None) -> npt.NDArray[np.int64]:
        """Rows per source among the first rows of the mixture (largest
        remainder); with batch_size, as a loader of that many rows per batch
        counts them (the same unless a source gets under a row per batch)."""
    def check_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The state in the loader's form; ValueError if saved for sources of
        other lengths (other weights are taken from the saved step on)."""

def mix(
    sources: Sequence[Union[Mapping[str, Union[Dataset, RaggedDataset]], Dataset, RaggedDataset]],
    weights: Union[Sequence[float], Schedule],
) -> Mixture:
    """A weighted mixture for DataLoader: each source's rows so far are its
    share rounded down or up (largest remainder, carried over), so a batch
    holds its share rounded, or one row further; any positive weight, a
    source of under a row per batch getting its rows over the steps (within
    a row of its share while at most three are that small); each source is
    drawn by its own sampler; last_sources/last_indices name each row;
    state()/state= resume (under other weights or a schedule: those from
    the saved step on). weights may be a schedule().
    A bare dataset is the stream dict {"tokens": ds} (a mixture for pack).
    RaggedDatasets of integer documents may differ in dtype (uint16 and
    int32): pack delivers one; a loader of records over them refuses.
    ValueError for weights not positive and finite or summing past the
    largest float (scale them down); TypeError for weights that are not
    numbers (the string "11")."""

class SplitDataset(Dataset):
    """A part of a Dataset (from split): a Dataset over some of its records."""
    part: int
    split: dict[str, Any]
    @property
    def records(self) -> npt.NDArray[np.uint64]:
        """The store's records in this part, increasing."""

class SplitRaggedDataset(RaggedDataset):
    """A part of a RaggedDataset (from split)."""
    part: int
    split: dict[str, Any]
    @property
    def records(self) -> npt.NDArray[np.uint64]:
        """The store's records in this part, increasing."""

def split(
    data: Union[Dataset, RaggedDataset, Mapping[str, Union[Dataset, RaggedDataset]], Mixture],
    split: Union[str, Sequence[float], Sequence[tuple[int, Optional[int]]]],
    *,
    seed: int = 0,
) -> tuple[Any, ...]:
    """Train/validation/test parts by record: weights ("969,30,1", [0.98,
    0.01, 0.01]: every whole period of sum(parts) records holds each part's
    exact count, records interleaved by a keyed permutation per period) or
    ranges ([(0, 900_000), (900_000, None)]). A record's part depends on its
    index alone, so appending keeps every part's records and adds new ones
    after them. One view per part, of data's kind (a mixture: each source
    split, None for a part a source has no record in); views work wherever
    the dataset does (DataLoader in any mode, mix, pack, jax.global_loader)."""

class Packed:
    """Packed token rows (from pack); pass it to DataLoader."""
    datasets: list[RaggedDataset]
    mixture: Optional[Mixture]
    dtype: np.dtype[Any]
    seq_len: int
    mode: str
    pad_id: Optional[int]
    labels: bool
    mask_boundaries: bool
    eod_id: Optional[int]
    bos_id: Optional[int]
    #: The batch's arrays, in order.
    names: list[str]
    def spec(self) -> tuple[Any, ...]:
        """The pack= argument of the Rust loader."""

class Ramp:
    """An int as a function of the step (zring.ramp)."""
    steps: list[int]
    values: list[int]
    interpolate: str
    multiple: int
    #: (first step, value) where the value changes.
    pieces: list[tuple[int, int]]
    def __call__(self, step: int) -> int: ...
    def distinct(self) -> list[int]: ...
    def definition(self) -> dict[str, Any]: ...

def ramp(
    points: Union[Mapping[int, int], Sequence[tuple[int, int]]], *, interpolate: str = "step", multiple: int = 1
) -> Ramp:
    """An int that changes with the step ({step: value}, the first at 0; held, or
    linear between points rounded to multiple): DataLoader's batch_size, pack's seq_len."""

def rampup_batch_size(start: int, increment: int, samples: int, target: int) -> Ramp:
    """Megatron's --rampup-batch-size start increment samples, toward target, as a Ramp of the step."""

class CurriculumLoader:
    """A DataLoader whose batch size and packed sequence length follow ramps:
    what DataLoader(...) returns given a Ramp. Steps take ticks of a fixed-shape
    loader (tick rows of unit tokens) laid end to end."""

    batch: Ramp
    seq: Optional[Ramp]
    unit: int
    tick: int
    step: int
    last_step: Optional[int]
    last_indices: Optional[npt.NDArray[np.uint64]]
    last_sources: Optional[npt.NDArray[np.int64]]
    def ticks_at(self, step: int) -> int: ...
    def ticks_before(self, step: int) -> int: ...
    def __iter__(self) -> "CurriculumLoader": ...
    def __next__(self) -> Any: ...
    def next(self) -> Any: ...
    def state(self) -> dict[str, Any]:
        """{"curriculum", "step", "inner"}: pass as state= to resume; set "step" to seek."""
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "CurriculumLoader": ...
    def __exit__(self, *exc: object) -> None: ...

def pack(
    source: Union[RaggedDataset, Mixture],
    seq_len: Union[int, Ramp],
    *,
    mode: str = "concat",
    pad_id: Optional[int] = None,
    labels: bool = False,
    mask_boundaries: bool = False,
    eod_id: Optional[int] = None,
    bos_id: Optional[int] = None,
    dtype: Any = None,
) -> Packed:
    """Rows of seq_len tokens from a RaggedDataset of 1-D token documents (or a
    mix of them, of any integer dtypes) for DataLoader: each batch is
    {"tokens": (B, seq_len) in dtype (default: the narrowest integer dtype
    holding every source's), "segment_ids": int32 (1, 2, ... per document
    piece, 0 = padding), "positions": int32 (offset in the document)}, plus
    with labels=True "labels" (each token's next token; in concat mode a
    row's last label is the next row's first token: rows of seq_len + 1
    overlapping by one) and "loss_mask" (uint8; 0 on padding and, with
    mask_boundaries=True, at each document's last token). eod_id/bos_id add
    a token after/before every document (not stored). mode="concat":
    documents in the sampler's order back to back, cut every seq_len tokens,
    nothing padded; mode="first_fit": each window of 1,024 documents placed
    first-fit into rows padded with pad_id (required there), longer
    documents cut into pieces of seq_len (none dropped). A token the dtype
    cannot hold fails the step, naming source, document and value. Rows are
    a pure function of (seed, step): state()/state=, shard= as usual; a
    mixture's weights count tokens. ValueError for seq_len < 1, an unknown
    mode, records that are not 1-D integers, first_fit without pad_id, a
    pad_id/eod_id/bos_id outside the dtype, or mask_boundaries without
    labels; TypeError for a fixed-size Dataset."""

def convert(
    src: _Path,
    dst: _Path,
    *,
    columns: Optional[Sequence[str]] = None,
    fill: Any = None,
    extensions: Optional[Sequence[str]] = None,
    codec: str = "zstd",
    kind: Optional[str] = None,
    overwrite: bool = False,
    block_bytes: int = ...,
    progress: Optional[bool] = None,
    workers: Optional[int] = None,
    dtype: Any = None,
) -> dict[str, int]:
    """Parquet or Arrow IPC files (a HuggingFace save_to_disk folder; one
    store per column), a folder of files, WebDataset tar shards (one store per
    extension), a Megatron .bin/.idx dataset (dst/tokens.zr), a .npy or a
    loaderx store into zring stores at dst, each with its table sealed in
    format 2; dtype= stores number columns and tokens in that dtype (narrowing
    only if every value fits); returns the records written per store.
    With workers=N, a folder of many files becomes a dataset of parts, one
    part per file, converted by N worker processes."""

def pad(
    values: npt.NDArray[Any], row_splits: npt.ArrayLike, max_len: Optional[int] = None, pad_value: Any = 0
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """Packed (values, row_splits) to a dense (B, max_len, *tail) array plus lengths."""

class Dataset:
    """Fixed-shape samples stored one per record; a folder with a
    manifest.json (a dataset of parts, zring.parts) opens as one dataset."""

    path: Any
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    codec: str
    #: (rank, ranks) when opened with rank_parts= (only that rank's parts), else None.
    rank_parts: Optional[tuple[int, int]]
    #: The URL the dataset was opened from (path is then its staged copy), or None.
    url: Optional[str]
    def __init__(
        self,
        path: _Path,
        *,
        cache_bytes: Optional[int] = None,
        rank_parts: Optional[tuple[int, int]] = None,
        cache: Optional[_Path] = None,
        cache_disk_bytes: Optional[int] = None,
        storage_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """path may be a URL in object storage (s3://, gs://, az://, file://):
        its share is staged into the folder cache (capped at cache_disk_bytes)
        and read from there; storage_options are the store's and the tier's
        options (zring.remote)."""
    @property
    def record_bytes(self) -> int:
        """Bytes in one sample."""
    def __len__(self) -> int: ...
    def __getitem__(self, idx: _Index) -> npt.NDArray[Any]: ...
    def __getitems__(self, idxs: Union[Iterable[int], npt.NDArray[Any]]) -> npt.NDArray[Any]: ...
    def verify(self) -> dict[str, Any]:
        """Check every record."""
    def stats(self) -> dict[str, Any]:
        """Storage usage, and the read statistics under "reads"."""
    def read_stats(self) -> dict[str, Any]:
        """The read policy in force and the reads since open (hits, bytes by source)."""
    def fingerprint(self) -> dict[str, Any]:
        """{"records", "content"}: the store's checkpoint fingerprint, O(1)."""
    def remote_stats(self) -> Optional[dict[str, Any]]:
        """The line cache's counters for a dataset in object storage staged
        lazily (its share larger than cache_disk_bytes), else None."""
    @property
    def names(self) -> Optional[Sequence[str]]:
        """Record names kept with the store (zring.convert of a folder or tar shards), read on demand, or None."""
    def close(self) -> None:
        """Release the store."""
    def __enter__(self) -> "Dataset": ...
    def __exit__(self, *exc: object) -> None: ...

class RaggedDataset:
    """Variable-length records read back packed as (values, row_splits); a
    dataset of parts (zring.parts) opens as one dataset."""

    path: Any
    dtype: np.dtype[Any]
    item_shape: tuple[int, ...]
    codec: str
    #: (rank, ranks) when opened with rank_parts= (only that rank's parts), else None.
    rank_parts: Optional[tuple[int, int]]
    #: The URL the dataset was opened from (path is then its staged copy), or None.
    url: Optional[str]
    def __init__(
        self,
        path: _Path,
        *,
        cache_bytes: Optional[int] = None,
        rank_parts: Optional[tuple[int, int]] = None,
        cache: Optional[_Path] = None,
        cache_disk_bytes: Optional[int] = None,
        storage_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """path may be a URL in object storage (s3://, gs://, az://, file://):
        its share is staged into the folder cache (capped at cache_disk_bytes)
        and read from there; storage_options are the store's and the tier's
        options (zring.remote)."""
    @property
    def row_bytes(self) -> int:
        """Bytes in one row."""
    def __len__(self) -> int: ...
    def __getitem__(self, idx: _Index) -> Any: ...
    def __getitems__(
        self, idxs: Union[Iterable[int], npt.NDArray[Any]]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]: ...
    def getitems_padded(
        self, idxs: Union[Iterable[int], npt.NDArray[Any]], max_len: Optional[int] = None, pad_value: Any = 0
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """Gather straight into a dense padded batch."""
    def verify(self) -> dict[str, Any]:
        """Check every record."""
    def stats(self) -> dict[str, Any]:
        """Storage usage, and the read statistics under "reads"."""
    def read_stats(self) -> dict[str, Any]:
        """The read policy in force and the reads since open (hits, bytes by source)."""
    def fingerprint(self) -> dict[str, Any]:
        """{"records", "content"}: the store's checkpoint fingerprint, O(1)."""
    def remote_stats(self) -> Optional[dict[str, Any]]:
        """The line cache's counters for a dataset in object storage staged
        lazily (its share larger than cache_disk_bytes), else None."""
    @property
    def names(self) -> Optional[Sequence[str]]:
        """Record names kept with the store (zring.convert of a folder or tar shards), read on demand, or None."""
    def close(self) -> None:
        """Release the store."""
    def __enter__(self) -> "RaggedDataset": ...
    def __exit__(self, *exc: object) -> None: ...

class DataLoader:
    """An endless iterator of batch dicts over named streams (one_pass=True: one pass, for evaluation).

    A transform runs on ``transform_workers`` threads (default: as many as
    ``num_workers``; ``0`` runs it on the consumer thread), several steps at
    once, with batches still returned in step order.
    """

    streams: Union[dict[str, Union[Dataset, RaggedDataset]], Mixture, Packed]
    #: The mixture read, or None for a stream dict.
    mixture: Optional[Mixture]
    #: The packed source read (zring.pack), or None.
    packed: Optional[Packed]
    transform: Callable[[dict[str, Any]], Any]
    last_indices: Optional[npt.NDArray[np.uint64]]
    last_step: Optional[int]
    #: For a zring.mix mixture: the source of each row of the last batch.
    last_sources: Optional[npt.NDArray[np.int64]]
    #: (rank, ranks) for a rank's loader over its own parts (rank_parts=), else None.
    rank_parts: Optional[tuple[int, int]]
    #: Real rows of the last batch (fewer in a one-pass loader's padded last batch).
    last_valid: Optional[int]
    def __init__(
        self,
        streams: Union[Mapping[str, Union[Dataset, RaggedDataset]], Mixture, Packed],
        num_workers: Optional[int] = None,
        batch_size: Union[int, Ramp, None] = None,
        prefetch_size: int = 4,
        mode: Optional[int] = None,
        seed: Optional[int] = None,
        transform: Callable[[dict[str, Any]], Any] = ...,
        *,
        state: Optional[dict[str, Any]] = None,
        shard: Optional[tuple[int, int]] = None,
        transform_workers: Optional[int] = None,
        cache_bytes: Optional[int] = None,
        block_records: Optional[int] = None,
        window_blocks: Optional[int] = None,
        rank_parts: Optional[tuple[int, int]] = None,
        one_pass: bool = False,
        last_batch: str = "partial",
    ) -> None:
        """one_pass=True: a finite loader that reads the streams (or a concat
        pack of one source) once in order (mode 0), len(loader) steps, then
        raises StopIteration; last_batch "partial" (the rows left), "drop"
        (full batches only) or "pad" (a full batch, last_valid real rows first;
        a packed pass marks tokens past it as padding, loss_mask 0)."""
    def __len__(self) -> int:
        """The steps of a one-pass loader; TypeError for an endless one."""
    def __iter__(self) -> "DataLoader": ...
    def __next__(self) -> Any: ...
    def next(self) -> Any:
        """The next batch."""
    def state(self) -> dict[str, Any]:
        """Resume point: pass as state= to continue with the batch after the last one returned.
        It carries each stream's fingerprint: a resume over changed records raises, one over a
        store that only grew finishes the cycle under way and adds the new records from the next.
        Under "consumed", per source: rows, records (packed: documents, tokens) and epochs so far."""
    def stats(self) -> dict[str, Any]:
        """Pipeline statistics, and each stream's read statistics under "reads"; under
        "consumed", per source, rows, records (packed: documents, tokens) and epochs so far."""
    def close(self) -> None:
        """Stop and join the transform workers and the gather threads."""
    def __enter__(self) -> "DataLoader": ...
    def __exit__(self, *exc: object) -> None: ...

class Zrecord:
    """A store of opaque byte records with a dense index space."""

    path: Any
    codec: str
    def __init__(
        self, path: _Path, codec: str = "zstd", *, readonly: bool = False, cache_bytes: Optional[int] = None
    ) -> None: ...
    def __len__(self) -> int: ...
    def sync(self) -> None:
        """Make appends durable."""
    def lengths(self, idxs: npt.ArrayLike) -> npt.NDArray[np.uint32]:
        """Logical byte length of each record."""
    def gather(self, idxs: npt.ArrayLike, dst: npt.NDArray[Any], stride: int) -> None:
        """Decode records into dst, one every stride bytes."""
    def gather_var(self, idxs: npt.ArrayLike, dst: npt.NDArray[Any], offsets: npt.ArrayLike) -> None:
        """Decode records into dst at byte offsets."""
    def append(self, src: npt.NDArray[Any], n: int, item_len: int, codec: Optional[str] = None) -> int:
        """Append n records of item_len bytes; returns the first new index.
        Refused (ValueError) on a store with record names (names/)."""
    def append_var(
        self, src: npt.NDArray[Any], offsets: npt.ArrayLike, lens: npt.ArrayLike, codec: Optional[str] = None
    ) -> int:
        """Append records of different lengths; returns the first new index.
        Refused (ValueError) on a store with record names (names/)."""
    def train_dict(self, samples: npt.ArrayLike, sizes: npt.ArrayLike, target: int) -> int:
        """Train and install a zstd dictionary; returns its size."""
    def has_dict(self) -> bool:
        """Whether the store has a dictionary."""
    def delete(self, idxs: npt.ArrayLike) -> None:
        """Remove records; the tail fills the holes. Record names (names/) change with
        them: the names' lock is taken first, and an interrupted delete is finished by
        the next writable open."""
    def compact(self, format: int | None = None) -> dict[str, Any]:
        """Reclaim deleted space; format=1 or 2 rewrites the table in that format."""
    def stats(self) -> dict[str, Any]:
        """Storage usage, and the read statistics under "reads"."""
    def read_stats(self) -> dict[str, Any]:
        """The read policy in force and the reads since open."""
    def fingerprint(self) -> dict[str, Any]:
        """{"records", "content"}: the store's checkpoint fingerprint, O(1)."""
    def verify(self) -> dict[str, Any]:
        """Check every record."""
    def close(self) -> None:
        """Release the store and its writer lock."""
    def __enter__(self) -> "Zrecord": ...
    def __exit__(self, *exc: object) -> None: ...

class Sampler:
    """Endless seekable index batches over [0, length)."""

    class Mode:
        SEQUENTIAL: int
        IID: int
        CYCLIC: int
    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: int,
        seed: int = 42,
        *,
        block_records: Optional[int] = None,
        window_blocks: Optional[int] = None,
    ) -> None: ...
    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Sampler":
        """Rebuild from state()."""
    def next(self) -> npt.NDArray[np.uint64]:
        """The current step's indices; advances."""
    def batch(self, step: int) -> npt.NDArray[np.uint64]:
        """Any step's indices (step an int from 0 to 2**64 - 1)."""
    def seek(self, step: int) -> None:
        """Move to step (an int from 0 to 2**64 - 1: TypeError for a float,
        ValueError naming step out of range)."""
    @property
    def step(self) -> int:
        """The step next() returns next."""
    def state(self) -> dict[str, Any]:
        """The resumable state."""
    def __iter__(self) -> "Sampler": ...
    def __next__(self) -> npt.NDArray[np.uint64]: ...

from . import parts as parts

# Optional submodules, imported explicitly (``import zring.jax``,
# ``import zring.adapters``) so that ``import zring`` imports neither jax nor
# torch; their stubs are jax.pyi and adapters.pyi.
# zring.remote and zring.ray, also imported explicitly, are typed in their
# sources.
