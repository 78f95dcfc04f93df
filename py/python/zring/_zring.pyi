"""Type stubs of the compiled module ``zring._zring``."""

import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

__version__: str

class ZringError(RuntimeError):
    """Base class of every error zring raises for a failing store or loader."""

class CorruptError(ZringError):
    """Bytes on disk contradict the store's metadata."""

class ChecksumError(CorruptError):
    """A record's bytes do not match its stored checksum."""

class NotAStoreError(ZringError):
    """The directory holds neither a zring nor a loaderx store."""

class UnsupportedVersionError(ZringError):
    """The store's format version is not readable by this build."""

class LockedError(ZringError):
    """Another writer holds the store's lock, or another process held a
    write lock on the chunks a reader must pin for ``ZRING_LOCK_WAIT_MS``."""

class PoisonedError(ZringError):
    """An earlier failure left the writer or loader unusable."""

class StaleError(ZringError):
    """The store changed under an open handle (replaced, or files removed outside zring); reopen it."""

class Staging:
    """A hidden directory beside dest to build in; publish() renames it into
    place (swapping it for an existing dest when replace, in one step where
    the file system can) and fsyncs the parent; discard() removes it. An
    existing dest without replace is FileExistsError, and so is one that is
    not a store, a directory of stores or an empty directory with replace
    (nothing is removed). Staging directories of writers that are gone are
    removed first."""

    def __init__(self, dest: str | os.PathLike[str], replace: bool = False) -> None: ...
    @property
    def path(self) -> str:
        """The directory to build in."""
    def publish(self) -> None:
        """Rename the directory into place and fsync its parent."""
    def discard(self) -> None:
        """Remove the directory (a no-op once published or discarded)."""

class Store:
    """An open record store. Mode "r" reads, "a" appends (creating if missing), "x" creates."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: str = "r",
        *,
        codec: Optional[str] = None,
        level: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
        cache_bytes: Optional[int] = None,
        sealable: bool = False,
    ) -> None:
        """sealable: lay appended records out for seal() (chunks start only every
        340 records; meant for a store written once)."""
    @property
    def path(self) -> str:
        """The store's directory."""
    @property
    def writable(self) -> bool:
        """Whether this handle holds the writer lock."""
    @property
    def closed(self) -> bool:
        """Whether close() has been called."""
    def __len__(self) -> int: ...
    def lengths(self, idx: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """Logical byte length of each record."""
    def gather(self, idx: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8], stride: int) -> None:
        """Decode records into dst, record i at byte i * stride."""
    def gather_var(
        self, idx: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8], offsets: npt.NDArray[np.uint64]
    ) -> None:
        """Decode records into dst, record i at byte offsets[i]."""
    def append(
        self,
        src: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.uint64],
        lens: npt.NDArray[np.uint64],
        codec: Optional[str] = None,
    ) -> int:
        """Append src[offsets[i]:offsets[i]+lens[i]] for each i; returns the first new index."""
    def append_fixed(self, src: npt.NDArray[np.uint8], item_len: int, codec: Optional[str] = None) -> int:
        """Append len(src) / item_len equal records; returns the first new index."""
    def sync(self) -> None:
        """Make appended records durable."""
    def delete(self, idx: npt.NDArray[np.uint64]) -> None:
        """Delete records; the tail fills the holes."""
    def seal(self) -> dict[str, Any]:
        """Sync, then rewrite only the table in format 2 where the records already
        lie as it needs (raw records of one length; any records of a sealable
        writer); no record is copied. Returns the compact-style report;
        format_after is 1 where the store was left as it was."""
    def compact(self, format: int | None = None) -> dict[str, Any]:
        """Reclaim deleted space (format=1 or 2: rewrite the table in it); returns a report."""
    def stats(self) -> dict[str, Any]:
        """Storage usage."""
    def read_stats(self) -> dict[str, Any]:
        """The read policy in force and the reads since open (no table scan)."""
    def fingerprint(self) -> dict[str, Any]:
        """{"records", "content"}: what a checkpoint records (O(1) from the head)."""
    def verify(self) -> dict[str, Any]:
        """Check every record; raises CorruptError/ChecksumError on damage."""
    def train_dict(self, samples: npt.NDArray[np.uint8], sizes: npt.NDArray[np.uint64], max_size: int) -> int:
        """Train and install a zstd dictionary; returns its size."""
    def has_dict(self) -> bool:
        """Whether the store has a zstd dictionary."""
    def schema(self) -> Optional[str]:
        """The schema.json text, or None."""
    def set_schema(self, text: str) -> None:
        """Store the schema.json text."""
    def names_intent(self) -> Optional[bytes]:
        """The bytes of names.intent (a delete's record for the record
        names), or None; read through the store directory's descriptor."""
    def set_names_intent(self, data: Optional[bytes]) -> None:
        """Write names.intent atomically, or remove it durably (None)."""
    def close(self) -> None:
        """Release this handle (a writer syncs first; after a failed write it
        raises nothing more: the failing call reported the error)."""
    def __enter__(self) -> "Store": ...
    def __exit__(self, *exc: object) -> None: ...

