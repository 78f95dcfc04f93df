//! Parts whose files are filled before they are read.
//!
//! A dataset in object storage is read through a cache folder on local
//! disk laid out as the dataset itself, whose chunk files may hold only
//! the lines fetched so far (the rest are holes). The engine reads it as
//! any dataset, once something ([`Fill`], the remote tier's line cache)
//! has made the bytes a read needs present: [`Parts::gather`] asks for the
//! bytes of its records and reads while they are pinned, and a loader in
//! mode 3 asks for each window's bytes ahead of its steps
//! ([`Parts::fill_ranges`]) and tells what windows come next
//! ([`Parts::plan`]), which is what the cache evicts by.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use super::open::Parts;
use crate::error::{Error, Result};

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

impl Parts {
    /// Has `fill` make every part's bytes present before they are read
    /// (once; a second call is an error).
    pub fn set_fill(&self, fill: Arc<dyn Fill>) -> Result<()> {
        self.fill.set(fill).map_err(|_| Error::InvalidArgument("the dataset has a fill already".into()))
    }

    /// Whether the dataset's files are filled before reads ([`Parts::set_fill`]).
    pub fn has_fill(&self) -> bool {
        self.fill.get().is_some()
    }

    fn rel(&self, k: usize, file: String) -> PathBuf {
        PathBuf::from(&self.manifest.parts[self.numbers[k]].dir).join(file)
    }

    /// The extents of the records `indices` (dataset indices), one a record.
    pub fn extents_of(&self, indices: &[u64]) -> Result<Vec<Extent>> {
        let mut by_part: Vec<(usize, Vec<u64>)> = Vec::new();
        for &i in indices {
            let (k, l) = self.locate(i)?;
            match by_part.iter_mut().find(|(p, _)| *p == k) {
                Some((_, v)) => v.push(l),
                None => by_part.push((k, vec![l])),
            }
        }
        let mut out = Vec::with_capacity(indices.len());
        for (k, local) in by_part {
            let store = self.store(k)?;
            out.extend(store.extents(&local)?.into_iter().map(|(f, r)| (self.rel(k, f), r)));
        }
        Ok(out)
    }

    /// The extents of the record `ranges` (dataset indices), few per range
    /// ([`Store::range_extents`](crate::Store::range_extents)).
    pub fn extents_of_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        for r in ranges {
            let mut i = r.start;
            while i < r.end {
                let (k, l) = self.locate(i)?;
                let end = (self.start(k) + self.part_records(k)).min(r.end);
                let store = self.store(k)?;
                out.extend(store.range_extents(l..l + (end - i))?.into_iter().map(|(f, r)| (self.rel(k, f), r)));
                i = end;
            }
        }
        Ok(out)
    }

    /// Fills the bytes of `indices` if the dataset has a fill; held, they
    /// stay present.
    pub fn fill_indices(&self, indices: &[u64]) -> Result<Option<Pinned>> {
        let Some(f) = self.fill.get() else { return Ok(None) };
        f.fill(&self.extents_of(indices)?).map(Some)
    }

    /// Fills the bytes of the record `ranges` if the dataset has a fill.
    pub fn fill_ranges(&self, ranges: &[Range<u64>]) -> Result<Option<Pinned>> {
        let Some(f) = self.fill.get() else { return Ok(None) };
        f.fill(&self.extents_of_ranges(ranges)?).map(Some)
    }

    /// Tells the fill the windows read next (record ranges each, in order,
    /// the one being read first); nothing without a fill.
    pub fn plan(&self, windows: &[Vec<Range<u64>>]) -> Result<()> {
        let Some(f) = self.fill.get() else { return Ok(()) };
        let ext: Result<Vec<Vec<Extent>>> = windows.iter().map(|w| self.extents_of_ranges(w)).collect();
        f.plan(&ext?);
        Ok(())
    }
}
