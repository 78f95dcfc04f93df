//! Read-only mappings of record tables and chunk files, each registered with
//! the SIGBUS guard ([`crate::io::sigbus`]) so a file that shrinks under it gives
//! an error instead of killing the process.
//!
//! Nothing is mapped where the guard is unavailable ([`guard_available`]):
//! then tables and chunks are read through their files.

use std::fs::File;
use std::io;

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};

pub(crate) use crate::io::prefetch::prefetch_line;
use crate::io::sigbus;

/// Whether mappings can be made safely in this process: the SIGBUS handler is
/// installed (on the first call) and still in place. When false, [`Mapping`]s
/// are refused and callers read through the file.
pub(crate) fn guard_available() -> bool {
    sigbus::available()
}

/// Whether the process allows mappings: `ZRING_MMAP=0` turns every mapping
/// off, and so does an unavailable guard.
pub(crate) fn allowed() -> bool {
    crate::env::mmap() && guard_available()
}

/// A read-only mapping of a file's first `len` bytes, guarded against SIGBUS.
///
/// The file may shrink under it anyway (another program truncating it, a
/// network file system, a page the disk cannot read back); the guard then
/// replaces the whole mapping with zeros and marks it faulted. Read it only
/// through [`Mapping::read`], which hands out the bytes for one call and
/// reports whether they could be trusted.
pub(crate) struct Mapping {
    // Declared before `map`, so it is dropped (unregistered) before the pages
    // are unmapped, as `sigbus::register` requires.
    guard: sigbus::Guard,
    map: Mmap,
}

impl Mapping {
    /// Maps the first `len` bytes of `file`, which the caller has checked is
    /// at least that long. Fails when `len` is zero, when the guard is
    /// unavailable or full; the caller then reads the file instead.
    pub fn new(file: &File, len: usize) -> io::Result<Mapping> {
        if len == 0 || !guard_available() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no SIGBUS guard: read the file instead"));
        }
        // SAFETY: zring never modifies or truncates the mapped prefix of a
        // published file while a store is open: appends write past the
        // committed length, deletes and compactions write new files and
        // rename (a mapping keeps an unlinked file alive), and recovery cuts
        // only bytes past the committed length, before any reader of that
        // process exists. `len` is at most the file's length, so no page lies
        // past its end when the map is made. If another program shrinks the
        // file anyway, or a page cannot be read back, the access raises
        // SIGBUS and the guard registered below maps zeros over the mapping:
        // the bytes behind a borrowed slice may then turn to zeros. Readers
        // only copy, checksum and decode (with bounds checks) those bytes, and
        // `Mapping::read` discards the result when the mapping faulted.
        let map = unsafe { MmapOptions::new().len(len).map(file) }?;
        // SAFETY: `map` is a read-only shared file mapping of `map.len()`
        // bytes starting at a page boundary, owned by the `Mapping` built
        // below, which drops the guard before the mapping.
        let guard = unsafe { sigbus::register(map.as_ptr(), map.len()) }
            .ok_or_else(|| io::Error::other("every SIGBUS guard slot is taken: read the file instead"))?;
        Ok(Mapping { guard, map })
    }

    /// Tells the kernel how the mapping will be read (best effort: advice
    /// that is refused changes nothing but speed).
    pub fn advise(&self, advice: memmap2::Advice) {
        let _ = self.map.advise(advice);
    }

    /// Asks the kernel to start reading `offset..offset + len` now (best effort).
    pub fn will_need(&self, offset: usize, len: usize) {
        let len = len.min(self.map.len().saturating_sub(offset));
        if len > 0 {
            let start = offset / PAGE * PAGE;
            let _ = self.map.advise_range(memmap2::Advice::WillNeed, start, len + (offset - start));
        }
    }

    /// Calls `f` with the mapped bytes at `offset..offset + len` and returns
    /// its result, or `None` when the range lies outside the mapping or the
    /// mapping faulted, before or during the call (then `f` may have seen
    /// zeros in place of the file's bytes, and its result is dropped). After
    /// `None` the caller reads the file, which reports a short or unreadable
    /// file as an error.
    #[inline]
    pub fn read<R>(&self, offset: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self.guard.faulted() {
            return None;
        }
        let bytes = self.map.get(offset..offset.checked_add(len)?)?;
        let r = f(bytes);
        (!self.guard.faulted()).then_some(r)
    }

    /// Asks the CPU to start loading the cache line at `offset` (nothing
    /// past the end): a caller about to read many scattered small pieces
    /// (table entries) prefetches them all first, so their cache misses
    /// overlap instead of following one another.
    #[inline]
    pub fn prefetch(&self, offset: usize) {
        if let Some(b) = self.map.get(offset) {
            prefetch_line(b);
        }
    }

    /// Whether an access has faulted: the mapping is never read again.
    #[inline]
    pub fn faulted(&self) -> bool {
        self.guard.faulted()
    }

    /// Starts loading the fault flag [`Mapping::read`] checks into the CPU
    /// cache.
    #[inline]
    pub fn prefetch_guard(&self) {
        self.guard.prefetch();
    }
}

