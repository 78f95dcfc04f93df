//! Slabs: recycled buffers that block reads land in, and that the record
//! cache keeps the records a gather read in.
//!
//! A window of blocks ([`crate::read::blocks`]) is read in runs of records
//! that lie back to back in a chunk file, each run one large O_DIRECT read
//! into an ALIGN-aligned slab, which the window keeps whole
//! ([`crate::memory::window`]: the slab is charged to the record cache as
//! long as any record of it lives). A record a gather read on its own and
//! the cache admits is copied into a slab of its own size, frozen into a
//! [`Bytes`]; its memory is freed when it leaves the cache, so the cache's
//! byte accounting stays exact.
//!
//! A record's slab is rounded up to 64 bytes below [`GRAIN`] and to a page
//! ([`ALIGN`]) from there, so a record wastes at most 1/16 of its size (a run's
//! slab, rounded to [`GRAIN`], is freed as soon as its records are copied
//! out). The record cache charges each record the capacity of its slab
//! ([`record_capacity`]), which is what it holds.
//!
//! Records of up to [`MAX_CARVED`] bytes are not heap allocations: each is a
//! slot carved from an arena chunk ([`CHUNK`], 2 MiB, mapped and populated
//! in one system call each) that holds slots of one capacity only, and a freed
//! slot goes back to its capacity's free list, for the next record of that
//! size. Filling a cache of 12 KiB records through the heap cost one
//! `mprotect` per record (glibc grows a thread's arena one allocation at a
//! time) and a page fault per 4 KiB: about 0.9 CPU-seconds per GiB cached
//! (bench-results/cpu.md); carved, it costs one `mmap` and one
//! `MADV_POPULATE_WRITE` per 2 MiB, made without the arenas' lock ([`carve`]). The slots and chunk tails no record holds
//! are the arenas' spare memory; it counts with the pool below against the
//! pool's limit (beyond which freed slots are handed back to the system,
//! `MADV_DONTNEED`, and new chunks are left to fault in page by page), and
//! [`drain`] hands all of it back. Chunks stay mapped; a handed-back slot is
//! reused like any other and faults its pages in again.
//!
//! Slabs from [`GRAIN`] up (a run's) are anonymous mappings of their own,
//! populated in one call (`MADV_POPULATE_WRITE`) and unmapped when freed
//! past the pool: from the heap, each page of a fresh one cost a fault as
//! `alloc_zeroed` cleared it, most of what a window's load cost in the
//! kernel once its records were no longer copied out (bench-results/mode3-one-copy.md).
//!
//! Freed slabs go back to a small process-wide pool (at most [`POOL_BYTES`],
//! less for a small budget: [`set_limits`]) and are handed out again for the
//! same rounded size: memory fresh from the kernel
//! costs a page fault and a page clear per 4 KiB on first touch, which at the
//! disk's large-read rate takes most of a core. In a steady state every
//! record a window admits evicts one of about its size, so the pool stays
//! small. The pool is only ever tried (`try_lock`), never waited for, so no
//! thread blocks on it and a child forked while another thread held it simply
//! allocates.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Mutex, MutexGuard, TryLockError};

use bytes::Bytes;

/// Alignment of O_DIRECT buffers, offsets and lengths.
pub(crate) const ALIGN: usize = 4096;

/// Large slabs (runs) are rounded up to this and aligned for O_DIRECT, so
/// runs of about the same length share slabs from the pool (a block of
/// fixed-size records spans one of two lengths, depending on where its first
/// record falls in a page).
const GRAIN: usize = 64 << 10;

/// Smaller slabs (records) are rounded up to this and aligned to it: at most
/// 63 bytes a record beyond its charge in the cache.
const SMALL: usize = 64;

/// The most bytes of freed slabs the pool keeps, with the arenas' spare
/// memory ([`SPARE`]); beyond it a freed slab goes back to the allocator. Above one batch of a window's load
/// ([`crate::read::blocks`]), whose run slabs return as their records are
/// copied out.
pub(crate) const POOL_BYTES: usize = 48 << 20;

/// The most bytes block reads keep in flight at once ([`crate::read::blocks`]).
pub(crate) const IN_FLIGHT_BYTES: u64 = 32 << 20;

