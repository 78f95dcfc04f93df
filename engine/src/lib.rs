//! zring-engine: the persistent record store behind zring.
//!
//! A store is a directory. Records (byte strings) live densely packed in chunk
//! files; a record table maps each index to its chunk, offset, stored and
//! logical lengths, codec and crc32c; a 64-byte head names the committed table
//! generation and chunk range. Each record is compressed on its own — raw,
//! zstd, or zstd against a dictionary trained on the data — so any record can
//! be read alone. The byte layout and the crash-safety argument are in
//! `engine/DESIGN.md`.
//!
//! A gather validates every index first, then submits the batch's reads as
//! batched positional reads (io_uring, or `pread` where io_uring is
//! unavailable) from each thread of a small pool; each thread checks and
//! decodes its records straight into their slots of the caller's buffer as its
//! completions arrive. Raw records read through the page cache land in their
//! slot with no copy at all. For data larger than memory, reads bypass the page
//! cache (O_DIRECT) into aligned scratch.
//!
//! # Overview of types and modules
//! - [`Store`], opened through [`StoreBuilder`] ([`Store::builder`]): gather,
//!   append, sync, delete, compact, stats, verify.
//! - [`Codec`]: raw, zstd, zstd with dictionary; tags shared with loaderx 0.7.3.
//! - [`Error`]: every failure, typed, with the numbers that explain it.
//! - [`import_loaderx`]: converts a loaderx 0.7.3 store; loaderx stores can
//!   also be opened and gathered from directly ([`Format::Loaderx`]).
//! - [`BackendKind`]: io_uring or pread, chosen automatically.
//!
//! # Trade-offs
//! - One writer at a time (an advisory lock); readers never block. Appends are
//!   visible to the writing handle at once and durable after [`Store::sync`]; a
//!   crash loses unsynced appends and nothing else.
//! - Delete keeps the index space dense by moving the last record into each
//!   hole, as loaderx does: a sampler over `0..len` never hits a hole, but
//!   survivors may change index.
//! - The record table and hot chunks are memory-mapped. Files are never
//!   modified in place once published, so mapped readers in other processes
//!   stay consistent; a file that shrinks under a reader anyway (another
//!   program, a network file system, an unreadable page) gives an error, not a
//!   SIGBUS (a guard maps zeros over the lost pages and the read is refused).
//!
//! ```
//! use zring_engine::{Codec, Store};
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::builder(dir.path()).codec(Codec::Zstd).create().unwrap();
//! let first = store.append(&[b"hello".as_slice(), b"world".as_slice()], None).unwrap();
//! store.sync().unwrap();
//! let mut dst = [0u8; 10];
//! store.gather(&[first + 1, first], &mut dst, 5).unwrap();
//! assert_eq!(&dst, b"worldhello");
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod admin;
mod append;
mod budget;
mod cache;
mod codec;
mod compact;
mod error;
pub mod fault;
#[allow(unsafe_code, reason = "raises the soft RLIMIT_NOFILE through libc; the block has its SAFETY argument")]
mod fds;
mod fingerprint;
#[allow(unsafe_code, reason = "registers the pthread_atfork handlers; the block has its SAFETY argument")]
mod fork;
mod fs;
mod head;
mod hot;
mod memory;
#[allow(
    unsafe_code,
    reason = "memory-maps tables and chunks under the SIGBUS guard; the invariant is argued at the unsafe call"
)]
mod mmap;
#[allow(
    unsafe_code,
    reason = "takes open file description locks through libc::fcntl; every block has its SAFETY argument"
)]
mod pins;

mod pool;
#[allow(
    unsafe_code,
    reason = "counts the host's ranks with libc::fcntl lock queries; the block has its SAFETY argument"
)]
mod ranks;
mod reads;
mod record;
#[allow(
    unsafe_code,
    reason = "installs the SIGBUS handler and maps zero pages over a faulted mapping; every block has its SAFETY argument"
)]
mod sigbus;
mod store;
mod table;
#[allow(unsafe_code, reason = "hands raw buffer pointers to io_uring and pread; every block has its SAFETY argument")]
mod uring;
mod write;

pub use admin::{import_loaderx, Stats, VerifyReport};
pub use cache::NextUse;
pub use codec::Codec;
pub use compact::CompactReport;
pub use error::{Error, Result};
pub use fingerprint::Fingerprint;
pub use head::FORMAT_VERSION;
pub use pool::{set_thread_fan_out, thread_fan_out};
pub use reads::ReadStats;
pub use record::ChunkId;
pub use store::{Store, StoreBuilder, DEFAULT_CHUNK_BYTES, DEFAULT_DICT_LEVEL, DEFAULT_LEVEL};
pub use table::Format;
pub use uring::BackendKind;
pub use write::MAX_RECORD_BYTES;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
