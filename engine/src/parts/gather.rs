//! A gather over the parts of a dataset ([`Parts::gather`]), and what it
//! asks of a [`Fill`] first (the extents of its records).

use std::sync::atomic::Ordering::Relaxed;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use super::dense::DENSE_BYTES;
use super::fill::{Extent, Fill, Pinned};
use super::open::{OpenPart, Parts};
use crate::error::{Error, Result};
use crate::read::request::{Gather, Slots};

impl Parts {
    /// Reads the records of `req` into `dst` as [`Store::gather`](crate::Store::gather) does,
    /// `req.indices` being indices of the dataset, with the same checks
    /// (every index, entry and slot, the checksum of every record read).
    ///
    /// A batch touching many parts is one gather (`read::gather::gather_over`):
    /// the records are located and checked in one pass; those in memory
    /// are copied straight from their part's mappings (with the decode pool
    /// for a batch worth it) and counted into the dataset's pending counts,
    /// each part's reads counted every few hundred of its records; the
    /// other records of parts read buffered go out in one batch of reads
    /// for all parts; a part read through its record cache, and a part's
    /// share large enough for the decode pool, are read as that store's
    /// gather reads them. The parts are taken
    /// open (opened if need be) a few at a time, at most a quarter of the
    /// open set at once; a call over more parts than that checks and reads
    /// one group of parts after the other, so an error in a later group can
    /// come after an earlier group's slots were written.
    pub fn gather(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
        // A cache of object storage: the records' bytes present, and kept
        // so until the gather is done.
        let _pinned = self.fill_indices(req.indices)?;
        if self.gather_hot(req, dst)? {
            return Ok(());
        }
        let n = req.indices.len();
        let mut located = Vec::with_capacity(n);
        for &i in req.indices {
            located.push(self.locate(i)?);
        }
        // The parts touched, in order, and the slot of each record's part.
        let mut touched: Vec<usize> = located.iter().map(|&(k, _)| k).collect();
        touched.sort_unstable();
        touched.dedup();
        // Every record's entry from the dataset's copy, when all its parts
        // are in it (`Dense`).
        let dense: Option<Vec<crate::format::record::Entry>> = self.dense.as_ref().and_then(|d| {
            touched.iter().all(|&k| d.ok[k].load(Relaxed)).then(|| req.indices.iter().map(|&i| d.entry(i)).collect())?
        });
        let group = (self.capacity / 4).max(1);
        if touched.len() <= group {
            let at: Vec<(usize, u64)> =
                located.iter().map(|&(k, l)| (touched.binary_search(&k).expect("touched"), l)).collect();
            {
                // Every part open (the usual case): read under the open
                // set's lock taken shared, no reference count touched.
                let _gate = crate::fork::enter();
                let open = self.read();
                let held: Option<Vec<&OpenPart>> =
                    touched.iter().map(|&k| open.slots.get(k).and_then(Option::as_deref)).collect();
                if let Some(held) = held {
                    let now = self.clock.load(Relaxed);
                    for &k in &touched {
                        self.stamps[k].store(now, Relaxed);
                    }
                    let sources = self.sources(&held, &touched);
                    let dense = dense.as_deref().map(|entries| crate::read::gather::Dense { entries });
                    return crate::read::gather::gather_over(&sources, &at, dense, req, dst);
                }
            }
            let open = self.parts_of(&touched)?;
            let held: Vec<&OpenPart> = open.iter().map(|p| &**p).collect();
            let sources = self.sources(&held, &touched);
            let dense = dense.as_deref().map(|entries| crate::read::gather::Dense { entries });
            return crate::read::gather::gather_over(&sources, &at, dense, req, dst);
        }
        // More parts than a group: each group's records as a gather of
        // their own, into the slots the caller gave them.
        let (starts, width) = match req.slots {
            Slots::Fixed(stride) => {
                if Some(dst.len()) != n.checked_mul(stride) {
                    return Err(Error::InvalidArgument(format!(
                        "gather: destination is {} bytes, expected {n} indices × stride {stride}",
                        dst.len()
                    )));
                }
                ((0..n as u64).map(|k| k * stride as u64).collect::<Vec<_>>(), Some(stride))
            }
            Slots::Ragged(starts) => (starts.to_vec(), None),
            Slots::FixedAt { width, starts } => (starts.to_vec(), Some(width)),
        };
        if starts.len() != n || !(req.next.is_empty() || req.next.len() == n) {
            return Err(Error::InvalidArgument(format!(
                "gather: {n} indices but {} slot starts and {} next-use hints",
                starts.len(),
                req.next.len()
            )));
        }
        for parts in touched.chunks(group) {
            let open = self.parts_of(parts)?;
            let held: Vec<&OpenPart> = open.iter().map(|p| &**p).collect();
            let sources = self.sources(&held, parts);
            let (mut idx, mut at, mut st, mut next) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut ents = Vec::new();
            for (p, &(k, l)) in located.iter().enumerate() {
                if let Ok(slot) = parts.binary_search(&k) {
                    if let Some(d) = &dense {
                        ents.push(d[p]);
                    }
                    idx.push(req.indices[p]);
                    at.push((slot, l));
                    st.push(starts[p]);
                    if !req.next.is_empty() {
                        next.push(req.next[p]);
                    }
                }
            }
            let slots = match width {
                Some(width) => Slots::FixedAt { width, starts: &st },
                None => Slots::Ragged(&st),
            };
            let g = Gather { indices: &idx, slots, next: &next, fan_out: req.fan_out };
            let dense = dense.as_ref().map(|_| crate::read::gather::Dense { entries: &ents });
            crate::read::gather::gather_over(&sources, &at, dense, &g, dst)?;
        }
        Ok(())
    }