/// Records of at most this many bytes are kept in slots carved from arena
/// chunks (module docs); larger ones in slabs of their own.
pub(crate) const MAX_CARVED: usize = 256 << 10;

/// An arena chunk: mapped and populated at once, carved into slots of one
/// capacity (at least 8 of them).
pub(crate) const CHUNK: usize = 2 << 20;

/// The page size the arenas hand memory back in.
const PAGE: usize = 4096;

/// Spare memory: bytes of pooled slabs and of arena slots and chunk tails no
/// record holds that are resident; at most the pool's limit ([`set_limits`]).
static SPARE: AtomicUsize = AtomicUsize::new(0);

/// The pool's limit now ([`set_limits`]).
static POOL_LIMIT: AtomicUsize = AtomicUsize::new(POOL_BYTES);
/// The reads' limit in flight now ([`set_limits`]).
static IN_FLIGHT_LIMIT: AtomicU64 = AtomicU64::new(IN_FLIGHT_BYTES);

/// Memory the reads may hold beside the record cache (the pool and the reads
/// in flight) for `io` bytes of the budget ([`crate::memory::budget`]):
/// [`POOL_BYTES`] and [`IN_FLIGHT_BYTES`] at most, in that proportion below.
pub(crate) fn set_limits(io: u64) {
    let (pool, in_flight) = limits(io);
    POOL_LIMIT.store(pool, Relaxed);
    IN_FLIGHT_LIMIT.store(in_flight, Relaxed);
    if SPARE.load(Relaxed) > pool {
        drain();
    }
}

/// The pool's and the reads' limits for `io` bytes ([`set_limits`]).
fn limits(io: u64) -> (usize, u64) {
    let full = POOL_BYTES as u64 + IN_FLIGHT_BYTES;
    let io = io.min(full);
    let pool = (u128::from(io) * POOL_BYTES as u128 / u128::from(full)) as u64;
    // At least one page in flight, so a read can still be made.
    (pool as usize, (io - pool).max(ALIGN as u64))
}

/// The most bytes block reads may keep in flight now ([`set_limits`]).
pub(crate) fn in_flight_bytes() -> u64 {
    IN_FLIGHT_LIMIT.load(Relaxed)
}

/// The budget's share for the reads: the slab pool's limit and the reads
/// in flight's ([`set_limits`]), which no read uses between gathers; what
/// gathers keep as scratch counts against it (`io/scratch.rs`).
pub(crate) fn reads_share() -> usize {
    POOL_LIMIT.load(Relaxed) + IN_FLIGHT_LIMIT.load(Relaxed) as usize
}

/// Freed slabs by capacity, each allocated with [`layout`].
struct Pool {
    free: BTreeMap<usize, Vec<NonNull<u8>>>,
    bytes: usize,
}

// SAFETY: the pool holds allocations no one else refers to (a slab gives its
// pointer up when it is dropped); moving them between threads is moving
// ownership of plain memory.
unsafe impl Send for Pool {}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: BTreeMap::new(), bytes: 0 });

/// The capacity a run's slab of `len` bytes gets.
fn capacity(len: usize) -> usize {
    if len >= GRAIN {
        len.div_ceil(GRAIN) * GRAIN
    } else {
        len.max(1).div_ceil(SMALL) * SMALL
    }
}

/// The capacity of [`Slab::take_aligned`]`(len)`.
pub(crate) fn aligned_capacity(len: usize) -> usize {
    capacity(len.max(GRAIN))
}

/// The capacity a record's slab of `len` bytes gets ([`Slab::copy_of`]; module
/// docs): what the record cache charges for it.
pub(crate) fn record_capacity(len: usize) -> usize {
    if len >= GRAIN {
        len.div_ceil(ALIGN) * ALIGN
    } else {
        capacity(len)
    }
}

/// A slab's layout: large ones aligned for O_DIRECT.
fn layout(cap: usize) -> Layout {
    let align = if cap >= GRAIN { ALIGN } else { SMALL };
    Layout::from_size_align(cap, align).expect("slab sizes are far below isize::MAX")
}

