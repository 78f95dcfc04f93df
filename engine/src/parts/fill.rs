//! Parts whose files are filled before they are read.
//!
//! A dataset in object storage is read through a cache folder on local
//! disk laid out as the dataset itself, whose chunk files may hold only
//! the lines fetched so far (the rest are holes). The engine reads it as
//! any dataset, once something ([`Fill`], the remote tier's line cache)
//! has made the bytes a read needs present: [`Parts::gather`](super::Parts::gather) asks for the
//! bytes of its records and reads while they are pinned, and a loader in
//! mode 3 asks for each window's bytes ahead of its steps
//! ([`Parts::fill_ranges`](super::Parts::fill_ranges)) and tells what windows come next
//! ([`Parts::plan`](super::Parts::plan)), which is what the cache evicts by. The dataset's
//! side (`Parts::set_fill` and the extents of records) is in `gather.rs`.

use std::ops::Range;
use std::path::PathBuf;

use crate::error::Result;

/// Bytes of a file of the dataset: its path relative to the dataset's
/// folder, and the byte range.
pub type Extent = (PathBuf, Range<u64>);

/// What a fill returns: the bytes stay present while it is held.
pub struct Pinned(pub Box<dyn Send + Sync>);

/// Makes bytes of a dataset's files present before they are read.
pub trait Fill: Send + Sync {
    /// Makes `extents` present and keeps them so until the result drops.
    fn fill(&self, extents: &[Extent]) -> Result<Pinned>;
    /// The windows to be read next, in order, the one being read first:
    /// what a cache keeps and evicts by (furthest next use out first).
    fn plan(&self, windows: &[Vec<Extent>]);
}