pub(crate) const PAGE: usize = 4096;

/// A chunk's read-only mapping, for copying records whose pages are in the
/// page cache without a system call per record.
///
/// Residency is asked of the kernel (mincore) the first time a page is
/// needed and then remembered in a bitmap. A remembered page can go stale
/// when the kernel evicts it; copying it would then fault it back in
/// synchronously, with the kernel's readahead (many times the bytes a cold
/// gather needs). So the bitmap is tied to the machine's count of evicted
/// page-cache pages ([`evictions`]): when that count has moved, the bitmap is
/// cleared and pages are asked about again. Evictions it does not count (a
/// `posix_fadvise(DONTNEED)` by another program) cost synchronous faults,
/// never wrong bytes.
pub(crate) struct ChunkMap {
    map: Mapping,
    pages: Residency,
}

/// The pages of a mapping last seen in memory, one bit each, and the eviction
/// count ([`evictions`]) that knowledge was last confirmed under.
///
/// The count is the host's: it moves when any file's pages are evicted. When it
/// has moved, the bitmap is not thrown away but checked: [`SAMPLES`] of the
/// pages it remembers, drawn at random, are asked about (`mincore`), and only
/// when one of them is gone is the whole bitmap forgotten. Evictions elsewhere
/// on the host (another program's files, a tmpfs file deleted) then cost a few
/// system calls per mapping instead of asking about every page again. An
/// eviction of this file's pages that the sample misses leaves bits stale:
/// copying such a page faults it back in synchronously (the right bytes,
/// read slowly).
pub(crate) struct Residency {
    seen: Box<[AtomicU64]>,
    epoch: AtomicU64,
}

/// A residency bitmap and its eviction count, borrowed: a [`Residency`]'s,
/// or one file's in a [`crate::io::mapset::MapSet`] (whose bitmaps lie in
/// one array).
#[derive(Clone, Copy)]
pub(crate) struct Bits<'a> {
    pub seen: &'a [AtomicU64],
    pub epoch: &'a AtomicU64,
}

/// Remembered pages asked about when the host's eviction count moves.
const SAMPLES: usize = 8;
/// A mapping of at most this many words of pages (64 pages each: 2 MiB) is
/// sampled with one page: on a host whose count moves every few
/// milliseconds, a gather over hundreds of small parts (a dataset of parts)
/// would otherwise ask about eight pages of each part it touches, a system
/// call each, more than its copies cost.
const SMALL_WORDS: usize = 8;

/// Words of a bitmap of the pages of `len` bytes.
pub(crate) fn words_for(len: usize) -> usize {
    len.div_ceil(PAGE).div_ceil(64)
}

impl Residency {
    /// Nothing known about a mapping of `len` bytes.
    pub fn new(len: usize) -> Residency {
        let seen = (0..words_for(len)).map(|_| AtomicU64::new(0)).collect();
        Residency { seen, epoch: AtomicU64::new(u64::MAX) }
    }

