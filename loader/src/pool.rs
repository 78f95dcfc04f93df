//! Recycled buffers.
//!
//! A [`Pooled`] value owns a `Vec` outright, so nothing can write to it while
//! the caller holds it; recycling happens only in `Drop`, when the caller has
//! given it up. That is the whole safety argument for reuse, and it needs no
//! `unsafe`: a batch the caller still holds can never be overwritten because
//! no one else has a reference to its memory.
//!
//! Buffers go back with their length unchanged. The next [`Pool::take`]
//! resizes to the length it needs, which writes zeros only over the part that
//! grows, so a fixed-layout stream (same length every step) neither
//! allocates nor clears memory in a steady state.
//!
//! A pool made with [`Pool::aligned`] hands out buffers whose first element
//! sits on a given byte boundary (a page, for batch data): each `Vec` is
//! allocated that much longer and the buffer starts inside it at the first
//! boundary. Slots of a whole number of pages are then page-aligned, so the
//! store can read such records from disk with O_DIRECT straight into them.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Batch data starts on a page boundary, so rows of a whole number of pages
/// are page-aligned and the store reads them from disk straight into place
/// (O_DIRECT) rather than through its scratch buffer.
pub(crate) const PAGE: usize = 4096;

/// A buffer of gathered bytes that returns to its loader's pool when dropped.
pub type PooledBuf = Pooled<u8>;

/// A free list of `Vec<T>`s, shared by the loader's workers and by every
/// [`Pooled`] value taken from it.
#[derive(Debug)]
pub(crate) struct Pool<T> {
    free: Mutex<Vec<Vec<T>>>,
    /// At most this many free buffers are kept; more are freed on return.
    retain: usize,
    /// How many times `take` had to allocate (no free buffer, or one too
    /// small). Flat in a steady state; it grows while the caller holds many
    /// batches or ragged records outgrow every buffer seen so far.
    allocations: AtomicU64,
    /// Each buffer starts on a multiple of this many bytes (a power of two).
    align: usize,
}

impl<T: Clone + Default + Send + 'static> Pool<T> {
    /// A pool keeping up to `retain` free buffers, `prefill` of them
    /// allocated now with `len` elements each.
    pub(crate) fn new(retain: usize, prefill: usize, len: usize) -> Arc<Self> {
        Self::aligned(retain, prefill, len, std::mem::align_of::<T>())
    }

    /// [`Pool::new`] whose buffers each start on a multiple of `align`
    /// bytes (a power of two, at least `T`'s own alignment).
    pub(crate) fn aligned(retain: usize, prefill: usize, len: usize, align: usize) -> Arc<Self> {
        assert!(align.is_power_of_two() && align >= std::mem::align_of::<T>(), "pool alignment {align}");
        let pool = Pool { free: Mutex::new(Vec::with_capacity(retain)), retain, allocations: AtomicU64::new(0), align };
        let free = (0..prefill.min(retain))
            .map(|_| {
                let mut vec = Vec::with_capacity(len + pool.pad());
                let start = pool.start_of(&vec);
                vec.resize(start + len, T::default());
                vec
            })
            .collect();
        *pool.free.lock().unwrap_or_else(PoisonError::into_inner) = free;
        Arc::new(pool)
    }

    /// Elements a buffer may need to skip to reach the boundary.
    fn pad(&self) -> usize {
        (self.align - std::mem::align_of::<T>()) / std::mem::size_of::<T>().max(1)
    }

    /// Where in `vec`'s allocation the first boundary is, in elements.
    fn start_of(&self, vec: &[T]) -> usize {
        let size = std::mem::size_of::<T>().max(1);
        let misaligned = vec.as_ptr() as usize & (self.align - 1);
        ((self.align - misaligned) & (self.align - 1)) / size
    }

    /// A buffer of exactly `len` elements: a recycled one if any is free
    /// (its old contents are not cleared), a new one otherwise.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> Pooled<T> {
        let recycled = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut vec = recycled.unwrap_or_default();
        let capacity = vec.capacity();
        let need = len + self.pad();
        if capacity < need {
            vec.reserve_exact(need - vec.len());
        }
        let start = self.start_of(&vec);
        vec.resize(start + len, T::default());
        if vec.capacity() != capacity {
            self.allocations.fetch_add(1, Ordering::Relaxed);
        }
        Pooled { vec, start, pool: Some(Arc::clone(self)) }
    }

    /// How many times [`Pool::take`] allocated.
    pub(crate) fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// The number of free buffers (for tests).
    #[cfg(test)]
    pub(crate) fn free_len(&self) -> usize {
        self.free.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn give_back(&self, vec: Vec<T>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < self.retain {
            free.push(vec);
        }
    }
}

