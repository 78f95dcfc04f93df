//! Batched positional I/O: io_uring, with `pread`/`pwrite` as the reference
//! backend and the fallback where io_uring is unavailable (Docker's default
//! seccomp profile blocks `io_uring_setup`).
//!
//! The kernel owns a request's buffer from submission until its completion.
//! [`run`] is blocking: an [`InFlight`](ring::InFlight) guard counts submitted requests and,
//! on every exit path including unwinding out of the completion callback,
//! waits for all of them before the borrows behind the raw pointers end.
//!
//! A transfer and its failure are [`req`]; the io_uring backend, its rings
//! and their registered buffers, [`ring`]; the reference backend, [`sync`];
//! the batches callers make are here.

mod req;
mod ring;
mod sync;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use self::req::{no_prepare, Prepare};
pub(crate) use self::req::{Op, Req, ReqError, ReqErrorKind};
use self::ring::{new_ring, register, run_uring, unregister, REGISTERED, RING, RING_ENTRIES};
pub(crate) use self::ring::{uring_available, Region};
use self::sync::run_sync;
use crate::io::slab::Slab;

/// Which backend carries the batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// io_uring when the kernel allows it, else pread. `ZRING_BACKEND=uring|pread`
    /// overrides it for the whole process.
    Auto,
    /// io_uring; opening fails when the kernel refuses a ring.
    Uring,
    /// One `pread`/`pwrite` system call per transfer.
    Pread,
}

impl BackendKind {
    /// Resolves `Auto` (and the environment override) to a concrete backend.
    pub(crate) fn resolve(self) -> io::Result<BackendKind> {
        let wanted = match (self, crate::env::backend().as_deref()) {
            (BackendKind::Auto, Some("uring")) => BackendKind::Uring,
            (BackendKind::Auto, Some("pread")) => BackendKind::Pread,
            (k, _) => k,
        };
        match wanted {
            BackendKind::Pread => Ok(BackendKind::Pread),
            BackendKind::Uring => match uring_available() {
                Ok(()) => Ok(BackendKind::Uring),
                Err(e) => Err(io::Error::new(e.kind(), format!("io_uring is unavailable: {e}"))),
            },
            BackendKind::Auto => Ok(if uring_available().is_ok() { BackendKind::Uring } else { BackendKind::Pread }),
        }
    }

    /// The name used in stats and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Uring => "io_uring",
            BackendKind::Pread => "pread",
        }
    }
}

/// Runs every request in `reqs`, calling `on_done(i)` once request `i` has fully
/// completed. Stops issuing new requests at the first failure, waits for those
/// in flight, and reports the failure.
///
/// `idle` is called exactly once, on this thread, with the first requests
/// already in the kernel's hands (io_uring) or before any runs (pread), so
/// work that needs no I/O overlaps the transfers. At most `limit` requests
/// are in flight at once. A request whose `ptr` is null gets its buffer from
/// `prepare(i)` when it is first submitted, so buffers for a long batch need
/// not all exist at once.
///
/// # Safety
/// For every request, `ptr..ptr + len` (or, for a null `ptr`, what `prepare`
/// returns for it, from its return on) must be valid for writes (`Op::Read`) or
/// reads (`Op::Write`) for the whole call, the ranges of different requests must
/// not overlap, and nothing may access a range until its `on_done` call (the
/// callback may access range `i` from its call for `i` on). `fd` must stay open
/// for the whole call.
unsafe fn run(
    backend: BackendKind,
    op: Op,
    reqs: &mut [Req],
    limit: usize,
    prepare: Prepare<'_>,
    on_done: &mut dyn FnMut(usize),
    idle: &mut dyn FnMut(),
) -> Result<(), ReqError> {
    // SAFETY: the caller's contract is forwarded unchanged; no region.
    unsafe { run_in(backend, op, reqs, limit, None, prepare, on_done, idle) }
}