class Sampler:
    """Seekable index batches over [0, length)."""

    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: int = 1,
        seed: int = 42,
        block_records: Optional[int] = None,
        window_blocks: Optional[int] = None,
    ) -> None: ...
    @staticmethod
    def from_state_json(text: str) -> "Sampler":
        """Rebuild from the JSON text of state()."""
    def next(self) -> npt.NDArray[np.uint64]:
        """The current step's batch; advances."""
    def batch(self, step: int) -> npt.NDArray[np.uint64]:
        """Any step's batch."""
    def seek(self, step: int) -> None:
        """Move to step."""
    @property
    def step(self) -> int:
        """The step next() returns next."""
    @property
    def batch_len(self) -> int:
        """Indices per batch."""
    def state(self) -> dict[str, Any]:
        """The resumable state."""

class BatchBuffer:
    """Owner of a pooled batch buffer lent to NumPy (the arrays' base object)."""

class Loader:
    """The Rust step pipeline behind zring.DataLoader."""

    def __init__(
        self,
        streams: list[tuple[str, Store, Optional[int]]] | list[list[tuple[str, Store, Optional[int]]]],
        *,
        batch_size: Optional[int] = None,
        mode: Optional[int] = None,
        seed: Optional[int] = None,
        shard: Optional[tuple[int, int]] = None,
        depth: int = 4,
        threads: int = 4,
        state: Optional[str] = None,
        weights: Optional[list[float]] = None,
        pack: Optional[
            tuple[int, str, int, int, bool, bool, bool, Optional[int], Optional[int], list[tuple[int, bool, str]]]
        ] = None,
        block_records: Optional[int] = None,
        window_blocks: Optional[int] = None,
    ) -> None:
        """With weights, a mixture: streams is one list of streams per source.
        Without state, batch_size is required (mode defaults to 1, seed to
        42); with it, a batch_size, mode or seed that differs from the
        state's raises ValueError. With pack=(seq_len, "concat" |
        "first_fit", pad_bits, token_bytes, signed, labels, mask_boundaries,
        eod_bits, bos_bits, [(token_bytes, signed, name) per source]), packed token
        rows: each source is one ragged stream of documents, and batches have
        the columns tokens, segment_ids and positions (then labels and
        loss_mask with labels)."""
    def next(
        self,
    ) -> tuple[
        int,
        npt.NDArray[np.uint64],
        list[tuple[str, npt.NDArray[np.uint8], Optional[npt.NDArray[np.uint64]]]],
        Optional[npt.NDArray[np.uint32]],
    ]:
        """Wait for the next step: (step, indices, [(name, data, offsets)], sources or None)."""
    def state(self) -> dict[str, Any]:
        """The resumable state (with each stream's fingerprint)."""
    def state_at(self, step: int) -> dict[str, Any]:
        """The state that resumes at step."""
    def delivered_in_cycle(self, step: int) -> list[tuple[npt.NDArray[np.uint64], int]]:
        """Per source, the records delivered in the cycle under way before step (documents begun,
        for packed rows) and that cycle's records: for zring.elastic."""
    def batch_len(self) -> int:
        """Records per delivered batch."""
    def stats(self) -> dict[str, Any]:
        """Pipeline statistics."""
    def close(self) -> None:
        """Stop the gather threads."""
    @property
    def closed(self) -> bool:
        """Whether close() has been called."""

