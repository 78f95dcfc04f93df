//! Many small files' chunk mappings laid out for random gathers over all of
//! them at once: a dataset of parts (`crate::parts`), where a batch of 256
//! random records touches a couple of hundred parts.
//!
//! Each file's mapping lives in its own [`ChunkMap`], reached from its
//! snapshot's chunk through an `Arc`, a `OnceBox` and a box, with its
//! residency bitmap in an allocation of its own and its fault flag in the
//! SIGBUS registry: four or five cache lines in as many places, out of the
//! CPU cache for most parts of a random batch, each a stall of its own. A
//! [`MapSet`] keeps what a hot read needs of every file in one array of one
//! cache line per file (the mapping's address and length, its fault flag,
//! the eviction count its residency bits were confirmed under, where those
//! bits are), and all files' residency bits in a second array, as one
//! large file's are: a record is then one line of each array, its bytes and
//! its checksum.
//!
//! The addresses are raw. The set holds, beside each file's line, the `Arc`
//! that owns its mapping; a line is filled only with that `Arc` held
//! ([`MapSet::install`]) and emptied before it is dropped
//! ([`MapSet::remove`], both `&mut self`), and the bytes handed out borrow the
//! set ([`MapSet::resident`]): no borrowed byte outlives the mapping.
//!
//! The residency bits are the set's own, not the `ChunkMap`'s: they say what
//! the kernel said of the file's pages, under the same eviction-count rule
//! ([`Bits::at`]), so a stale bit costs a synchronous fault (the right
//! bytes, read slowly), never wrong bytes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use once_cell::race::OnceBox;

use crate::io::mmap::{resident_in, words_for, Bits, ChunkMap, Resident, PAGE};
use crate::io::prefetch::prefetch_line;
use crate::io::sigbus::Flag;

/// A chunk's mapping as a snapshot's chunk holds it (made on first use).
pub(crate) type MapCell = Arc<OnceBox<Option<ChunkMap>>>;

/// What a hot read needs of one file, in one cache line.
#[repr(C, align(64))]
struct Line {
    /// The mapping's first byte, as an address; 0 while no mapping is held.
    base: usize,
    /// The mapping's length in bytes.
    len: usize,
    /// The mapping's fault flag (set while `base` is not 0).
    flag: Option<Flag>,
    /// The eviction count the file's residency bits were last confirmed
    /// under ([`Bits::at`]).
    epoch: AtomicU64,
    /// The file's residency bits: `words` words from `word0` of
    /// [`MapSet::words`].
    word0: usize,
    words: usize,
    /// The caller's name for the file (a chunk id).
    tag: u32,
    /// The longest mapping the slot takes.
    cap: usize,
}

/// Mappings of many files, one slot each (module docs).
pub(crate) struct MapSet {
    lines: Box<[Line]>,
    words: Box<[AtomicU64]>,
    /// The owner of each slot's mapping while its line holds the mapping's
    /// address.
    owners: Box<[Option<MapCell>]>,
}

impl MapSet {
    /// A set of `lens.len()` empty slots, slot `k` able to hold a mapping of
    /// at most `lens[k]` bytes (its residency bits are kept for that many).
    pub fn new(lens: &[u64]) -> MapSet {
        let mut word0 = 0;
        let lines: Box<[Line]> = lens
            .iter()
            .map(|&len| {
                let cap = usize::try_from(len).unwrap_or(0);
                let words = words_for(cap);
                let line =
                    Line { base: 0, len: 0, flag: None, epoch: AtomicU64::new(u64::MAX), word0, words, tag: 0, cap };
                word0 += words;
                line
            })
            .collect();
        MapSet {
            lines,
            words: (0..word0).map(|_| AtomicU64::new(0)).collect(),
            owners: (0..lens.len()).map(|_| None).collect(),
        }
    }

    /// Fills slot `k` with the mapping `cell` holds, named `tag`, keeping
    /// `cell` until the slot is emptied; false (the slot left empty) when
    /// the mapping is not made (or could not be) or is longer than the
    /// slot. Nothing is remembered of the file's pages.
    pub fn install(&mut self, k: usize, cell: &MapCell, tag: u32) -> bool {
        self.remove(k);
        let Some(line) = self.lines.get_mut(k) else { return false };
        let Some(map) = cell.get().and_then(Option::as_ref) else { return false };
        let (bytes, flag) = map.parts();
        if bytes.len() > line.cap || words_for(bytes.len()) > line.words {
            return false;
        }
        for w in &self.words[line.word0..line.word0 + line.words] {
            w.store(0, Relaxed);
        }
        *line.epoch.get_mut() = u64::MAX;
        line.len = bytes.len();
        line.flag = Some(flag);
        line.tag = tag;
        line.base = bytes.as_ptr() as usize;
        self.owners[k] = Some(Arc::clone(cell));
        true
    }

    /// Empties slot `k` (its mapping's owner dropped after its address).
    pub fn remove(&mut self, k: usize) {
        if let Some(line) = self.lines.get_mut(k) {
            line.base = 0;
            line.len = 0;
            line.flag = None;
        }
        if let Some(owner) = self.owners.get_mut(k) {
            *owner = None;
        }
    }

    /// Slot `k`'s tag and mapping length, when it holds a mapping.
    #[inline]
    pub fn shape(&self, k: usize) -> Option<(u32, u64)> {
        let line = self.lines.get(k)?;
        (line.base != 0).then_some((line.tag, line.len as u64))
    }

