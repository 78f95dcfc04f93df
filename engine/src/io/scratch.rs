//! The scratch buffer a gather reads records into when they cannot go
//! straight into their slots (O_DIRECT records not whole pages bound for
//! page-aligned rows, compressed records), kept by its thread between
//! gathers only within the budget's share for the reads
//! ([`crate::io::slab::reads_share`]).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::io::uring::AlignedBuf;

/// Bytes of gathers' scratch buffers kept between gathers, every thread's
/// ([`keep_scratch`]).
static SCRATCH_KEPT: AtomicUsize = AtomicUsize::new(0);

/// A thread's kept scratch buffer, counted in [`SCRATCH_KEPT`] while kept.
struct Kept(AlignedBuf);

impl Drop for Kept {
    fn drop(&mut self) {
        SCRATCH_KEPT.fetch_sub(self.0.capacity(), Relaxed);
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Kept>> = const { std::cell::RefCell::new(None) };
}

/// The scratch buffer a gather on this thread reads records into
/// ([`crate::read::gather`]): the one the thread's last gather kept, or an
/// empty one. Give it back with [`keep_scratch`].
pub(crate) fn take_scratch() -> AlignedBuf {
    let kept = SCRATCH.try_with(|s| s.borrow_mut().take()).ok().flatten();
    match kept {
        // Uncounted as it leaves (the emptied `Kept` then uncounts none).
        Some(mut k) => {
            SCRATCH_KEPT.fetch_sub(k.0.capacity(), Relaxed);
            std::mem::replace(&mut k.0, AlignedBuf::new())
        }
        None => AlignedBuf::new(),
    }
}

/// Keeps a gather's scratch buffer for this thread's next gather, or frees
/// it. A gather's scratch is as large as the records of its batch that are
/// read through it (4,096 records of 64 KiB + 1 byte: 288 MiB), and was kept
/// whatever its size, by every thread that gathered, beside a record cache
/// that filled the budget. What all threads keep counts against the reads'
/// share of the budget ([`set_limits`]: the pool's limit and the reads' in
/// flight, which no read uses between gathers): a buffer that would take
/// the kept bytes past it is freed (unmapped) and the next gather allocates
/// again. A budget that shrinks below what is kept frees
/// each thread's buffer at that thread's next gather.
pub(crate) fn keep_scratch(buf: AlignedBuf) {
    let len = buf.capacity();
    let limit = crate::io::slab::reads_share();
    let fits = |k: usize| (k + len <= limit).then_some(k + len);
    if len == 0 || SCRATCH_KEPT.fetch_update(Relaxed, Relaxed, fits).is_err() {
        return;
    }
    // Counted from here on: dropped (a thread exiting) it is uncounted.
    let mut kept = Some(Kept(buf));
    let _ = SCRATCH.try_with(|s| *s.borrow_mut() = kept.take());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gather's scratch buffer was kept by its thread whatever its size
    /// (a batch of 4,096 records of 64 KiB + 1 byte: 288 MiB, beside a
    /// record cache that filled the budget). One past the reads' share in
    /// flight is freed, its thread keeps none.
    #[test]
    fn a_scratch_buffer_past_the_reads_share_is_freed_after_its_gather() {
        // Past the largest share whatever limits other tests set.
        let mut big = AlignedBuf::new();
        let _ = big.get_in(crate::io::slab::POOL_BYTES + crate::io::slab::IN_FLIGHT_BYTES as usize + (64 << 10));
        let cap = big.capacity();
        keep_scratch(big);
        assert_eq!(take_scratch().capacity(), 0, "a buffer of {cap} bytes was kept");
    }
}