    fn bits(&self) -> Bits<'_> {
        Bits { seen: &self.seen, epoch: &self.epoch }
    }

    /// Whether every page of `pages` was seen in memory.
    #[inline]
    pub fn known(&self, pages: std::ops::Range<usize>) -> bool {
        self.bits().known(pages)
    }

    fn mark(&self, pages: std::ops::Range<usize>) {
        self.bits().mark(pages)
    }
}

impl Bits<'_> {
    /// Brings the bitmap of `map`'s pages up to eviction count `epoch`: when the
    /// count moved since the bitmap was last confirmed, a sample of its pages
    /// is asked about, and the bitmap is forgotten if one of them is gone.
    pub fn at(&self, epoch: u64, map: &[u8]) {
        let was = self.epoch.load(Relaxed);
        if was == epoch {
            return;
        }
        if was != u64::MAX && self.sample_resident(epoch, map) {
            self.epoch.store(epoch, Relaxed);
            return;
        }
        for w in self.seen.iter() {
            w.store(0, Relaxed);
        }
        self.epoch.store(epoch, Relaxed);
    }

    /// Whether up to [`SAMPLES`] remembered pages (one of a small mapping,
    /// [`SMALL_WORDS`]), drawn at random, are all still in memory.
    fn sample_resident(&self, seed: u64, map: &[u8]) -> bool {
        let words = self.seen.len();
        if words == 0 {
            return true;
        }
        // xorshift64*: any spread of draws will do.
        let mut x = seed ^ 0x9e37_79b9_7f4a_7c15 | 1;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let samples = if words <= SMALL_WORDS { 1 } else { SAMPLES };
        let mut found = 0;
        for _ in 0..8 * SAMPLES {
            let r = next();
            let w = self.seen[(r % words as u64) as usize].load(Relaxed);
            if w == 0 {
                continue;
            }
            let rot = (r >> 32) as u32 % 64;
            let bit = (w.rotate_right(rot).trailing_zeros() + rot) % 64;
            let page = (r % words as u64) as usize * 64 + bit as usize;
            if !resident(map, page * PAGE, PAGE.min(map.len().saturating_sub(page * PAGE))) {
                return false;
            }
            found += 1;
            if found == samples {
                break;
            }
        }
        true
    }

    /// Whether every page of `pages` was seen in memory.
    #[inline]
    pub fn known(&self, pages: std::ops::Range<usize>) -> bool {
        pages.into_iter().all(|p| self.seen.get(p / 64).is_some_and(|w| w.load(Relaxed) & (1 << (p % 64)) != 0))
    }

    pub fn mark(&self, pages: std::ops::Range<usize>) {
        for p in pages {
            if let Some(w) = self.seen.get(p / 64) {
                w.fetch_or(1 << (p % 64), Relaxed);
            }
        }
    }

    #[inline]
    pub fn prefetch(&self, page: usize) {
        if let Some(w) = self.seen.get(page / 64) {
            prefetch_line(w);
        }
    }
}

impl Mapping {
    /// Brings `known`, the bitmap of this mapping's pages, up to eviction
    /// count `epoch` ([`Bits::at`]).
    pub fn confirm(&self, known: &Residency, epoch: u64) {
        known.bits().at(epoch, &self.map);
    }