/// [`run`], with reads that lie inside `region` made as fixed-buffer reads.
///
/// # Safety
/// As for [`run`]; and `region`, if given, must be one live allocation,
/// valid for writes, for the whole call.
#[allow(clippy::too_many_arguments, reason = "run's arguments and the region, passed down once")]
unsafe fn run_in(
    backend: BackendKind,
    op: Op,
    reqs: &mut [Req],
    limit: usize,
    region: Option<Region>,
    prepare: Prepare<'_>,
    on_done: &mut dyn FnMut(usize),
    idle: &mut dyn FnMut(),
) -> Result<(), ReqError> {
    if reqs.is_empty() {
        idle();
        return Ok(());
    }
    match backend {
        BackendKind::Uring => {
            let pid = std::process::id();
            let ring = RING.with(|cell| match cell.borrow_mut().take() {
                Some((p, ring)) if p == pid => ring,
                // A parent's ring in a forked child: dropping it unmaps the
                // child's copy and closes the child's descriptor only.
                _ => {
                    REGISTERED.with(|c| c.set((0, false)));
                    new_ring(RING_ENTRIES).ok()
                }
            });
            let Some(mut ring) = ring else {
                // This thread cannot make a ring (a locked-memory limit, say):
                // it reads with pread from now on.
                RING.with(|cell| *cell.borrow_mut() = Some((pid, None)));
                idle();
                // SAFETY: the caller's contract is forwarded unchanged.
                return unsafe { run_sync(op, reqs, prepare, on_done) };
            };
            let mut healthy = false;
            // Nothing is in flight on the ring between batches.
            // SAFETY: the caller guarantees the region is one live allocation.
            let region = region.filter(|r| op == Op::Read && unsafe { register(&ring, r) });
            // SAFETY: the caller's contract is forwarded unchanged, and the
            // region is registered with this ring.
            let r = unsafe { run_uring(&mut ring, op, reqs, limit, region, prepare, on_done, idle, &mut healthy) };
            // A ring whose enter failed may hold entries it never submitted,
            // pointing at this call's buffers: it is dropped, and the next
            // batch makes a new one.
            if healthy {
                RING.with(|cell| *cell.borrow_mut() = Some((pid, Some(ring))));
            } else {
                REGISTERED.with(|c| c.set((0, false)));
            }
            r
        }
        _ => {
            idle();
            // SAFETY: the caller's contract is forwarded unchanged.
            unsafe { run_sync(op, reqs, prepare, on_done) }
        }
    }
}

/// One read of a batch: fill `buf` from `fd` at `offset`; end of file is
/// acceptable once `need` bytes have arrived.
pub(crate) struct ReadBuf<'a> {
    pub fd: BorrowedFd<'a>,
    pub offset: u64,
    pub buf: &'a mut [u8],
    pub need: usize,
}

/// Runs a batch of reads; as read `i` completes, its buffer is handed back
/// through `on_done(i, buf)`, while the other reads may still be in flight.
/// `idle` runs once while the first reads are in flight (see [`run`]).
///
/// Reads whose buffers lie inside `region` (the allocation they were cut
/// from, [`AlignedBuf::get_in`]) are made as fixed-buffer reads.
pub(crate) fn read_batch<'a>(
    backend: BackendKind,
    reads: Vec<ReadBuf<'a>>,
    region: Option<Region>,
    on_done: &mut dyn FnMut(usize, &'a mut [u8]),
    idle: &mut dyn FnMut(),
) -> Result<(), ReqError> {
    if let Some(e) = injected(crate::io::fault::Kind::Read, reads.len()) {
        idle();
        return Err(e);
    }
    let mut reqs: Vec<Req> = reads
        .iter()
        .map(|r| Req {
            fd: r.fd.as_raw_fd(),
            offset: r.offset,
            ptr: r.buf.as_ptr().cast_mut(),
            len: r.buf.len(),
            need: r.need,
        })
        .collect();
    let mut slots: Vec<Option<&'a mut [u8]>> = reads.into_iter().map(|r| Some(r.buf)).collect();
    let mut done = |i: usize| {
        if crate::io::fault::hit(crate::io::fault::Kind::Complete).is_err() {
            panic!("injected panic in the completion callback of read {i}");
        }
        if let Some(buf) = slots[i].take() {
            on_done(i, buf);
        }
    };
    // SAFETY: each request points at its own `&'a mut` buffer, so the ranges are
    // valid for writes and disjoint. The buffers are held in `slots` and not
    // touched until their completion, when `done` moves buffer `i` out to the
    // callback. The descriptors are borrowed for `'a`, so they stay open.
    // A region comes from `AlignedBuf::get_in`, whose allocation the buffers
    // borrow from, so it lives for the call.
    unsafe { run_in(backend, Op::Read, &mut reqs, usize::MAX, region, &mut no_prepare, &mut done, idle) }
}

