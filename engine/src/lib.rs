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
//!   append, sync, delete, compact, seal, stats, verify.
//! - [`Staging`] and [`StagedStore`] ([`StoreBuilder::create_staged`]): a
//!   store (or a directory of stores) built beside its destination and
//!   renamed into place whole.
//! - [`View`] ([`Store::view`]): one snapshot's reads; [`View::read_spans`]
//!   reads parts of records ([`Spans`]: a short span of a raw record reads
//!   only its bytes, unchecked against the record's crc32c).
//! - [`Codec`]: raw, zstd, zstd with dictionary; tags shared with loaderx 0.7.3.
//! - [`Error`]: every failure, typed, with the numbers that explain it.
//! - [`import_loaderx`]: converts a loaderx 0.7.3 store; loaderx stores can
//!   also be opened and gathered from directly ([`Format::Loaderx`]).
//! - [`BackendKind`]: io_uring or pread, chosen automatically.
//!
//! Inside, one folder per job or owner, and `store.rs` the façade that ties
//! them (it hands each part a narrow context, `read::Ctx` and `write::Ctx`,
//! never the whole `Store`):
//! - `format/`: what is on disk: head, record table, entries, codecs, file
//!   names and constants, the content fingerprint.
//! - `snapshot/`: the published snapshot and its loading (`mod.rs`), the
//!   chunk files (`chunk`), the cell a handle publishes it in (`cell`), and
//!   the pins that keep a snapshot's files (`pins`).
//! - `memory/`: the process's one owner of memory (`owner`), the budget
//!   (`budget`), the read policy (`policy`), the record caches (`cache`),
//!   each store's read counters (`reads`), the host's rank registry (`ranks`).
//! - `read/`: the read requests (`request`), gathers and reads of spans
//!   (`gather`, `item`, `hot`) and mode 3's block loads (`blocks`).
//! - `write/`: the single writer, append and sync (`mod.rs`), the encoding
//!   pipeline (`append`), delete and compaction (`compact`), the format-2
//!   table of a store written once (`seal`), the staging directory (`builder`).
//! - `io/`: io_uring and pread (`uring`), the file-operation seam (`fs`,
//!   `fault`), chunk descriptors (`fds`), mappings and the SIGBUS guard
//!   (`mmap`, `sigbus`), slabs (`slab`), OFD locks (`locks`), per-process
//!   values and exit handlers (`process`); with `format/crc.rs` and `fork.rs`
//!   the only places with `unsafe`.
//! - `env.rs` (every environment variable, in one table), `fork.rs` (the fork
//!   gate), `pool.rs` (the decode pool), `admin.rs` (stats, verify,
//!   dictionaries, schema, loaderx import).
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
//! store.gather(&zring_engine::Gather::fixed(&[first + 1, first], 5), &mut dst).unwrap();
//! assert_eq!(&dst, b"worldhello");
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod admin;
mod env;
mod error;
#[allow(unsafe_code, reason = "registers the pthread_atfork handlers; the block has its SAFETY argument")]
mod fork;
pub(crate) mod format;
pub(crate) mod io;
pub(crate) mod memory;
pub mod parts;
mod pool;
pub(crate) mod read;
pub(crate) mod snapshot;
mod store;
pub(crate) mod write;

/// CPU time of threads, for a loader's statistics: the calling thread's
/// own, that of the decode pool's threads working on its gathers, and any
/// thread's of this process by its id.
pub mod cpu {
    pub use crate::io::process::{task_cpu_ns, thread_cpu_ns, thread_id};
    pub use crate::read::gather::helped_ns;
}

pub use admin::{Stats, VerifyReport};
pub use error::{Error, Result};
pub use format::codec::Codec;
pub use format::crc::copy_crc32c;
pub use format::fingerprint::Fingerprint;
pub use format::names::FORMAT_VERSION;
pub use format::record::ChunkId;
pub use format::table::Format;
pub use io::fault;
pub use io::uring::BackendKind;
pub use memory::cache::NextUse;
pub use memory::owner::{set_cache_bytes, state_cache_bytes, Statement as BudgetStatement};
pub use memory::reads::ReadStats;
pub use parts::{Manifest, PartEntry, Parts};
pub use read::request::{Gather, Slots, Span, Spans};
pub use store::{
    import_loaderx, StagedStore, Store, StoreBuilder, View, DEFAULT_CHUNK_BYTES, DEFAULT_DICT_LEVEL, DEFAULT_LEVEL,
};
pub use write::builder::{check_replaceable, Staging};
pub use write::compact::CompactReport;
pub use write::MAX_RECORD_BYTES;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