/// A buffer of `cap` bytes (ALIGN-aligned from [`GRAIN`] up), zeroed at
/// birth (a carved slot holds a previous record's bytes, or zeros), owned
/// alone until frozen (module docs).
pub(crate) struct Slab {
    ptr: NonNull<u8>,
    cap: usize,
    /// A slot of an arena chunk (module docs), not a heap allocation.
    carved: bool,
}

// SAFETY: a slab owns its allocation exclusively; shared references only
// read it.
unsafe impl Send for Slab {}
// SAFETY: as above: `&Slab` gives only `&[u8]`.
unsafe impl Sync for Slab {}

impl Slab {
    /// A slab of at least `len` bytes (capacity rounded up, [`capacity`]),
    /// from the pool when it holds one of that capacity.
    pub fn take(len: usize) -> Slab {
        Slab::with_capacity(capacity(len))
    }

    /// A slab of exactly `cap` bytes, from the pool when it holds one.
    fn with_capacity(cap: usize) -> Slab {
        if let Ok(mut pool) = POOL.try_lock() {
            if let Some(ptr) = pool.free.get_mut(&cap).and_then(Vec::pop) {
                pool.bytes -= cap;
                SPARE.fetch_sub(cap, Relaxed);
                return Slab { ptr, cap, carved: false };
            }
        }
        if cap >= GRAIN {
            let ptr = map(cap, true).unwrap_or_else(|| handle_alloc_error(layout(cap)));
            return Slab { ptr, cap, carved: false };
        }
        // SAFETY: the layout has a non-zero size (every capacity is at least
        // SMALL).
        let raw = unsafe { alloc_zeroed(layout(cap)) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout(cap)));
        Slab { ptr, cap, carved: false }
    }

    /// The whole buffer, for a read to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation or carved slot of `cap` bytes,
        // initialised (zeroed at allocation or mapping, or handed back to the
        // system and read as zeros since, written only through slices), and
        // `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// A slab of at least `len` bytes aligned for O_DIRECT ([`ALIGN`]): one
    /// of at least [`GRAIN`] bytes ([`aligned_capacity`]).
    pub fn take_aligned(len: usize) -> Slab {
        Slab::take(len.max(GRAIN))
    }

    /// A slab holding a copy of `bytes`, frozen.
    pub fn copy_of(bytes: &[u8]) -> Bytes {
        let cap = record_capacity(bytes.len());
        let carved = if cap <= MAX_CARVED { carve(cap) } else { None };
        let mut slab = match carved {
            Some(ptr) => Slab { ptr, cap, carved: true },
            None => Slab::with_capacity(cap),
        };
        slab.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        slab.freeze().slice(..bytes.len())
    }

    /// Freezes the slab into shared bytes.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Slab {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; shared references only read.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        if self.carved {
            release(self.ptr, self.cap);
            return;
        }
        if let Ok(mut pool) = POOL.try_lock() {
            if SPARE.load(Relaxed) + self.cap <= POOL_LIMIT.load(Relaxed) {
                pool.bytes += self.cap;
                SPARE.fetch_add(self.cap, Relaxed);
                pool.free.entry(self.cap).or_default().push(self.ptr);
                return;
            }
        }
        free(self.ptr, self.cap);
    }
}

/// Frees a slab's memory that no slab or pool refers to any more: unmapped
/// from [`GRAIN`] up ([`map`]), else given back to the allocator.
fn free(ptr: NonNull<u8>, cap: usize) {
    if cap >= GRAIN {
        // SAFETY: mapped by `map` with this length and not unmapped since;
        // nothing refers to it (the caller's slab is dropped or it left the
        // pool).
        unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
        return;
    }
    // SAFETY: allocated in `with_capacity` with this layout and not freed
    // since (a slab in the pool is not a live `Slab`).
    unsafe { dealloc(ptr.as_ptr(), layout(cap)) }
}

/// Frees every pooled slab and hands the arenas' spare memory back to the
/// system (the memory owner gives memory back when the budget shrinks).
pub(crate) fn drain() {
    if let Some(mut a) = arenas() {
        a.take_deferred();
        a.hand_back();
    }
    let pooled = match POOL.try_lock() {
        Ok(mut pool) => {
            SPARE.fetch_sub(pool.bytes, Relaxed);
            pool.bytes = 0;
            std::mem::take(&mut pool.free)
        }
        Err(_) => return,
    };
    for (cap, ptrs) in pooled {
        for ptr in ptrs {
            // Owned by the pool alone, and removed from it above.
            free(ptr, cap);
        }
    }
}

