//! Slabs: recycled buffers that block reads land in, and that the records
//! copied out of them are kept in by the record cache.
//!
//! A window of blocks ([`crate::read::blocks`]) is read in runs of records
//! that lie back to back in a chunk file, each run one large O_DIRECT read
//! into an ALIGN-aligned slab. Each record is then copied into a slab of its
//! own size, frozen into a [`Bytes`], and kept by the cache; a record's
//! memory is freed when it leaves the cache, so the cache's byte accounting
//! stays exact (records cut as slices of the run's slab would keep the whole
//! run alive until its last record left).
//!
//! A record's slab is rounded up to 64 bytes below [`GRAIN`] and to a page
//! ([`ALIGN`]) from there, so a record wastes at most 1/16 of its size (a run's
//! slab, rounded to [`GRAIN`], is freed as soon as its records are copied
//! out). The record cache charges each record the capacity of its slab
//! ([`record_capacity`]), which is what it holds.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

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

/// The most bytes of freed slabs the pool keeps; beyond it a freed slab goes
/// back to the allocator. Above one batch of a window's load
/// ([`crate::read::blocks`]), whose run slabs return as their records are
/// copied out.
pub(crate) const POOL_BYTES: usize = 48 << 20;

/// The most bytes block reads keep in flight at once ([`crate::read::blocks`]).
pub(crate) const IN_FLIGHT_BYTES: u64 = 32 << 20;

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
    let over = POOL.try_lock().is_ok_and(|p| p.bytes > pool);
    if over {
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
/// birth, owned alone until frozen (module docs).
pub(crate) struct Slab {
    ptr: NonNull<u8>,
    cap: usize,
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
                return Slab { ptr, cap };
            }
        }
        // SAFETY: the layout has a non-zero size (every capacity is at least
        // SMALL).
        let raw = unsafe { alloc_zeroed(layout(cap)) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout(cap)));
        Slab { ptr, cap }
    }

    /// The whole buffer, for a read to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `cap` bytes, initialised
        // (zeroed at allocation, written only through slices since), and
        // `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// A slab of at least `len` bytes aligned for O_DIRECT ([`ALIGN`]): one
    /// of at least [`GRAIN`] bytes.
    pub fn take_aligned(len: usize) -> Slab {
        Slab::take(len.max(GRAIN))
    }

    /// A slab holding a copy of `bytes`, frozen.
    pub fn copy_of(bytes: &[u8]) -> Bytes {
        let mut slab = Slab::with_capacity(record_capacity(bytes.len()));
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
        if let Ok(mut pool) = POOL.try_lock() {
            if pool.bytes + self.cap <= POOL_LIMIT.load(Relaxed) {
                pool.bytes += self.cap;
                pool.free.entry(self.cap).or_default().push(self.ptr);
                return;
            }
        }
        // SAFETY: allocated in `take` with this layout and not freed since
        // (a slab in the pool is not a live `Slab`).
        unsafe { dealloc(self.ptr.as_ptr(), layout(self.cap)) }
    }
}

/// Frees every pooled slab (the memory owner gives memory back to the
/// system when the budget shrinks).
pub(crate) fn drain() {
    let free = match POOL.try_lock() {
        Ok(mut pool) => {
            pool.bytes = 0;
            std::mem::take(&mut pool.free)
        }
        Err(_) => return,
    };
    for (cap, ptrs) in free {
        for ptr in ptrs {
            // SAFETY: each pooled pointer was allocated with this layout and
            // is owned by the pool alone; it was removed from the pool above.
            unsafe { dealloc(ptr.as_ptr(), layout(cap)) }
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

    #[test]
    fn the_limits_follow_the_budget_share() {
        assert_eq!(limits(u64::MAX), (POOL_BYTES, IN_FLIGHT_BYTES));
        assert_eq!(limits(80 << 20), (POOL_BYTES, IN_FLIGHT_BYTES));
        let (pool, in_flight) = limits(8 << 20);
        assert_eq!((pool, pool as u64 + in_flight), ((8 << 20) * 3 / 5, 8 << 20));
        assert_eq!(limits(0), (0, ALIGN as u64));
    }
}