    /// Starts reading, all at once and without waiting, every page in `pages`
    /// (page numbers of this mapping, in any order, repeats allowed) that is
    /// not in memory, so that the accesses that follow wait for reads already
    /// in flight instead of faulting the pages in one after another. Pages
    /// found in memory are remembered in `known` (the caller leaves out the
    /// pages `known` has already seen). Returns how many pages were asked for.
    ///
    /// A table mapped for random access (`MADV_RANDOM`) faults each cold
    /// entry's page in synchronously, before the gather can submit its record
    /// reads: a cold gather of 256 records waited for over a hundred page
    /// reads in turn. This turns them into one round of concurrent reads.
    pub fn will_need_pages(&self, known: &Residency, pages: &mut Vec<usize>) -> usize {
        let last = self.map.len().div_ceil(PAGE);
        pages.retain(|&p| p < last);
        if pages.is_empty() {
            return 0;
        }
        pages.sort_unstable();
        pages.dedup();
        // Ask mincore about spans of nearby pages (one call each), then ask
        // the kernel to read each run of consecutive missing pages.
        const SPAN: usize = 512;
        let mut vec = [0u8; SPAN];
        let mut missing: Vec<usize> = Vec::with_capacity(pages.len());
        let mut i = 0;
        while i < pages.len() {
            let start = pages[i];
            let j = i + pages[i..].iter().take_while(|&&p| p - start < SPAN).count();
            let end = pages[j - 1] + 1;
            // SAFETY: `start..end` are pages of this mapping (checked against
            // its length above), so the kernel reads only our mapping's page
            // tables; `vec` has a byte for each of the at most SPAN pages.
            let r = unsafe {
                libc::mincore(
                    self.map.as_ptr().add(start * PAGE) as *mut libc::c_void,
                    ((end - start) * PAGE).min(self.map.len() - start * PAGE),
                    vec.as_mut_ptr(),
                )
            };
            for &p in &pages[i..j] {
                if r == 0 && vec[p - start] & 1 == 1 {
                    known.mark(p..p + 1);
                } else {
                    missing.push(p);
                }
            }
            i = j;
        }
        let mut k = 0;
        while k < missing.len() {
            let run = 1 + missing[k + 1..].iter().zip(&missing[k..]).take_while(|(b, a)| **b == **a + 1).count();
            self.will_need(missing[k] * PAGE, run * PAGE);
            k += run;
        }
        missing.len()
    }
}

impl ChunkMap {
    /// Maps the first `len` bytes of a chunk file (at most the file's
    /// length). Fails where mapping is unsafe ([`guard_available`]); the
    /// caller then reads the file.
    pub fn new(file: &File, len: usize) -> io::Result<ChunkMap> {
        // No MADV_RANDOM: records are copied from this mapping only once their
        // pages are known to be in memory, so faults are minor, and the
        // kernel's fault-around (mapping neighbouring cached pages with each
        // fault) saves most of them.
        let map = Mapping::new(file, len)?;
        Ok(ChunkMap { map, pages: Residency::new(len) })
    }

    /// Starts loading the residency bit of the page at `offset` into the CPU
    /// cache: a gather asks about many records at scattered offsets, and
    /// their bitmap words, evicted by the bytes the last gather copied, would
    /// otherwise miss one after another (65 % of [`ChunkMap::resident_checked`]'s
    /// time on AMD Zen 1 went to that load).
    #[inline]
    pub fn prefetch_residency(&self, offset: usize) {
        self.pages.bits().prefetch(offset / PAGE);
    }

    /// The stored bytes at `offset..offset + len` if their pages are in
    /// memory and the mapping has not faulted, with the means to tell
    /// afterwards whether what was read from them was the file's
    /// ([`Resident::faulted`]). A faulted mapping is never handed out again, so
    /// later reads go through the file, which reports a short or unreadable
    /// file as an error.
    ///
    /// `epoch` is [`evictions`] taken at the start of the gather, or `None`
    /// (the count cannot be read) to ask the kernel without consulting the
    /// bitmap.
    pub fn resident_checked(&self, offset: usize, len: usize, epoch: Option<u64>) -> Option<Resident<'_>> {
        if self.map.faulted() {
            return None;
        }
        resident_in(&self.map.map, self.pages.bits(), self.map.guard.flag(), offset, len, epoch)
    }

    /// The mapping's bytes and fault flag ([`crate::io::mapset::MapSet`]).
    pub(crate) fn parts(&self) -> (&[u8], sigbus::Flag) {
        (&self.map.map, self.map.guard.flag())
    }
}

