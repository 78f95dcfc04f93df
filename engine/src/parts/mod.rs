//! Datasets of parts: a folder of ordinary stores and a manifest that lists
//! the committed ones in order, read as one index space.
//!
//! A dataset too large for one writer is written in parts, each by its own
//! process (a Ray or Spark task, a `multiprocessing` worker), each part an
//! ordinary store in its own directory. The dataset is the list of parts its
//! manifest names; a part is readable as a dataset of its own too.
//!
//! # The manifest
//!
//! `manifest.json` at the dataset's root, with a CRC-32C member first as
//! `schema.json` has (`format/schema.rs`):
//!
//! ```text
//! {
//!   "crc32c": "1a2b3c4d",
//!   "format": "zring-parts",
//!   "version": 1,
//!   "generation": 3,
//!   "schema": { ...the parts' schema.json members... } or null,
//!   "parts": [
//!     {"dir": "parts/p-000000-<id>", "records": 1000, "content": "5f3a9c01"},
//!     ...
//!   ]
//! }
//! ```
//!
//! `generation` counts the commits. `dir` is relative to the dataset's root;
//! `records` and `content` are the part's [`Fingerprint`](crate::Fingerprint) when it was
//! committed. `schema` is what every part's `schema.json` holds, but for its
//! `"codec"` member (parts may be written with different codecs).
//!
//! A commit replaces the manifest atomically (written beside it, synced,
//! renamed over it, the directory synced). An *append* commit lists the old
//! parts first, in the same order, with the same fingerprints: the dataset
//! only grows, so a loader state saved over one generation resumes over a
//! later one ([`Parts::extends`]). Only an explicit overwrite writes a list
//! that is not a continuation of the old one.
//!
//! # Reading
//!
//! [`Parts::open`] reads the manifest and opens every part once to check it:
//! a part missing, not a store, holding other records than the manifest says
//! (its fingerprint differs) or described by another schema is an error
//! naming its directory; nothing is skipped. Record `i` of the dataset is
//! record `i - start(k)` of part `k`, found by binary search over the
//! parts' cumulative counts ([`Parts::locate`]).
//!
//! A hot random batch touches a couple of hundred parts. What it reads of
//! each is kept in arrays of the dataset, not in each part's objects (its
//! store, snapshot, table, chunk: scattered allocations, each a cache miss
//! per part touched): the small parts' table entries, copied while the
//! dataset opens (`Dense`), and each open part's chunk mapping, a cache
//! line per part in the open set (`Open::maps`, `crate::io::mapset`), taken
//! out when the part closes for room and put back when it opens again.
//!
//! Each open store holds two descriptors (its table and its pins file), and
//! its chunk files' descriptors live in the process's shared cache
//! (`io/fds.rs`). So the parts are kept open in a bounded set, least
//! recently used out: [`open_capacity`] stores, an eighth of the soft
//! `RLIMIT_NOFILE` in descriptors. A part evicted is opened again (and its
//! fingerprint checked again) when next read; a gather in flight keeps the
//! store it uses.
//!
//! The dataset's fingerprint is its record count and a CRC-32C over the
//! parts' fingerprints in order ([`Parts::fingerprint`]), so it changes when
//! any part does, and a dataset grown by an append commit
//! [extends](Parts::extends) the one before.
//!
//! # Writing
//!
//! Parts are staged by their writers and committed by one driver; every
//! file of the dataset is reached through its folder's descriptor, and the
//! commit has one owner, [`commit`] (`commit.rs`, whose docs give the
//! folder's layout, the commit's steps and what is removed when).
//!
//! The code: `manifest.rs` (the manifest's form), `commit.rs` (staging,
//! committing, cleaning up), `open.rs` (the open set of parts), `dense.rs`
//! (small parts' table entries in one array), `gather.rs` (a gather over
//! parts), `fill.rs` (parts whose files are filled before a read: a cache
//! of a dataset in object storage).

mod commit;
mod dense;
mod fill;
mod gather;
mod manifest;
mod open;
#[cfg(test)]
mod tests;

pub use commit::{
    abandon, commit, commit_manifest, valid_job, valid_part_name, Committed, JobHold, Mode, Options, PartWriter,
    Request, Staged, KEEP_DROPPED,
};
pub use fill::{Extent, Fill, Pinned};
pub use manifest::{
    is_parts, placement_weights, read_manifest, schema_of, Manifest, PartEntry, DROPPED_DIR, MANIFEST_FILE, PARTS_DIR,
    STAGING_DIR,
};
pub use open::{assign_ranks, open_capacity, OpenPart, Parts};