/// One read into a slab of its own: `len` bytes of `fd` at `offset` into the
/// start of a slab of at least `len` bytes, of which `need` must arrive (see
/// [`Req`]).
pub(crate) struct SlabRead<'f> {
    pub fd: BorrowedFd<'f>,
    pub offset: u64,
    pub len: usize,
    pub need: usize,
}

/// Runs a batch of reads, each into an O_DIRECT-aligned slab taken when the
/// read is submitted (`take(len)`: [`Slab::take_aligned`] or a slab of that
/// capacity), at most `limit` in flight;
/// as read `i` completes, its slab is handed over through `on_done(i, slab)`
/// while the others may still be in flight. Slabs of reads that did not
/// complete are dropped.
pub(crate) fn read_slabs(
    backend: BackendKind,
    reads: &[SlabRead<'_>],
    limit: usize,
    take: &mut dyn FnMut(usize, usize) -> Slab,
    on_done: &mut dyn FnMut(usize, Slab),
) -> Result<(), ReqError> {
    if let Some(e) = injected(crate::io::fault::Kind::Read, reads.len()) {
        return Err(e);
    }
    let slots: std::cell::RefCell<Vec<Option<Slab>>> = std::cell::RefCell::new(reads.iter().map(|_| None).collect());
    let mut reqs: Vec<Req> = reads
        .iter()
        .map(|r| {
            assert!(r.need <= r.len, "a read needs at most its length");
            Req { fd: r.fd.as_raw_fd(), offset: r.offset, ptr: std::ptr::null_mut(), len: r.len, need: r.need }
        })
        .collect();
    let mut prepare = |i: usize| {
        let mut slab = take(i, reads[i].len);
        assert!(slab.as_ref().len() >= reads[i].len && (slab.as_ref().as_ptr() as usize).is_multiple_of(ALIGN));
        let ptr = slab.as_mut_slice().as_mut_ptr();
        slots.borrow_mut()[i] = Some(slab);
        ptr
    };
    let mut done = |i: usize| {
        if crate::io::fault::hit(crate::io::fault::Kind::Complete).is_err() {
            panic!("injected panic in the completion callback of read {i}");
        }
        let slab = slots.borrow_mut()[i].take();
        if let Some(slab) = slab {
            on_done(i, slab);
        }
    };
    // SAFETY: each request gets, at its first submission, a slab of its own
    // of at least `len` bytes (`take`, checked above), so the ranges are valid for
    // writes and disjoint. Moving a `Slab` moves only its handle, not the heap
    // buffer the pointer names; the slabs stay in `slots`, untouched, until
    // their completion hands them to the callback, and those not completed are
    // dropped only after `run` has waited for every submitted request. The
    // descriptors are borrowed for the call.
    unsafe { run(backend, Op::Read, &mut reqs, limit, &mut prepare, &mut done, &mut || {}) }
}

/// Asks the kernel to start writing `len` bytes of `fd` at `offset` back to
/// the device now, without waiting (`sync_file_range(SYNC_FILE_RANGE_WRITE)`).
/// Durability still comes only from fsync; this only spreads the device's
/// work over the append, so the fsync of `sync` finds little left to write.
/// Errors are ignored: the fsync reports whatever matters.
pub(crate) fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: usize) {
    // SAFETY: sync_file_range reads no memory of ours; `fd` is borrowed, so it
    // is open for the call.
    let _ = unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

/// Runs a batch of writes of `(fd, offset, bytes)`.
pub(crate) fn write_batch(backend: BackendKind, writes: &[(BorrowedFd<'_>, u64, &[u8])]) -> Result<(), ReqError> {
    for (fd, offset, b) in writes {
        crate::io::fault::record(|| {
            let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default();
            crate::io::fault::Event::Write(path, *offset, b.to_vec())
        });
    }
    if let Some(e) = injected(crate::io::fault::Kind::Write, writes.len()) {
        return Err(e);
    }
    let mut reqs: Vec<Req> = writes
        .iter()
        .map(|(fd, offset, b)| Req {
            fd: fd.as_raw_fd(),
            offset: *offset,
            ptr: b.as_ptr().cast_mut(),
            len: b.len(),
            need: b.len(),
        })
        .collect();
    // SAFETY: each request reads from its own borrowed slice, alive and
    // unmodified for the call; `Op::Write` never writes through the pointer.
    // The descriptors are borrowed for the call.
    unsafe { run(backend, Op::Write, &mut reqs, usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }
}

/// Passes each of a batch's `n` transfers through the fault hook; the first
/// that is told to fail fails the batch before anything is submitted.
fn injected(kind: crate::io::fault::Kind, n: usize) -> Option<ReqError> {
    (0..n).find_map(|req| crate::io::fault::hit(kind).err().map(|e| ReqError { req, kind: ReqErrorKind::Os(e) }))
}

/// A buffer starting at an `ALIGN` boundary, as O_DIRECT transfers require:
/// an anonymous mapping of its own, unmapped when the buffer is dropped or
/// grows (a heap buffer of a few MiB, once freed, stayed in the allocator's
/// arenas; [`crate::io::scratch::keep_scratch`]).
pub(crate) struct AlignedBuf {
    /// The mapping (page-aligned), `None` before the first.
    map: Option<std::ptr::NonNull<u8>>,
    /// Its length, a multiple of `ALIGN`.
    len: usize,
    /// Names the allocation ([`Region::id`]); 0 before the first.
    id: u64,
}

// SAFETY: the buffer owns its mapping alone; moving it to another thread
// moves that ownership.
unsafe impl Send for AlignedBuf {}

pub(crate) use crate::io::slab::ALIGN;

impl AlignedBuf {
    pub fn new() -> AlignedBuf {
        AlignedBuf { map: None, len: 0, id: 0 }
    }

    /// The aligned region of at least `len` bytes (contents unspecified),
    /// and the whole allocation it lies in, for reads to register
    /// ([`read_batch`]).
    pub fn get_in(&mut self, len: usize) -> (&mut [u8], Region) {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        if self.map.is_none() || self.len < len {
            self.release();
            let cap = len.max(1).div_ceil(ALIGN) * ALIGN;
            let layout = std::alloc::Layout::from_size_align(cap, ALIGN).expect("a buffer below isize::MAX");
            let map = crate::io::slab::map(cap, true).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            (self.map, self.len) = (Some(map), cap);
            self.id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let map = self.map.expect("mapped above");
        let region = Region { id: self.id, base: map.as_ptr(), len: self.len };
        // SAFETY: a live private mapping of `self.len >= len` bytes, read as
        // zeros or as what reads wrote (initialised), reached only through
        // `&mut self`.
        (unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), len) }, region)
    }

    /// The bytes the buffer holds.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// Unregisters and unmaps the mapping, if any.
    fn release(&mut self) {
        unregister(self.id);
        if let Some(map) = self.map.take() {
            // SAFETY: mapped by `get_in` with this length, not unmapped since;
            // slices of it borrowed `&mut self`, so none is alive.
            unsafe { libc::munmap(map.as_ptr().cast(), self.len) };
        }
        self.len = 0;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests;