/// [`ChunkMap::resident_checked`] of the mapping `map`, whose pages `bits`
/// remembers and whose fault flag is `flag` (the caller has checked it).
#[inline]
pub(crate) fn resident_in<'m>(
    map: &'m [u8],
    bits: Bits<'_>,
    flag: sigbus::Flag,
    offset: usize,
    len: usize,
    epoch: Option<u64>,
) -> Option<Resident<'m>> {
    let end = offset.checked_add(len).filter(|&e| e <= map.len())?;
    let found = Resident { bytes: &map[offset..end], flag };
    let Some(epoch) = epoch else {
        return resident(map, offset, len).then_some(found);
    };
    bits.at(epoch, map);
    let pages = offset / PAGE..end.div_ceil(PAGE);
    if !bits.known(pages.clone()) {
        if !resident(map, offset, len) {
            return None;
        }
        bits.mark(pages);
    }
    Some(found)
}

/// A resident record's stored bytes in a chunk's mapping.
///
/// Use [`Resident::bytes`] (copy, checksum, decode), then ask
/// [`Resident::faulted`]: when true, the file shrank or a page could not be
/// read while mapped, what was read may be zeros in place of the file's
/// bytes, and the record must be reported as an error (or read again through
/// the file). The check is one fence and one load; checking once after
/// several records of the same chunk covers them all, as the flag never
/// clears.
#[derive(Clone, Copy)]
pub(crate) struct Resident<'m> {
    bytes: &'m [u8],
    flag: sigbus::Flag,
}

impl<'m> Resident<'m> {
    /// The stored bytes, borrowed from the mapping.
    #[inline]
    pub fn bytes(&self) -> &'m [u8] {
        self.bytes
    }

    /// Whether the mapping faulted since it was made: everything read from
    /// [`Resident::bytes`] before this call is suspect when true.
    #[inline]
    pub fn faulted(&self) -> bool {
        self.flag.faulted()
    }
}

/// How long a reading of the eviction count serves every gather of the
/// process. Reading `/proc/vmstat` costs about what 16 `mincore` calls do
/// (65-70 µs on AMD Zen 1 at 2 GHz), and a loader runs thousands of gathers
/// a second, several per step for a mixture of many stores; a hot gather of
/// 256 × 12 KiB takes about a millisecond there, so a 1 ms freshness read
/// the file in every other gather, on the caller's thread before any copy
/// starts. A page evicted less than this long ago may be copied from a
/// stale bitmap and fault back in synchronously (the right bytes, read
/// slowly), which is what the count guards against.
const EVICTIONS_FRESH: Duration = Duration::from_millis(4);

/// The machine's count of page-cache pages evicted so far (reclaimed under
/// memory pressure, dropped through `drop_caches`, or paged out by other
/// means), from `/proc/vmstat`, as read at most [`EVICTIONS_FRESH`] ago by
/// any thread of the process; `None` where it cannot be read (then every
/// record is asked about).
pub(crate) fn evictions() -> Option<u64> {
    static CLOCK: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    /// The count and when it was read (nanoseconds on `CLOCK`, plus one so
    /// that 0 means never).
    static COUNT: AtomicU64 = AtomicU64::new(0);
    static READ_AT: AtomicU64 = AtomicU64::new(0);
    let now = CLOCK.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1;
    let at = READ_AT.load(Acquire);
    if at != 0 && now.saturating_sub(at) < EVICTIONS_FRESH.as_nanos() as u64 {
        return Some(COUNT.load(Acquire));
    }
    let count = read_evictions()?;
    // Racing readers store counts read moments apart; either is fresh.
    COUNT.store(count, Release);
    READ_AT.store(now, Release);
    Some(count)
}