/// A buffer owned by one holder that goes back to the loader's pool when
/// dropped, so steady-state loading reuses memory instead of allocating it.
///
/// It dereferences to `[T]` and may be kept for as long as needed (for
/// example as the base object of a NumPy array): the loader allocates a new
/// buffer rather than wait for or touch a held one. [`Pooled::into_vec`]
/// detaches the buffer from the pool for callers that want a plain `Vec`.
pub struct Pooled<T: Clone + Default + Send + 'static> {
    /// The allocation; the buffer is `vec[start..]`.
    vec: Vec<T>,
    start: usize,
    /// `None` once detached; dropping then simply frees the memory.
    pool: Option<Arc<Pool<T>>>,
}

impl<T: Clone + Default + Send + 'static> Pooled<T> {
    /// The buffer as a slice.
    pub fn as_slice(&self) -> &[T] {
        &self.vec[self.start..]
    }

    /// The buffer as a mutable slice. The holder owns it exclusively, so
    /// writing to it affects nothing else.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.vec[self.start..]
    }

    /// Takes the buffer out of the pool's cycle and returns it as a plain
    /// `Vec` (no copy). The pool allocates a replacement when it next needs one.
    pub fn into_vec(mut self) -> Vec<T> {
        self.pool = None;
        let mut vec = std::mem::take(&mut self.vec);
        vec.drain(..self.start);
        vec
    }
}

impl<T: Clone + Default + Send + 'static> Drop for Pooled<T> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.vec));
        }
    }
}

impl<T: Clone + Default + Send + 'static> Deref for Pooled<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Clone + Default + Send + 'static> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: Clone + Default + Send + 'static> AsRef<[T]> for Pooled<T> {
    fn as_ref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Clone + Default + Send + 'static> fmt::Debug for Pooled<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pooled").field("len", &self.as_slice().len()).field("pooled", &self.pool.is_some()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_not_shared() {
        let pool = Pool::<u8>::new(4, 0, 0);
        let mut a = pool.take(8);
        a.copy_from_slice(&[7; 8]);
        let ptr = a.as_ptr();
        drop(a);
        assert_eq!(pool.free_len(), 1);
        // The recycled buffer comes back with the requested length; while it
        // is held, another take gets a different buffer.
        let b = pool.take(8);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(pool.allocations(), 1);
        let c = pool.take(8);
        assert_ne!(c.as_ptr(), b.as_ptr());
        assert_eq!(c.len(), 8);
        assert_eq!(pool.allocations(), 2);
        // Growing a recycled buffer past its capacity counts as allocating;
        // shrinking it does not.
        drop(c);
        let d = pool.take(1 << 16);
        assert_eq!(pool.allocations(), 3);
        drop(d);
        drop(pool.take(4));
        assert_eq!(pool.allocations(), 3);
    }

    #[test]
    fn retention_is_capped() {
        let pool = Pool::<u64>::new(2, 0, 0);
        let held: Vec<_> = (0..5).map(|_| pool.take(3)).collect();
        drop(held);
        assert_eq!(pool.free_len(), 2);
    }

    #[test]
    fn aligned_buffers_start_on_the_boundary_however_they_are_recycled() {
        let pool = Pool::<u8>::aligned(3, 2, 3 * 4096, 4096);
        for len in [3 * 4096, 5, 4096 * 7, 1, 0, 12_288] {
            let mut held = Vec::new();
            for k in 0..4u8 {
                let mut b = pool.take(len);
                assert_eq!(b.len(), len);
                assert_eq!(b.as_ptr() as usize % 4096, 0, "length {len}");
                b.fill(k);
                held.push(b);
            }
            for (k, b) in held.iter().enumerate() {
                assert!(b.iter().all(|&x| x == k as u8), "buffers overlap");
            }
        }
        let mut b = pool.take(6);
        b.copy_from_slice(b"abcdef");
        assert_eq!(b.into_vec(), b"abcdef");
        let words = Pool::<u64>::aligned(1, 1, 3, 4096);
        assert_eq!(words.take(3).as_ptr() as usize % 4096, 0);
    }

    #[test]
    fn into_vec_detaches() {
        let pool = Pool::<u8>::new(2, 1, 4);
        let buf = pool.take(4);
        let v = buf.into_vec();
        assert_eq!(v.len(), 4);
        assert_eq!(pool.free_len(), 0);
    }
}
