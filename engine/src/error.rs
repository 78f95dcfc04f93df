//! The engine's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the store. Each variant carries the numbers
/// that explain it, so a message read in a training log says what to fix.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system call failed. `op` names what the store was doing.
    #[error("{op} {path}: {source}")]
    Io {
        /// What the store was doing ("open", "read", "write", "fsync", ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The error the operating system returned.
        #[source]
        source: std::io::Error,
    },
    /// The directory holds no zring store (nor a loaderx store).
    #[error("{path} is not a zring store: {reason}")]
    NotAStore {
        /// The directory that was opened.
        path: PathBuf,
        /// What was missing or wrong.
        reason: String,
    },
    /// The store was written by a format version this build cannot read.
    #[error("{path}: format version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// The file whose version is unknown.
        path: PathBuf,
        /// The version found on disk.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// Bytes on disk contradict the store's own metadata (a torn or damaged file).
    /// Run `verify()` for a full scan; restore the store from a copy.
    #[error("corrupted store: {what}: {detail}")]
    Corrupted {
        /// Which structure is damaged ("head", "table entry 17", "chunk 3").
        what: String,
        /// What was found instead of what was expected.
        detail: String,
    },
    /// A record's bytes do not match the checksum in its table entry.
    #[error("record {record} in {file}: checksum mismatch (table says {expected:#010x}, data gives {got:#010x})")]
    ChecksumMismatch {
        /// The record index.
        record: u64,
        /// The chunk file holding its bytes (with the byte range checked).
        file: String,
        /// The crc32c stored in the table.
        expected: u32,
        /// The crc32c of the bytes read.
        got: u32,
    },
    /// An index is not below the store's length.
    #[error("index {index} is out of range for a store of {len} records")]
    IndexOutOfRange {
        /// The offending index.
        index: u64,
        /// The store's length.
        len: u64,
    },
    /// A record does not fit the slot the caller gave it.
    #[error("record {record} is {len} bytes but its slot holds {slot} bytes")]
    RecordSize {
        /// The record index.
        record: u64,
        /// The record's logical length.
        len: u64,
        /// The room in the destination.
        slot: u64,
    },
    /// Another writer holds the store's lock.
    #[error("{path} is locked by another writer (one writer at a time; readers may open it read-only)")]
    Locked {
        /// The store directory.
        path: PathBuf,
    },
    /// A reader could not pin its snapshot's chunks: another process held a
    /// write lock on them in the store's `pins` file for the whole bounded
    /// wait (`ZRING_LOCK_WAIT_MS`, 5 s by default). A writer holds one only
    /// for the instant it removes a chunk, so the holder is stuck or
    /// hostile; only those who may write `pins` can hold one.
    #[error(
        "{path}: another process has held a write lock on chunks {first}..{end} for {waited_ms} ms (a writer \
         removes a chunk in an instant); find it with `fuser -v {path}` and end it, or set ZRING_LOCK_WAIT_MS to \
         wait longer"
    )]
    PinWait {
        /// The store's `pins` file.
        path: PathBuf,
        /// The first chunk id of the snapshot.
        first: u32,
        /// One past its last chunk id.
        end: u64,
        /// How long the reader waited.
        waited_ms: u64,
    },
    /// The store was opened read-only (or is a loaderx store, which zring only reads).
    #[error("the store is read-only: {0}")]
    ReadOnly(String),
    /// An argument is malformed; the message says what was expected.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A `zstd_dict` record was requested but the store has no dictionary.
    #[error("the store has no zstd dictionary: call train_dict before appending zstd_dict records")]
    NoDictionary,
    /// An earlier write or fsync failed; the writer refuses further writes because
    /// what reached the disk is unknown. Reopen the store to recover the last synced state.
    #[error(
        "the store's writer refuses further writes after an earlier failure ({0}): what reached the disk is \
         unknown; open the store again to continue from its last synced state"
    )]
    Poisoned(String),
    /// The handle's snapshot can no longer be read: the store at its path was
    /// replaced (`overwrite=True`, or deleted and written again), or files its
    /// snapshot names were removed by something that does not honour readers'
    /// pins. Reopen the store to read what is there now.
    #[error("{path}: the store changed under this handle: {detail}; reopen it to read the store as it is now")]
    Stale {
        /// The store directory.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// `create` found a store (or other files) already there.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The directory.
        path: PathBuf,
    },
    /// A replace (`overwrite=True`) found something at the destination that
    /// is not a store, a directory of stores or an empty directory; nothing
    /// was removed.
    #[error(
        "{path} exists and is not a zring store ({reason}); nothing was removed: overwrite=True (a replace) only \
         replaces a store, a directory of stores or an empty directory; move it away or choose another path"
    )]
    NotReplaceable {
        /// The destination.
        path: PathBuf,
        /// What was found there.
        reason: String,
    },
}

/// Result alias of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

pub(crate) fn corrupted(what: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Corrupted { what: what.into(), detail: detail.into() }
}