/// The eviction count read from `/proc/vmstat` now.
fn read_evictions() -> Option<u64> {
    static VMSTAT: std::sync::OnceLock<Option<File>> = std::sync::OnceLock::new();
    static SEEN: Shrinks = Shrinks::new();
    let f = VMSTAT.get_or_init(|| File::open("/proc/vmstat").ok()).as_ref()?;
    let mut buf = [0u8; 8192];
    let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).ok()?;
    SEEN.count(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Turns successive readings of `/proc/vmstat` into an eviction count.
///
/// The kernel counts pages reclaimed by its LRU scans (`pgsteal_file`) and
/// `drop_caches` runs (`drop_pagecache`, a run, not pages), but not pages
/// paged out directly: DAMON's `pageout` action (run by hypervisors'
/// guests to return memory: the 2-core machine of this project pages out
/// about 500 MB of idle page cache every 20 s that way), `MADV_PAGEOUT`, or
/// a file's cache invalidated by another process. Those show only as a
/// smaller `nr_file_pages`, so every shrink of it between two readings adds
/// to the count too, less the shared memory it counts (`nr_shmem`: tmpfs
/// files such as those in /dev/shm, which are no file's cache and shrink
/// whenever one is deleted). Growth does not: reading files grows the cache
/// and must not clear the bitmaps. A move of the count is evidence only:
/// each bitmap then checks a sample of its own pages ([`Bits::at`]). An eviction hidden by a larger growth within
/// the same reading interval goes unseen; its page then faults back in when
/// copied (the right bytes, read slowly).
struct Shrinks {
    /// `nr_file_pages - nr_shmem` at the last reading (0: none yet).
    last: AtomicU64,
    /// Pages the cache shrank by, summed over readings.
    shrunk: AtomicU64,
}

impl Shrinks {
    const fn new() -> Shrinks {
        Shrinks { last: AtomicU64::new(0), shrunk: AtomicU64::new(0) }
    }

    fn count(&self, vmstat: &str) -> Option<u64> {
        let mut sum = 0u64;
        let mut found = false;
        let (mut file, mut shmem) = (None, 0u64);
        for line in vmstat.lines() {
            let mut it = line.split_ascii_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                match k {
                    "pgsteal_file" | "drop_pagecache" => {
                        sum = sum.wrapping_add(v.parse::<u64>().ok()?);
                        found = true;
                    }
                    "nr_file_pages" => file = Some(v.parse::<u64>().ok()?),
                    "nr_shmem" => shmem = v.parse::<u64>().ok()?,
                    _ => {}
                }
            }
        }
        if let Some(file) = file {
            let pages = file.saturating_sub(shmem);
            let last = self.last.swap(pages, Relaxed);
            if last > pages {
                self.shrunk.fetch_add(last - pages, Relaxed);
            }
        }
        found.then(|| sum.wrapping_add(self.shrunk.load(Relaxed)))
    }
}

/// Whether every page of `map[offset..offset + len]` is in memory, so copying
/// it performs no I/O.
fn resident(map: &[u8], offset: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let start = offset / PAGE * PAGE;
    let end = offset + len;
    if end > map.len() {
        return false;
    }
    let pages = (end - start).div_ceil(PAGE);
    let mut vec = [0u8; 64];
    let mut heap;
    let out: &mut [u8] = if pages <= vec.len() {
        &mut vec[..pages]
    } else {
        heap = vec![0u8; pages];
        &mut heap
    };
    // SAFETY: `start` is page aligned (mappings start at a page boundary) and
    // `start..end` lies inside the mapping, so the kernel reads only our
    // mapping's page tables; `out` has one byte per page of the range.
    let r = unsafe { libc::mincore(map.as_ptr().add(start) as *mut libc::c_void, end - start, out.as_mut_ptr()) };
    r == 0 && out.iter().all(|b| b & 1 == 1)
}