/// The slots of one capacity (module docs).
#[derive(Default)]
struct Class {
    /// Free slots whose pages are resident (counted in [`SPARE`]).
    free: Vec<NonNull<u8>>,
    /// Free slots handed back to the system (`MADV_DONTNEED`).
    cold: Vec<NonNull<u8>>,
    /// The uncarved rest of the class's last chunk.
    tail: Option<Tail>,
    /// Chunks mapped for the class while it still had a tail (two threads
    /// mapped one at once, [`carve`]), each `true` when populated; the next
    /// tails.
    fresh: Vec<(NonNull<u8>, bool)>,
}

struct Tail {
    next: NonNull<u8>,
    left: usize,
    /// Populated (counted in [`SPARE`]), or left to fault in.
    resident: bool,
}

/// The arenas: slot classes by capacity.
struct Arenas {
    classes: BTreeMap<usize, Class>,
}

// SAFETY: the arenas hold pointers into chunks they own and no live slab
// refers to (a slot is in a list only while free); moving them between
// threads is moving ownership of plain memory.
unsafe impl Send for Arenas {}

static ARENAS: Mutex<Arenas> = Mutex::new(Arenas { classes: BTreeMap::new() });

/// Slots freed while another thread held [`ARENAS`]: a stack threaded
/// through the slots themselves (each begins with the next slot's address and
/// its own capacity), emptied by the next thread that takes the lock.
static DEFERRED: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// The arenas, if their lock can be had without waiting long. Never blocks:
/// a thread that held it when the process forked holds it forever in the
/// child, which then keeps its records in slabs of their own.
fn arenas() -> Option<MutexGuard<'static, Arenas>> {
    for _ in 0..64 {
        match ARENAS.try_lock() {
            Ok(g) => return Some(g),
            // Nothing panics while the arenas are changed.
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// A free slot of `cap` bytes (module docs), or `None` when the arenas are
/// busy or out of address space: the caller then allocates.
///
/// A new chunk is mapped and populated with the arenas unlocked: populating
/// 2 MiB takes a fraction of a millisecond, during which the other threads
/// filling the cache would spin on the lock (`sched_yield`) and then give up
/// and allocate from the heap (`mprotect` and a page fault per 4 KiB).
fn carve(cap: usize) -> Option<NonNull<u8>> {
    {
        let mut a = arenas()?;
        a.take_deferred();
        if let Some(p) = a.carve(cap) {
            return Some(p);
        }
    }
    let populate = SPARE.load(Relaxed) + CHUNK - cap <= POOL_LIMIT.load(Relaxed);
    let base = map_chunk(populate)?;
    match arenas() {
        Some(mut a) => Some(a.install(cap, base, populate)),
        None => {
            // SAFETY: the chunk was mapped above and nothing refers to it.
            unsafe { libc::munmap(base.as_ptr().cast(), CHUNK) };
            None
        }
    }
}

/// Gives a slot back to its class.
fn release(ptr: NonNull<u8>, cap: usize) {
    match ARENAS.try_lock() {
        Ok(mut a) => a.put(ptr, cap),
        Err(TryLockError::Poisoned(p)) => p.into_inner().put(ptr, cap),
        Err(TryLockError::WouldBlock) => defer(ptr, cap),
    }
}

/// Pushes a freed slot on [`DEFERRED`].
fn defer(ptr: NonNull<u8>, cap: usize) {
    let slot = ptr.as_ptr().cast::<usize>();
    let mut head = DEFERRED.load(Relaxed);
    loop {
        // SAFETY: the slot is free (its slab is being dropped) and at least
        // SMALL = 64 bytes, aligned to SMALL: its first two words are ours to
        // write until a thread takes the stack (with Acquire, after this
        // Release).
        unsafe {
            slot.write(head as usize);
            slot.add(1).write(cap);
        }
        match DEFERRED.compare_exchange_weak(head, ptr.as_ptr(), Release, Relaxed) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

/// Hands the whole pages inside `len` bytes at `ptr` back to the system;
/// they read as zeros when touched again.
fn dontneed(ptr: *mut u8, len: usize) {
    let start = (ptr as usize).div_ceil(PAGE) * PAGE;
    let end = (ptr as usize + len) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies inside a free slot or an uncarved tail of a
        // chunk the arenas mapped: no slab refers to it, and private
        // anonymous pages handed back read as zeros, which is initialised
        // memory.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

/// A fresh chunk, populated when `populate`; `None` when it cannot be mapped.
/// Chunks are never unmapped.
fn map_chunk(populate: bool) -> Option<NonNull<u8>> {
    map(CHUNK, populate)
}

/// A fresh anonymous mapping of `len` bytes (page-aligned, reading as
/// zeros), populated when `populate` (its pages allocated, cleared and
/// charged in one call rather than a fault each on first touch); `None` when
/// it cannot be mapped.
pub(crate) fn map(len: usize, populate: bool) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing aliases nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    if populate {
        // SAFETY: the range is the mapping just made. A kernel without
        // MADV_POPULATE_WRITE (before 5.14) refuses it, and the pages fault
        // in on first touch instead.
        unsafe { libc::madvise(raw, len, libc::MADV_POPULATE_WRITE) };
    }
    NonNull::new(raw.cast::<u8>())
}

impl Arenas {
    /// Puts the slots freed meanwhile ([`DEFERRED`]) back in their classes.
    fn take_deferred(&mut self) {
        let mut p = DEFERRED.swap(std::ptr::null_mut(), Acquire);
        while let Some(ptr) = NonNull::new(p) {
            let slot = ptr.as_ptr().cast::<usize>();
            // SAFETY: `defer` wrote these two words before pushing the slot
            // (Release, taken with Acquire above); the slot is free and
            // this thread now owns the stack.
            let (next, cap) = unsafe { (slot.read(), slot.add(1).read()) };
            self.put(ptr, cap);
            p = next as *mut u8;
        }
    }

    /// A slot of class `cap` from its free lists or its last chunk's rest;
    /// `None` when the class needs a new chunk ([`Arenas::install`]).
    fn carve(&mut self, cap: usize) -> Option<NonNull<u8>> {
        let class = self.classes.entry(cap).or_default();
        if let Some(p) = class.free.pop() {
            SPARE.fetch_sub(cap, Relaxed);
            return Some(p);
        }
        if let Some(p) = class.cold.pop() {
            return Some(p);
        }
        if class.tail.as_ref().is_none_or(|t| t.left < cap) {
            if let Some((base, resident)) = class.fresh.pop() {
                return Some(self.install(cap, base, resident));
            }
        }
        let class = self.classes.get_mut(&cap).expect("made above");
        if let Some(t) = class.tail.as_mut().filter(|t| t.left >= cap) {
            let p = t.next;
            // SAFETY: `left >= cap` bytes of the chunk follow `next`.
            t.next = unsafe { NonNull::new_unchecked(p.as_ptr().add(cap)) };
            t.left -= cap;
            if t.resident {
                SPARE.fetch_sub(cap, Relaxed);
            }
            return Some(p);
        }
        None
    }

    /// Makes the fresh chunk at `base` (`resident`: populated) the tail of
    /// class `cap` and returns its first slot; a tail left from before, too
    /// short for a slot, is handed back. When another thread's chunk became
    /// the tail meanwhile, the slot comes from it and this chunk waits in
    /// [`Class::fresh`].
    fn install(&mut self, cap: usize, base: NonNull<u8>, resident: bool) -> NonNull<u8> {
        let class = self.classes.entry(cap).or_default();
        if class.tail.as_ref().is_some_and(|t| t.left >= cap) {
            // Another thread's chunk came first: this one is the next.
            class.fresh.push((base, resident));
            let p = self.carve(cap).expect("the tail has room for a slot");
            return p;
        }
        if let Some(t) = class.tail.take() {
            if t.resident {
                dontneed(t.next.as_ptr(), t.left);
                SPARE.fetch_sub(t.left, Relaxed);
            }
        }
        // SAFETY: `cap <= MAX_CARVED < CHUNK`: the chunk goes on past `cap`.
        let next = unsafe { NonNull::new_unchecked(base.as_ptr().add(cap)) };
        class.tail = Some(Tail { next, left: CHUNK - cap, resident });
        if resident {
            SPARE.fetch_add(CHUNK - cap, Relaxed);
        }
        base
    }

    fn put(&mut self, ptr: NonNull<u8>, cap: usize) {
        let class = self.classes.entry(cap).or_default();
        if SPARE.load(Relaxed) + cap <= POOL_LIMIT.load(Relaxed) {
            SPARE.fetch_add(cap, Relaxed);
            class.free.push(ptr);
        } else {
            dontneed(ptr.as_ptr(), cap);
            class.cold.push(ptr);
        }
    }

    /// Hands every free slot and chunk tail back to the system.
    fn hand_back(&mut self) {
        for (&cap, class) in self.classes.iter_mut() {
            for p in class.free.drain(..) {
                dontneed(p.as_ptr(), cap);
                SPARE.fetch_sub(cap, Relaxed);
                class.cold.push(p);
            }
            for (base, resident) in class.fresh.iter_mut().filter(|(_, r)| *r) {
                dontneed(base.as_ptr(), CHUNK);
                *resident = false;
            }
            if let Some(t) = class.tail.as_mut().filter(|t| t.resident) {
                dontneed(t.next.as_ptr(), t.left);
                SPARE.fetch_sub(t.left, Relaxed);
                t.resident = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slab_is_aligned_rounded_and_comes_back_from_the_pool() {
        // A size no other test takes, so only this test pools slabs of it.
        let len = 37 * GRAIN - 5;
        let mut a = Slab::take_aligned(len);
        assert_eq!(a.as_ref().len(), 37 * GRAIN);
        assert_eq!(Slab::take_aligned(1).as_ref().as_ptr() as usize % ALIGN, 0);
        assert_eq!(a.as_mut_slice().as_ptr() as usize % ALIGN, 0);
        a.as_mut_slice()[..5].copy_from_slice(b"hello");
        let bytes = a.freeze();
        let rec = bytes.slice(1..4);
        drop(bytes);
        assert_eq!(&rec[..], b"ell", "a record keeps its slab alive");
        drop(rec);
        // A test on another thread may hold the pool for an instant (the drop
        // then frees instead of pooling): try a few times.
        let reused = (0..20).any(|_| {
            let s = Slab::take(len);
            let ptr = s.as_ref().as_ptr();
            drop(s);
            Slab::take(len).as_ref().as_ptr() == ptr
        });
        assert!(reused, "a freed slab is handed out again for the same size");
    }

    #[test]
    fn a_copy_holds_exactly_the_bytes() {
        for len in [0, 1, 63, 64, 65, 12_288, GRAIN, GRAIN + 1] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(&Slab::copy_of(&data)[..], &data[..], "len {len}");
            assert!(capacity(len) >= len && capacity(len) < len.max(1) + GRAIN);
        }
    }

    /// A record of 64 KiB + 1 byte used to take a 128 KiB slab (2× its size,
    /// and the cache charged only its length): it now takes 68 KiB. A record
    /// wastes under 64 bytes, or at most a sixteenth of it from 64 KiB up.
    #[test]
    fn a_record_wastes_at_most_a_sixteenth() {
        for len in [1, 63, 64, 65, 4095, 12_288, GRAIN - 1, GRAIN, GRAIN + 1, 3 * GRAIN + 7, 1 << 24] {
            let cap = record_capacity(len);
            assert!(cap >= len && (cap - len < SMALL || (cap - len) * 16 <= len), "len {len}: capacity {cap}");
            assert_eq!(Slab::copy_of(&vec![1; len]).len(), len);
        }
        assert_eq!(record_capacity(GRAIN + 1), GRAIN + ALIGN);
        // Aligned as its capacity class says (a page from GRAIN up).
        let b = Slab::copy_of(&vec![0; GRAIN + 1]);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
    }

    /// Records are carved from chunks, a freed slot is handed out again for
    /// the next record of its capacity, and a drained one comes back as
    /// zeros: its pages went back to the system.
    #[test]
    fn a_chunk_mapped_while_another_became_the_tail_is_kept_for_later() {
        // Two threads found the class out of slots and each mapped a chunk
        // without the lock ([`carve`]): the second chunk installed waits
        // for the first to be used up instead of being handed back.
        let mut a = Arenas { classes: BTreeMap::new() };
        const LEN: usize = 5 * PAGE;
        assert!(a.carve(LEN).is_none(), "a new class needs a chunk");
        let (first, second) = (map_chunk(false).unwrap(), map_chunk(false).unwrap());
        assert_eq!(a.install(LEN, first, false), first);
        let next = a.install(LEN, second, false);
        assert_eq!(next.as_ptr() as usize, first.as_ptr() as usize + LEN, "the slot came from the first chunk");
        let per_chunk = CHUNK / LEN;
        let slots: Vec<usize> = (0..2 * per_chunk - 2).map(|_| a.carve(LEN).unwrap().as_ptr() as usize).collect();
        let in_chunk = |c: NonNull<u8>, p: usize| (c.as_ptr() as usize..c.as_ptr() as usize + CHUNK).contains(&p);
        assert!(slots[..per_chunk - 2].iter().all(|&p| in_chunk(first, p)), "the first chunk is used up first");
        assert!(slots[per_chunk - 2..].iter().all(|&p| in_chunk(second, p)), "then the second, whole");
        assert!(a.carve(LEN).is_none(), "both used up: a new chunk is needed");
    }

    #[test]
    fn records_are_carved_reused_and_handed_back() {
        // A capacity no other test takes: only this test uses its class.
        const LEN: usize = 7 * PAGE;
        assert_eq!(record_capacity(LEN), LEN);
        let data: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8 + 1).collect();
        // More than a chunk's worth: a second chunk is mapped.
        let many: Vec<Bytes> = (0..2 * CHUNK / LEN).map(|_| Slab::copy_of(&data)).collect();
        assert!(many.iter().all(|b| b[..] == data[..]));
        let ptrs: std::collections::HashSet<usize> = many.iter().map(|b| b.as_ptr() as usize).collect();
        assert_eq!(ptrs.len(), many.len(), "every record has a slot of its own");
        // The arenas may be busy for a moment with another test's records
        // (the record then gets a slab of its own): try a few times.
        drop(many);
        let reused = (0..20).any(|_| ptrs.contains(&(Slab::copy_of(&data).as_ptr() as usize)));
        assert!(reused, "a freed slot is handed out again for the same capacity");
        let zeroed = (0..20).any(|_| {
            let b = Slab::copy_of(&data);
            let ptr = b.as_ptr() as usize;
            drop(b);
            drain();
            let again = carve(LEN);
            let back = again.map(|p| {
                // SAFETY: a slot of LEN bytes the arenas handed to this test
                // alone; its bytes are initialised (module docs).
                let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), LEN) };
                let zero = p.as_ptr() as usize == ptr && bytes.iter().all(|&b| b == 0);
                release(p, LEN);
                zero
            });
            back == Some(true)
        });
        assert!(zeroed, "a drained slot's pages were handed back to the system");
    }

    /// Records larger than MAX_CARVED keep slabs of their own; every size
    /// round-trips through the arenas' and the heap's slots alike.
    #[test]
    fn carved_and_own_slabs_hold_their_bytes() {
        for len in [1, 64, 4096, 12_288, MAX_CARVED, MAX_CARVED + 1] {
            let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
            let kept: Vec<Bytes> = (0..3).map(|_| Slab::copy_of(&data)).collect();
            assert!(kept.iter().all(|b| b[..] == data[..]), "len {len}");
        }
    }

    #[test]
    fn the_limits_follow_the_budget_share() {
        assert_eq!(limits(u64::MAX), (POOL_BYTES, IN_FLIGHT_BYTES));
        assert_eq!(limits(80 << 20), (POOL_BYTES, IN_FLIGHT_BYTES));
        let (pool, in_flight) = limits(8 << 20);
        assert_eq!((pool, pool as u64 + in_flight), ((8 << 20) * 3 / 5, 8 << 20));
        assert_eq!(limits(0), (0, ALIGN as u64));
    }
}