def mixture_allocation(weights: Sequence[float], batch_size: int, rows: int) -> list[int]:
    """Each source's rows among the first rows of a mixture at batch_size rows per batch."""
def import_loaderx(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Any:
    """Convert the loaderx store at src into a new zring store at dst (its table sealed in format 2)."""
def set_cache_bytes(cache_bytes: Optional[int]) -> Optional[int]:
    """State the memory budget of this process's store data in bytes (None
    withdraws it); returns the statement it replaces. The process has one
    budget: the latest statement still live. This call's lives until it is
    made again; each store opened with ``cache_bytes=`` and each DataLoader
    with ``cache_bytes=`` states one that lives until it closes, in any
    order. With none live, ``ZRING_CACHE_BYTES``, else the measured budget."""

class BudgetStatement:
    """A budget statement that lives until :meth:`release` (a DataLoader's ``cache_bytes``)."""
    @property
    def bytes(self) -> int:
        """The bytes stated."""
    @property
    def live(self) -> bool:
        """Whether release() has not been called."""
    def release(self) -> None:
        """Withdraw the statement; the budget returns to the latest one still live."""

def state_cache_bytes(cache_bytes: int) -> BudgetStatement:
    """State ``cache_bytes`` as the process's budget until the statement's release()."""
def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise FileExistsError unless path may be replaced by a new store
    (overwrite=True): a zring store (a head.zr that reads as one), a loaderx
    store, a directory of stores, an empty directory, or nothing at all.
    Nothing is changed."""
class Parts:
    """A dataset of parts (a folder with a manifest.json) read as one store:
    the read methods of Store. Opening checks every part against the manifest."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cache_bytes: Optional[int] = None,
        rank_parts: Optional[tuple[int, int]] = None,
    ) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def writable(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def generation(self) -> int:
        """The manifest's generation (commits so far)."""
    def parts_list(self) -> list[dict[str, Any]]:
        """The parts read: dir, records, content, start, number, whole_start (the first record's index in the
        whole dataset, for a rank's share)."""
    def __len__(self) -> int: ...
    def lengths(self, idx: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]: ...
    def gather(self, idx: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8], stride: int) -> None: ...
    def gather_var(self, idx: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8], offsets: npt.NDArray[np.uint64]) -> None: ...
    def fingerprint(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, Any]: ...
    def read_stats(self) -> dict[str, Any]: ...
    def verify(self) -> dict[str, Any]: ...
    def schema(self) -> Optional[str]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Parts": ...
    def __exit__(self, *exc: Any) -> None: ...

class PartWriter:
    """The dataset's staging/ held by descriptor (and a job's lock, shared) while open."""
    def __init__(self, dataset: str | os.PathLike[str], job: Optional[str] = None) -> None: ...
    @property
    def staging(self) -> str: ...
    def finish(self, name: str) -> tuple[int, str, Optional[str]]:
        """(records, content as 8 hex digits, schema as the manifest keeps it) of staged part name."""
    def adopt(self, src: str | os.PathLike[str], name: str) -> tuple[int, str, Optional[str]]:
        """Move the complete store at src into staging/ as part name; what finish returns."""
    def set_schema(self, name: str, json: str) -> None:
        """Replace staged part name's schema.json (its records unchanged)."""
    def close(self) -> None: ...
    def __enter__(self) -> "PartWriter": ...
    def __exit__(self, *exc: Any) -> None: ...

class JobHold:
    """A job's lock in a dataset, held shared until close()."""
    def __init__(self, dataset: str | os.PathLike[str], job: str) -> None: ...
    def close(self) -> None: ...

def abandon_job(dataset: str | os.PathLike[str], job: str) -> None:
    """Remove what job staged in the dataset; nothing committed is touched."""

def manifest_schema(path: str | os.PathLike[str]) -> Optional[str]:
    """The schema the manifest at path records (JSON without the codec), or None."""

def rank_plan(path: str | os.PathLike[str], ranks: int) -> list[tuple[str, int, int, Optional[int]]]:
    """(dir, records, rank, decoded bytes or None) of every committed part, from the manifest alone."""