/// Whether every page of `file`'s first `len` bytes is in memory (tests:
/// what a read ahead brought in).
#[cfg(test)]
pub(crate) fn file_resident(file: &File, len: usize) -> bool {
    // SAFETY: a read-only mapping of a file the test wrote and leaves alone;
    // only its residency is asked, no byte of it is read.
    let map = unsafe { MmapOptions::new().len(len).map(file) }.unwrap();
    resident(&map, 0, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_eviction_count_moves_when_the_page_cache_shrinks_without_a_steal() {
        let vmstat = |file: u64, steal: u64, drops: u64| {
            format!("nr_free_pages 100\nnr_file_pages {file}\npgpgin 7\npgsteal_file {steal}\ndrop_pagecache {drops}\n")
        };
        let s = Shrinks::new();
        let first = s.count(&vmstat(1000, 5, 1)).unwrap();
        // The cache grows (files read): no eviction.
        assert_eq!(s.count(&vmstat(1500, 5, 1)), Some(first));
        // Paged out behind the LRU's back (DAMON, MADV_PAGEOUT): 300 pages.
        let paged = s.count(&vmstat(1200, 5, 1)).unwrap();
        assert_eq!(paged, first + 300);
        // A tmpfs file deleted: shared memory shrinks with the file pages.
        let shm = |file: u64, shmem: u64| {
            format!("nr_file_pages {file}\nnr_shmem {shmem}\npgsteal_file 9\ndrop_pagecache 1\n")
        };
        let s2 = Shrinks::new();
        let base = s2.count(&shm(2000, 600)).unwrap();
        assert_eq!(s2.count(&shm(1744, 344)), Some(base), "a deleted /dev/shm file is no eviction");
        assert_eq!(s2.count(&shm(1700, 344)), Some(base + 44));
        // Reclaim and drop_caches still count.
        assert_eq!(s.count(&vmstat(1200, 9, 1)), Some(paged + 4));
        assert_eq!(s.count(&vmstat(1200, 9, 2)), Some(paged + 5));
        // A kernel without the counters: no count (every record is asked).
        assert_eq!(Shrinks::new().count("nr_file_pages 5\n"), None);
    }

    fn file_of(len: usize) -> File {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
        f.write_all(&data).unwrap();
        f
    }

    /// A file on disk (not tmpfs, whose pages cannot be evicted), written
    /// and synced so its pages are clean and can be dropped.
    fn disk_file(len: usize) -> File {
        let mut f = tempfile::tempfile_in(crate::io::disk_scratch_dir()).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        f
    }

    fn drop_cache(f: &File) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; the advice only drops clean cached pages.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
    }

    /// The host's eviction count moving keeps a bitmap whose sampled pages
    /// are all still in memory, and forgets it once this file's pages were
    /// evicted.
    #[test]
    fn a_moved_eviction_count_forgets_only_a_bitmap_whose_pages_went() {
        let len = 64 * PAGE;
        let f = disk_file(len);
        let map = ChunkMap::new(&f, len).unwrap();
        assert!(map.resident_checked(0, len, Some(1)).is_some(), "a file just written is in memory");
        assert!(map.pages.known(0..64));
        // Something else on the host was evicted: the sample finds ours in place.
        assert!(map.resident_checked(0, PAGE, Some(2)).is_some());
        assert!(map.pages.known(0..64), "the bitmap was forgotten for another file's eviction");
        drop_cache(&f);
        assert!(!resident(&map.map.map, 0, PAGE), "posix_fadvise(DONTNEED) dropped nothing");
        // Under the old count the bitmap still answers (stale, as documented) ...
        assert!(map.pages.known(0..64));
        // ... and once the count moves, the sample sees the eviction.
        assert!(map.resident_checked(0, PAGE, Some(3)).is_none());
        assert!(!map.pages.known(0..1));
    }

    /// Pages of a table that are not in memory are asked for all at once and
    /// arrive; pages in memory are only remembered.
    #[test]
    fn will_need_pages_reads_the_missing_pages_and_remembers_the_rest() {
        let len = 600 * PAGE;
        let f = disk_file(len);
        let map = Mapping::new(&f, len).unwrap();
        let known = Residency::new(len);
        drop_cache(&f);
        let mut pages = vec![3, 500, 7, 3, 599, 1000];
        assert_eq!(map.will_need_pages(&known, &mut pages), 4, "page 1000 is past the end; 3 is asked once");
        assert!(!known.known(3..4), "a page being read is not known yet");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(resident(&map.map, 3 * PAGE, PAGE) && resident(&map.map, 599 * PAGE, PAGE)) {
            assert!(Instant::now() < deadline, "the pages asked for never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!resident(&map.map, 100 * PAGE, PAGE), "a page not asked for was read");
        let mut again = vec![3, 7, 500, 599];
        assert_eq!(map.will_need_pages(&known, &mut again), 0);
        assert!(known.known(3..4) && known.known(599..600));
    }

    /// A chunk file shrinks under its mapping while the residency bitmap still
    /// says its pages are in memory: the copy faults, the guard turns it into
    /// zeros plus the faulted flag, `read` returns `None`, and the mapping is
    /// never read again, not even for bytes that are still in the file.
    #[test]
    fn a_shrunk_chunk_faults_into_none_not_a_signal() {
        assert!(guard_available(), "the SIGBUS handler could not be installed");
        let len = 64 * PAGE;
        let f = file_of(len);
        let map = ChunkMap::new(&f, len).unwrap();
        let epoch = Some(7);
        let hot = map.resident_checked(40 * PAGE, 3 * PAGE, epoch).expect("pages just written are resident");
        let first = hot.bytes().to_vec();
        assert!(!hot.faulted());
        assert_eq!(first[0], (40 * PAGE % 251) as u8 + 1);
        f.set_len(8 * PAGE as u64).unwrap();
        // The bitmap remembers the pages, so no mincore: the copy touches them.
        let hot = map.resident_checked(40 * PAGE, 3 * PAGE, epoch).expect("the bitmap still says resident");
        assert_eq!(hot.bytes().to_vec(), vec![0u8; 3 * PAGE], "the faulting copy resumed on zeros");
        assert!(hot.faulted());
        assert!(map.resident_checked(0, PAGE, epoch).is_none());
        assert!(map.resident_checked(0, PAGE, None).is_none());
    }

    /// The same through `Mapping::read` (tables): a fault inside `f` drops its
    /// result.
    #[test]
    fn a_fault_during_read_drops_the_result() {
        let len = 16 * PAGE;
        let f = file_of(len);
        let map = Mapping::new(&f, len).unwrap();
        let want: Vec<u8> = (PAGE..PAGE + 4).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(map.read(PAGE, 4, |b| b.to_vec()), Some(want));
        f.set_len(0).unwrap();
        let mut saw = None;
        assert!(map.read(12 * PAGE, 8, |b| saw = Some(b.to_vec())).is_none());
        assert_eq!(saw, Some(vec![0u8; 8]), "the faulting copy resumed on zeros");
        assert!(map.read(0, 1, |_| ()).is_none());
    }

    /// A fault on one thread makes a concurrent reader on another thread drop
    /// what it read, whether it faulted itself or found the zeros already
    /// mapped.
    #[test]
    fn concurrent_readers_all_see_the_fault() {
        let len = 256 * PAGE;
        let f = file_of(len);
        let map = ChunkMap::new(&f, len).unwrap();
        for p in 0..256 {
            assert!(map.resident_checked(p * PAGE, PAGE, Some(1)).is_some());
        }
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..4)
                .map(|t| {
                    let map = &map;
                    s.spawn(move || {
                        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                        for round in 0usize.. {
                            let p = (round * 7 + t * 13) % 256;
                            let Some(hot) = map.resident_checked(p * PAGE, PAGE, Some(1)) else { return };
                            let all_file_bytes = hot.bytes().iter().all(|&x| x != 0);
                            if hot.faulted() {
                                return;
                            }
                            assert!(all_file_bytes, "zeros were taken for file bytes");
                            assert!(std::time::Instant::now() < deadline, "the shrink was never noticed");
                        }
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(5));
            f.set_len(0).unwrap();
            for r in readers {
                r.join().unwrap();
            }
        });
        assert!(map.map.faulted());
    }
}