    /// Starts loading into the CPU cache what [`MapSet::resident`] asks of
    /// slot `k` for bytes `offset..offset + len`, and what a copy of them
    /// reads first: the slot's residency word, its fault flag, and the first
    /// and last lines of the bytes (their pages' translations too; a
    /// prefetch of a page not in memory is dropped, it reads nothing in).
    #[inline]
    pub fn prefetch(&self, k: usize, offset: u64, len: usize) {
        let Some(line) = self.lines.get(k) else { return };
        let Some(flag) = line.flag else { return };
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        let page = offset / PAGE;
        if page / 64 < line.words {
            prefetch_line(&self.words[line.word0 + page / 64]);
        }
        flag.prefetch();
        let map = self.map(line);
        if let Some(first) = map.get(offset) {
            prefetch_line(first);
        }
        if let Some(last) = offset.checked_add(len.saturating_sub(1)).filter(|_| len > 64).and_then(|at| map.get(at)) {
            prefetch_line(last);
        }
    }

    /// Starts loading slot `k`'s line into the CPU cache.
    #[inline]
    pub fn prefetch_line(&self, k: usize) {
        if let Some(line) = self.lines.get(k) {
            prefetch_line(line);
        }
    }

    /// The bytes `offset..offset + len` of slot `k`'s mapping if the slot
    /// holds one, it has not faulted, and every page of them is in memory
    /// (as [`ChunkMap::resident_checked`] answers, from the set's own
    /// residency bits); ask [`Resident::faulted`] after using them.
    #[inline]
    pub fn resident(&self, k: usize, offset: u64, len: usize, epoch: Option<u64>) -> Option<Resident<'_>> {
        let line = self.lines.get(k)?;
        let flag = line.flag?;
        if line.base == 0 || flag.faulted() {
            return None;
        }
        let map = self.map(line);
        let bits = Bits { seen: &self.words[line.word0..line.word0 + line.words], epoch: &line.epoch };
        resident_in(map, bits, flag, usize::try_from(offset).ok()?, len, epoch)
    }

    /// The mapping `line` holds (empty when it holds none).
    #[inline]
    fn map<'s>(&'s self, line: &'s Line) -> &'s [u8] {
        if line.base == 0 {
            return &[];
        }
        // SAFETY: `base..base + len` is the mapping of the `ChunkMap` that
        // the line's slot of `owners` holds: `install` set them together from
        // that map, and `remove` (or another `install`) clears the line
        // before it drops the owner, both through `&mut self`. The returned
        // bytes borrow `self`, so they cannot outlive the owner. The mapping
        // is read-only and shared; a fault in it maps zeros over it
        // (`sigbus`), which readers learn from the flag, as for
        // `ChunkMap::resident_checked`.
        unsafe { std::slice::from_raw_parts(line.base as *const u8, line.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn cell_of(bytes: &[u8]) -> (tempfile::NamedTempFile, MapCell) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        let map = ChunkMap::new(f.as_file(), bytes.len()).unwrap();
        let cell: MapCell = Arc::new(OnceBox::new());
        assert!(cell.set(Box::new(Some(map))).is_ok());
        (f, cell)
    }

    #[test]
    fn a_slot_reads_its_mapping_while_it_holds_it_and_nothing_after() {
        if !crate::io::mmap::guard_available() {
            return;
        }
        let a: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..PAGE).map(|i| (i % 13) as u8).collect();
        let (_fa, ca) = cell_of(&a);
        let (_fb, cb) = cell_of(&b);
        let mut set = MapSet::new(&[a.len() as u64, b.len() as u64]);
        assert!(set.resident(0, 0, 8, None).is_none(), "an empty slot reads nothing");
        // A mapping longer than its slot is refused.
        assert!(!set.install(1, &ca, 7));
        assert!(set.shape(1).is_none());
        assert!(set.install(0, &ca, 7));
        assert!(set.install(1, &cb, 9));
        assert_eq!(set.shape(0), Some((7, a.len() as u64)));
        assert_eq!(set.shape(1), Some((9, b.len() as u64)));
        // The set keeps the mapping alive on its own.
        assert_eq!(Arc::strong_count(&ca), 2);
        for epoch in [None, Some(5), Some(5), Some(6)] {
            let r = set.resident(0, PAGE as u64 + 10, 100, epoch).expect("written pages are in memory");
            assert_eq!(r.bytes(), &a[PAGE + 10..PAGE + 110]);
            assert!(!r.faulted());
            assert_eq!(set.resident(1, 0, PAGE, epoch).unwrap().bytes(), &b[..]);
        }
        assert!(set.resident(0, a.len() as u64 - 4, 8, Some(6)).is_none(), "past the end");
        set.remove(0);
        assert!(set.shape(0).is_none());
        assert!(set.resident(0, 0, 8, Some(6)).is_none());
        assert_eq!(Arc::strong_count(&ca), 1, "the owner is dropped with the slot");
        // Another mapping in the slot: its own bytes.
        let (_fc, cc) = cell_of(&b);
        assert!(set.install(0, &cc, 3));
        assert_eq!(set.resident(0, 0, PAGE, Some(6)).unwrap().bytes(), &b[..]);
        drop(set);
        assert_eq!(Arc::strong_count(&cc), 1);
    }
}