def commit_parts(requests: Sequence[tuple[str | os.PathLike[str], Sequence[tuple[str, int, str]], bool]],
                 job: Optional[str] = None, older_than: Optional[float] = None,
                 keep_staged: bool = False) -> list[tuple[int, list[str]]]:
    """Commit staged parts ((name, records, content)) to each dataset (overwrite or append), all checked
    before any is applied; (generation, warnings) per dataset."""

def manifest_parts(path: str | os.PathLike[str]) -> list[tuple[str, int, str]]:
    """The parts the manifest at path lists ((dir, records, content)), its checksum checked; parts not opened."""

# The object-storage tier (zring.remote): built with the `remote` feature,
# on by default. options is a list of (key, value) storage options.

def is_url(s: str) -> bool:
    """Whether s is an object-storage URL (s3://, gs://, az://, file://)."""

def cache_name(url: str) -> str:
    """The folder a cache keeps url's dataset in."""

def stage(
    url: str,
    cache: str | os.PathLike[str],
    options: Sequence[tuple[str, str]],
    rank: Optional[tuple[int, int]] = None,
    cache_bytes: Optional[int] = None,
    progress: Optional[Callable[[int, int], object]] = None,
    lazy: bool = False,
) -> dict[str, Any]:
    """Stage url's dataset (or rank (rank, ranks)'s share) into cache; returns
    path, share_bytes, fetched_bytes, fetched_objects, reused_objects,
    removed_bytes, and the request counters requests, http_attempts,
    throttles, server_errors, failed_connections and request_errors. progress(done, total) is
    called at most every 0.2 s. lazy: fetch the small files only and leave
    the chunk files as holes, to be filled by a LineCache."""

class CacheHold:
    """A process's hold on a staged dataset: no other stage evicts it while held."""
    def __init__(self, cache: str | os.PathLike[str], url: str) -> None: ...
    def close(self) -> None:
        """Release the hold."""

class LineCache:
    """The line cache of a dataset of parts staged lazily: its chunk files
    filled line by line as they are read, within the cap."""
    def __init__(
        self,
        parts: Parts,
        url: str,
        options: Sequence[tuple[str, str]],
        cache: str | os.PathLike[str],
        cap: int,
    ) -> None:
        """Make the line cache of url staged lazily in cache the fill of the open dataset parts."""
    def stats(self) -> dict[str, Any]:
        """lines_fetched, bytes_fetched, lines_evicted, bytes_evicted,
        fills_hit, fills_fetched, fetch_seconds, cache_used_bytes, cache_cap_bytes,
        and the request counters (see stage)."""

def upload_part(
    url: str, options: Sequence[tuple[str, str]], local: str | os.PathLike[str], name: str
) -> int:
    """Upload the local store local as part name of the dataset at url; the bytes uploaded."""

def upload_store(url: str, options: Sequence[tuple[str, str]], local: str | os.PathLike[str]) -> int:
    """Upload the local store local to url itself; the bytes uploaded."""

def commit(
    url: str,
    options: Sequence[tuple[str, str]],
    parts: Sequence[tuple[str, int, str, Optional[str], Optional[int]]],
    overwrite: bool,
) -> tuple[int, int, list[str]]:
    """Commit uploaded parts ((name, records, content, schema JSON or None)) to
    the dataset at url with a conditional write of its manifest; (generation,
    retries, warnings)."""

def remove_unlisted(url: str, options: Sequence[tuple[str, str]], names: Sequence[str]) -> list[str]:
    """Remove the uploaded parts names that the manifest at url does not list; the names removed."""

def list_objects(url: str, options: Sequence[tuple[str, str]], sub: str) -> list[tuple[str, int, str]]:
    """(key, size, etag) of every object under sub of url."""

def stat_object(url: str, options: Sequence[tuple[str, str]], key: str) -> Optional[tuple[int, str]]:
    """(size, etag) of the object key under url, or None if there is none."""

# Built with the `bench` feature only (`make bench`).
def ceiling(kind: str, src: np.ndarray, item_len: int, threads: int, level: int = 3) -> float:
    """MiB/s of `threads` threads doing only `kind` ("compress", "decode",
    "memcpy", "crc" or "memcpy+crc") on the records of `item_len` bytes in `src` (benchmarks)."""
    ...