    /// [`Parts::gather`] of records all in memory, of parts whose entries
    /// are in the dataset's copy ([`Dense`]) and whose mappings the open set
    /// keeps ([`Open::maps`]): each record's entry from the copy, its
    /// mapping from the open set's array, read under the open set's lock
    /// taken shared (`read::gather::gather_mapped`). `Ok(false)`, nothing
    /// counted, when that does not apply to every record (a part closed, a
    /// page not in memory, a record failing its checks): the caller reads
    /// the request the general way, which reports what failed.
    fn gather_hot(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<bool> {
        let Some(d) = &self.dense else { return Ok(false) };
        let _gate = crate::fork::enter();
        let open = self.read();
        let mut located = Vec::with_capacity(req.indices.len());
        for &i in req.indices {
            let (k, _) = self.locate(i)?;
            // The entry's and the part's lines, loaded while the next are located.
            if let Some(b) = d.bytes.get(i as usize * DENSE_BYTES) {
                crate::io::mmap::prefetch_line(b);
            }
            open.maps.prefetch_line(k);
            located.push(k);
        }
        let mut recs = Vec::with_capacity(req.indices.len());
        for (&i, &k) in req.indices.iter().zip(&located) {
            let Some(e) = d.entry(i).filter(|_| d.ok[k].load(Relaxed)) else { return Ok(false) };
            recs.push((k, e));
        }
        let flush = |k: usize| {
            if let Some(p) = &open.slots[k] {
                crate::read::gather::flush_mapped(&self.source(p, k));
            }
        };
        if crate::read::gather::gather_mapped(&open.maps, &open.dicts, &recs, &self.pending, &flush, req, dst).is_none()
        {
            return Ok(false);
        }
        let now = self.clock.load(Relaxed);
        for &k in &located {
            if self.stamps[k].load(Relaxed) != now {
                self.stamps[k].store(now, Relaxed);
            }
        }
        Ok(true)
    }

    /// What a gather reads parts `ks` with, `held[j]` being part `ks[j]`
    /// open: of each part, its snapshot and the dataset's own arrays, not its
    /// store (out of the CPU cache for most of hundreds of parts; read only
    /// for what records not in memory need).
    pub(super) fn sources<'a>(&'a self, held: &[&'a OpenPart], ks: &[usize]) -> Vec<crate::read::gather::Source<'a>> {
        held.iter().zip(ks).map(|(p, &k)| self.source(p, k)).collect()
    }

    pub(super) fn source<'a>(&'a self, p: &'a OpenPart, k: usize) -> crate::read::gather::Source<'a> {
        p.view.source(&self.pending[k], &self.ahead[k], &self.mapped[k])
    }
}

/// The side of the dataset a [`Fill`] works with (`fill.rs`): the extents
/// of records, and the fill asked before reads.
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
