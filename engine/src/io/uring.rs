//! Batched positional I/O: io_uring, with `pread`/`pwrite` as the reference
//! backend and the fallback where io_uring is unavailable (Docker's default
//! seccomp profile blocks `io_uring_setup`).
//!
//! The kernel owns a request's buffer from submission until its completion.
//! [`run`] is blocking: an [`InFlight`] guard counts submitted requests and,
//! on every exit path including unwinding out of the completion callback,
//! waits for all of them before the borrows behind the raw pointers end.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring};

use crate::io::slab::Slab;

/// Submission queue entries per ring. Larger batches are fed in as
/// completions free slots.
const RING_ENTRIES: u32 = 256;

/// Most transfers one thread keeps in flight: a disk's random small reads
/// peak at a moderate queue depth and get slower beyond it, and a gather runs
/// on (pool threads + 1) threads at once (bench-results/engine-notes.md).
/// `ZRING_QUEUE_DEPTH` overrides it.
fn max_in_flight() -> usize {
    static QD: OnceLock<usize> = OnceLock::new();
    *QD.get_or_init(|| crate::env::queue_depth().unwrap_or(256).clamp(1, RING_ENTRIES as usize))
}

/// Direction of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

/// One positional transfer of `len` bytes at `ptr` to or from `fd` at `offset`.
/// A read may stop early at end of file once `need` bytes have arrived (O_DIRECT
/// reads round their length up past the end of a file); short of `need`, the
/// file is shorter than the table says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Req {
    pub fd: RawFd,
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
    pub need: usize,
}

/// Why request `req` failed.
#[derive(Debug)]
pub(crate) struct ReqError {
    pub req: usize,
    pub kind: ReqErrorKind,
}

#[derive(Debug)]
pub(crate) enum ReqErrorKind {
    /// End of file after `got` of the `need` bytes.
    Eof { got: usize },
    /// The operating system refused the transfer.
    Os(io::Error),
}

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

/// Whether this process may use io_uring for zring's transfers; probed once
/// ([`probe`]).
pub(crate) fn uring_available() -> Result<(), io::Error> {
    static PROBE: OnceLock<Result<(), (io::ErrorKind, String)>> = OnceLock::new();
    PROBE.get_or_init(|| probe().map_err(|e| (e.kind(), e.to_string()))).clone().map_err(|(k, m)| io::Error::new(k, m))
}

/// Makes a ring, asks the kernel whether it runs the operations zring submits
/// (`IORING_OP_READ` and `IORING_OP_WRITE`, through `IORING_REGISTER_PROBE`,
/// both of Linux 5.6), and reads one byte through a pipe with it: a seccomp
/// filter may allow `io_uring_setup` and refuse `io_uring_enter`.
fn probe() -> io::Result<()> {
    use std::io::Write;
    let mut ring = new_ring(2)?;
    let mut supported = io_uring::Probe::new();
    ring.submitter().register_probe(&mut supported).map_err(|e| {
        io::Error::new(e.kind(), format!("the kernel does not say which io_uring operations it runs: {e}"))
    })?;
    for (code, name) in [(opcode::Read::CODE, "IORING_OP_READ"), (opcode::Write::CODE, "IORING_OP_WRITE")] {
        if !supported.is_supported(code) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("the kernel's io_uring lacks {name}")));
        }
    }
    let (r, mut w) = std::io::pipe()?;
    w.write_all(b"z")?;
    // Leaked on purpose (one byte, once per process): if the wait below
    // fails, the kernel may still own it.
    let byte: &'static mut [u8; 1] = Box::leak(Box::new([0u8; 1]));
    let read = opcode::Read::new(types::Fd(r.as_raw_fd()), byte.as_mut_ptr(), 1).build();
    // SAFETY: `byte` is valid for writes for the rest of the process, and
    // `r` is kept open until the completion has been seen (or forever, by the
    // kernel's own reference, if it never is).
    unsafe { ring.submission().push(&read) }.map_err(|_| io::Error::other("a fresh ring's queue is full"))?;
    enter(&mut ring, 1)?;
    let res = ring.completion().next().map(|c| c.result());
    match res {
        Some(1) if byte[0] == b'z' => Ok(()),
        Some(n) if n < 0 => Err(io::Error::from_raw_os_error(-n)),
        other => Err(io::Error::other(format!("an io_uring read of a pipe returned {other:?}"))),
    }
}

/// A new ring of `entries` (fault hook: [`crate::io::fault::Kind::RingSetup`]).
///
/// Where the kernel has them (Linux 6.1), the ring takes its completions as
/// deferred task work, run only when its thread waits for them
/// (`IORING_SETUP_DEFER_TASKRUN`, which needs `IORING_SETUP_SINGLE_ISSUER`:
/// each ring belongs to the one thread that made it, [`run`]), so a wait for
/// `n` completions sleeps until `n` have arrived instead of waking for each
/// one. Linux 5.19 gets `IORING_SETUP_COOP_TASKRUN` (completions wait for the
/// thread's next system call instead of interrupting it), older kernels a
/// plain ring. A ring with deferred completions says so through
/// `is_setup_single_issuer` ([`deferred`]).
fn new_ring(entries: u32) -> io::Result<IoUring> {
    crate::io::fault::hit(crate::io::fault::Kind::RingSetup)?;
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|_| IoUring::builder().setup_coop_taskrun().build(entries))
        .or_else(|_| IoUring::new(entries))
}

/// Whether `ring`'s completions reach its queue only when its thread enters
/// the kernel to wait for them ([`new_ring`]).
fn deferred(ring: &IoUring) -> bool {
    ring.params().is_setup_single_issuer()
}

/// `IORING_ENTER_GETEVENTS`.
const GETEVENTS: u32 = 1;

/// Submits what is queued and waits for `want` completions
/// (`io_uring_enter`; fault hook: [`crate::io::fault::Kind::Enter`]).
fn enter(ring: &mut IoUring, want: usize) -> io::Result<usize> {
    crate::io::fault::hit(crate::io::fault::Kind::Enter)?;
    ring.submit_and_wait(want)
}

thread_local! {
    // One ring per thread, tagged with the pid that made it: a forked child
    // inherits the parent's mapping of the ring, and must never submit to it.
    // `None` inside: this thread could not make a ring, and reads with pread.
    static RING: RefCell<Option<(u32, Option<IoUring>)>> = const { RefCell::new(None) };
    // The region registered with this thread's ring as its fixed buffer
    // ([`Region`]): its id (0: none) and whether the kernel took it.
    static REGISTERED: std::cell::Cell<(u64, bool)> = const { std::cell::Cell::new((0, false)) };
}

/// One live allocation that reads may land in, registered with the thread's
/// ring as a fixed buffer (`IORING_REGISTER_BUFFERS`), so its reads
/// (`IORING_OP_READ_FIXED`) skip pinning their pages one request at a time.
/// `id` names the allocation: a new one, even at the same address, has a new
/// id and is registered again before any read lands in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    pub id: u64,
    pub base: *const u8,
    pub len: usize,
}

/// The largest region registered: registration pins its pages for as long
/// as the ring keeps it.
const MAX_REGISTERED: usize = 64 << 20;

impl Region {
    fn holds(&self, ptr: *const u8, len: usize) -> bool {
        let (a, b) = (self.base as usize, ptr as usize);
        b >= a && b + len <= a + self.len
    }
}

/// Whether `region` is registered with `ring` now, registering it (in place
/// of the one before) if not; `false` when the kernel refuses (a
/// locked-memory limit, say), which is not asked again for the same region.
/// Nothing may be in flight on `ring`.
///
/// # Safety
/// `region` must be one live allocation, valid for writes, that stays
/// allocated for as long as reads are submitted into it.
unsafe fn register(ring: &IoUring, region: &Region) -> bool {
    let (id, ok) = REGISTERED.with(std::cell::Cell::get);
    if id == region.id {
        return ok;
    }
    if ok {
        let _ = ring.submitter().unregister_buffers();
    }
    let ok = region.len <= MAX_REGISTERED && {
        let iov = libc::iovec { iov_base: region.base.cast_mut().cast(), iov_len: region.len };
        // SAFETY: the caller guarantees the region is one live allocation;
        // the kernel pins its pages, which stay the allocation's while it
        // lives (a fork copies pinned pages for the child), and only reads
        // into this allocation, named by its id, use them.
        unsafe { ring.submitter().register_buffers(&[iov]) }.is_ok()
    };
    REGISTERED.with(|c| c.set((region.id, ok)));
    ok
}

/// Unregisters region `id` from this thread's ring if it is the one
/// registered there: the kernel pins a registered region's pages, which
/// would stay allocated after the region is freed. Called as a buffer is
/// dropped, between batches (a ring taken out for a batch is left alone).
fn unregister(id: u64) {
    let _ = REGISTERED.try_with(|c| {
        if id == 0 || c.get() != (id, true) {
            return;
        }
        let _ = RING.try_with(|cell| {
            if let Ok(Some((pid, Some(ring)))) = cell.try_borrow().as_deref() {
                if *pid == std::process::id() && ring.submitter().unregister_buffers().is_ok() {
                    c.set((0, false));
                }
            }
        });
    });
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

/// Gives a request with a null pointer its buffer at its first submission
/// ([`run`]).
type Prepare<'p> = &'p mut dyn FnMut(usize) -> *mut u8;

/// For batches whose every request has its buffer.
fn no_prepare(i: usize) -> *mut u8 {
    unreachable!("request {i} was given a buffer")
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

/// The reference backend: one blocking system call per transfer.
///
/// # Safety
/// As for [`run`].
unsafe fn run_sync(
    op: Op,
    reqs: &mut [Req],
    prepare: Prepare<'_>,
    on_done: &mut dyn FnMut(usize),
) -> Result<(), ReqError> {
    for (i, r) in reqs.iter_mut().enumerate() {
        if r.ptr.is_null() {
            r.ptr = prepare(i);
        }
        let mut done = 0usize;
        while done < r.len {
            // SAFETY: `ptr + done .. ptr + len` lies inside the request's range,
            // which the caller guarantees valid and unaliased during this call.
            let n = unsafe {
                let p = r.ptr.add(done);
                let off = (r.offset + done as u64) as libc::off_t;
                match op {
                    Op::Read => libc::pread(r.fd, p.cast(), r.len - done, off),
                    Op::Write => libc::pwrite(r.fd, p.cast_const().cast(), r.len - done, off),
                }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
                    continue;
                }
                return Err(ReqError { req: i, kind: ReqErrorKind::Os(e) });
            }
            if n == 0 {
                if done >= r.need {
                    break;
                }
                return Err(ReqError { req: i, kind: ReqErrorKind::Eof { got: done } });
            }
            done += n as usize;
        }
        on_done(i);
    }
    Ok(())
}

/// Counts requests the kernel still owns; dropping it waits for all of them,
/// so no buffer borrow can end while the kernel may still write to it.
///
/// Waiting never depends on `io_uring_enter` working: when an enter fails
/// (other than EINTR), the ring is marked failed, no more is submitted, and
/// [`InFlight::settle`] watches the completion queue in shared memory,
/// sleeping between looks (completions arrive there without an enter; task
/// work runs on the sleep's return to user space). Entries the kernel never
/// took from the submission queue are abandoned with the ring.
struct InFlight<'r> {
    ring: &'r mut IoUring,
    /// Requests pushed and not yet completed (some maybe never submitted).
    count: usize,
    /// An enter failed: the ring must not be used again.
    failed: bool,
}

impl InFlight<'_> {
    /// Submits what is queued and waits for `want` completions (at most the
    /// requests in flight).
    fn wait(&mut self, want: usize) -> io::Result<()> {
        loop {
            match enter(self.ring, want.clamp(1, self.count.max(1))) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            }
        }
    }

    /// Returns once the kernel owns none of the requests.
    fn settle(&mut self) {
        let mut looks = 0u64;
        while self.count > 0 {
            if !self.failed {
                let _ = self.wait(1);
            } else {
                if self.ring.submission().len() >= self.count {
                    // Everything left never reached the kernel.
                    return;
                }
                looks += 1;
                std::thread::sleep(std::time::Duration::from_millis(looks.min(10)));
                if deferred(self.ring) {
                    // Completions held as deferred task work reach the queue
                    // only through an enter asking for them: one that submits
                    // nothing and does not wait.
                    // SAFETY: nothing is submitted (`to_submit` 0) and no
                    // argument is passed; the call only posts completions of
                    // requests already in the kernel's hands.
                    let _ = unsafe { self.ring.submitter().enter::<libc::sigset_t>(0, 0, GETEVENTS, None) };
                }
            }
            let n = self.ring.completion().count();
            self.count -= n.min(self.count);
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

/// # Safety
/// As for [`run`].
#[allow(clippy::too_many_arguments, reason = "run's arguments and the ring's health, passed down once")]
unsafe fn run_uring(
    ring: &mut IoUring,
    op: Op,
    reqs: &mut [Req],
    limit: usize,
    region: Option<Region>,
    prepare: Prepare<'_>,
    on_done: &mut dyn FnMut(usize),
    idle: &mut dyn FnMut(),
    healthy: &mut bool,
) -> Result<(), ReqError> {
    let mut idle = Some(idle);
    let mut done = vec![0usize; reqs.len()];
    let mut next = 0usize; // next request never submitted
    let mut retry: Vec<usize> = Vec::new(); // requests to resubmit (short transfer, EINTR, EAGAIN)
    let mut failure: Option<ReqError> = None;
    let mut finished = vec![false; reqs.len()]; // on_done called
    let mut ring_failed = false;
    let mut flight = InFlight { ring, count: 0, failed: false };

    loop {
        // Fill the submission queue.
        {
            let mut sq = flight.ring.submission();
            while !sq.is_full() && flight.count < max_in_flight().min(limit.max(1)) && failure.is_none() {
                let i = if let Some(i) = retry.pop() {
                    i
                } else if next < reqs.len() {
                    next += 1;
                    next - 1
                } else {
                    break;
                };
                if reqs[i].ptr.is_null() {
                    reqs[i].ptr = prepare(i);
                }
                let r = &reqs[i];
                let d = done[i];
                // SAFETY: `d < r.len`, so the pointer stays inside the request's range.
                let p = unsafe { r.ptr.add(d) };
                let len = u32::try_from(r.len - d).unwrap_or(!4095);
                let entry = match op {
                    Op::Read if region.is_some_and(|g| g.holds(p, len as usize)) => {
                        opcode::ReadFixed::new(types::Fd(r.fd), p, len, 0).offset(r.offset + d as u64).build()
                    }
                    Op::Read => opcode::Read::new(types::Fd(r.fd), p, len).offset(r.offset + d as u64).build(),
                    Op::Write => {
                        opcode::Write::new(types::Fd(r.fd), p.cast_const(), len).offset(r.offset + d as u64).build()
                    }
                }
                .user_data(i as u64);
                // SAFETY: the entry's buffer is valid until its completion (the
                // caller's contract), and `flight` waits for every completion
                // before this function returns or unwinds.
                unsafe { sq.push(&entry).expect("queue checked not full") };
                flight.count += 1;
            }
        }
        if flight.count == 0 {
            break;
        }
        if let Some(idle) = idle.take() {
            // Hand the first requests to the kernel, then do the caller's
            // other work while they run. A failed submit is retried by the
            // wait below.
            let _ = enter(flight.ring, 0);
            idle();
        }
        // While requests wait to be submitted, a wait ends once a quarter of
        // those in flight have completed, so the queue stays at least three
        // quarters full; once all are submitted, once all have completed (the
        // thread has nothing else to do meanwhile: a batch's other threads,
        // and a loader's other workers, keep the cores busy). Either way one
        // enter per many completions, not one each.
        let more = next < reqs.len() || !retry.is_empty();
        let want = if more { flight.count / 4 } else { flight.count };
        if flight.wait(want).is_err() {
            // The ring failed (EAGAIN, ENOMEM or EBUSY when memory is tight,
            // say), not a file: stop using it; settle() waits for what the
            // kernel holds without entering it again, and the requests not
            // finished are then read with pread below.
            ring_failed = true;
            break;
        }
        let completed: Vec<(usize, i32)> =
            flight.ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        // Counted off before any callback runs: if one panics, the unwinding
        // must not wait for completions already taken from the queue.
        flight.count -= completed.len();
        for (i, res) in completed {
            let r = &reqs[i];
            if res < 0 {
                if res == -libc::EINTR || res == -libc::EAGAIN {
                    retry.push(i);
                } else {
                    failure
                        .get_or_insert(ReqError { req: i, kind: ReqErrorKind::Os(io::Error::from_raw_os_error(-res)) });
                }
                continue;
            }
            if res == 0 && done[i] < r.len {
                if done[i] < r.need {
                    failure.get_or_insert(ReqError { req: i, kind: ReqErrorKind::Eof { got: done[i] } });
                    continue;
                }
            } else {
                done[i] += res as usize;
                if done[i] < r.len {
                    retry.push(i);
                    continue;
                }
            }
            if failure.is_none() {
                finished[i] = true;
                on_done(i);
            }
        }
        if failure.is_some() {
            retry.clear();
        }
    }
    flight.settle();
    *healthy = !flight.failed;
    if let Some(idle) = idle.take() {
        idle();
    }
    if let Some(f) = failure {
        return Err(f);
    }
    if ring_failed {
        // The kernel owns none of the buffers now. What each unfinished
        // request still needs is read (or written) again from where its
        // completed part ends: positional transfers are idempotent, so bytes
        // an in-flight request may have delivered are simply read again.
        let rest: Vec<usize> = (0..reqs.len()).filter(|&i| !finished[i]).collect();
        let mut tail: Vec<Req> = rest
            .iter()
            .map(|&i| {
                let r = &reqs[i];
                // SAFETY: `done[i] <= r.len`, so the pointer stays inside the
                // request's range; a request never submitted keeps its null
                // pointer (and `done[i] == 0`), for `prepare` to fill.
                let ptr = if r.ptr.is_null() { r.ptr } else { unsafe { r.ptr.add(done[i]) } };
                Req {
                    fd: r.fd,
                    offset: r.offset + done[i] as u64,
                    ptr,
                    len: r.len - done[i],
                    need: r.need.saturating_sub(done[i]),
                }
            })
            .collect();
        // SAFETY: each tail range lies inside its request's range, which the
        // caller's contract keeps valid and unaliased for this call; no
        // callback has run for these requests yet.
        return unsafe { run_sync(op, &mut tail, &mut |k| prepare(rest[k]), &mut |k| on_done(rest[k])) }.map_err(|e| {
            match e.kind {
                ReqErrorKind::Eof { got } => {
                    ReqError { req: rest[e.req], kind: ReqErrorKind::Eof { got: got + done[rest[e.req]] } }
                }
                kind => ReqError { req: rest[e.req], kind },
            }
        });
    }
    Ok(())
}

/// A buffer starting at an `ALIGN` boundary, as O_DIRECT transfers require:
/// an anonymous mapping of its own, unmapped when the buffer is dropped or
/// grows (a heap buffer of a few MiB, once freed, stayed in the allocator's
/// arenas; [`crate::io::slab::keep_scratch`]).
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
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn the_probe_runs_a_read_and_agrees_with_ring_creation() {
        // Where a ring can be made on this kernel, the opcodes zring uses are
        // there and a read runs through it; where not, the probe says so.
        let ring = IoUring::new(2);
        assert_eq!(probe().is_ok(), ring.is_ok(), "probe {:?}, ring {:?}", probe(), ring.err());
        assert_eq!(uring_available().is_ok(), ring.is_ok());
    }

    fn backends() -> Vec<BackendKind> {
        let mut v = vec![BackendKind::Pread];
        match uring_available() {
            Ok(()) => v.push(BackendKind::Uring),
            Err(e) if crate::env::require_uring() => {
                panic!("io_uring required: {e}")
            }
            Err(e) => eprintln!("skipping io_uring: {e}"),
        }
        v
    }

    #[test]
    fn slab_reads_take_their_slabs_at_submission_and_arrive_whole() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        for b in backends() {
            // More reads than the limit lets fly at once; the last one ends
            // past the end of the file, after all it needs.
            let reads: Vec<SlabRead<'_>> = (0..40)
                .map(|k| {
                    let offset = k as u64 * 50_000;
                    let len = if k == 39 { 60_000 } else { 50_000 };
                    SlabRead { fd: f.as_fd(), offset, len, need: 50_000 }
                })
                .collect();
            let mut got = vec![false; reads.len()];
            read_slabs(b, &reads, 3, &mut |_, len| Slab::take_aligned(len), &mut |i, slab| {
                let at = i * 50_000;
                assert_eq!(&slab.as_ref()[..50_000], &data[at..at + 50_000], "read {i} on {b:?}");
                got[i] = true;
            })
            .unwrap();
            assert!(got.iter().all(|&g| g), "every read completed on {b:?}");
            let short = [SlabRead { fd: f.as_fd(), offset: 1_990_000, len: 20_000, need: 20_000 }];
            let err = read_slabs(b, &short, 1, &mut |_, len| Slab::take_aligned(len), &mut |_, _| {
                panic!("a short read is no completion")
            })
            .unwrap_err();
            assert!(matches!(err.kind, ReqErrorKind::Eof { got: 10_000 }), "{err:?} on {b:?}");
        }
    }

    #[test]
    fn reads_many_ranges_and_reports_eof() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        for b in backends() {
            // More requests than the ring holds, to exercise refill.
            let mut out = vec![0u8; 600 * 100];
            let reqs: Vec<Req> = (0..600)
                .map(|k| Req {
                    fd: f.as_raw_fd(),
                    offset: (k * 157) as u64,
                    // SAFETY: each request gets its own 100-byte slice of `out`.
                    ptr: unsafe { out.as_mut_ptr().add(k * 100) },
                    len: 100,
                    need: 100,
                })
                .collect();
            let mut seen = vec![false; reqs.len()];
            let mut idled = 0;
            // SAFETY: ranges are disjoint parts of `out`, untouched until the call returns.
            unsafe {
                run(b, Op::Read, &mut reqs.clone(), usize::MAX, &mut no_prepare, &mut |i| seen[i] = true, &mut || {
                    idled += 1
                })
            }
            .unwrap();
            assert!(seen.iter().all(|s| *s), "{b:?}: a completion was not reported");
            assert_eq!(idled, 1, "{b:?}: the idle work runs exactly once");
            // SAFETY: no requests.
            unsafe { run(b, Op::Read, &mut [], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || idled += 1) }.unwrap();
            assert_eq!(idled, 2, "{b:?}: an empty batch still runs the idle work");
            for k in 0..600 {
                assert_eq!(&out[k * 100..k * 100 + 100], &data[k * 157..k * 157 + 100], "{b:?} req {k}");
            }
            let mut tail = vec![0u8; 200];
            let past = Req { fd: f.as_raw_fd(), offset: 99_950, ptr: tail.as_mut_ptr(), len: 200, need: 200 };
            // SAFETY: one request into `tail`.
            let err = unsafe { run(b, Op::Read, &mut [past], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }
                .unwrap_err();
            assert!(matches!(err.kind, ReqErrorKind::Eof { got: 50 }), "{b:?}: {err:?}");
            let ok = Req { need: 50, ..past };
            // SAFETY: as above.
            unsafe { run(b, Op::Read, &mut [ok], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }.unwrap();
            assert_eq!(&tail[..50], &data[99_950..]);
        }
    }

    #[test]
    fn writes_land_and_bad_fds_fail() {
        for b in backends() {
            let f = tempfile::tempfile().unwrap();
            let mut src: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
            let reqs: Vec<Req> = (0..4)
                .map(|k| Req {
                    fd: f.as_raw_fd(),
                    offset: (k * 1024) as u64,
                    // SAFETY: disjoint 1 KiB parts of `src`.
                    ptr: unsafe { src.as_mut_ptr().add(k * 1024) },
                    len: 1024,
                    need: 1024,
                })
                .collect();
            // SAFETY: disjoint ranges of `src`, alive for the call.
            unsafe { run(b, Op::Write, &mut reqs.clone(), usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }
                .unwrap();
            let mut back = vec![0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
            assert_eq!(back, src);
            let bad = Req { fd: -1, ..reqs[0] };
            // SAFETY: as above.
            let err = unsafe { run(b, Op::Write, &mut [bad], usize::MAX, &mut no_prepare, &mut |_| {}, &mut || {}) }
                .unwrap_err();
            assert!(matches!(err.kind, ReqErrorKind::Os(_)), "{b:?}: {err:?}");
        }
    }

    #[test]
    fn reads_into_a_registered_region_land_there_even_after_it_grows() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 241) as u8).collect();
        f.write_all(&data).unwrap();
        for b in backends() {
            let mut scratch = AlignedBuf::new();
            let mut ids = Vec::new();
            // The buffer grows twice (a new allocation each time, maybe at
            // the same address): each is registered before reads land in it.
            for (round, n) in [(0, 10), (1, 10), (2, 60), (3, 200)] {
                let (buf, region) = scratch.get_in(n * 4096);
                ids.push(region.id);
                let reads: Vec<ReadBuf<'_>> = buf
                    .chunks_mut(4096)
                    .enumerate()
                    .map(|(k, piece)| {
                        let offset = ((k * 7 + round) % 240) as u64 * 4096;
                        ReadBuf { fd: f.as_fd(), offset, buf: piece, need: 4096 }
                    })
                    .collect();
                let mut seen = 0;
                read_batch(
                    b,
                    reads,
                    Some(region),
                    &mut |k, got| {
                        let at = ((k * 7 + round) % 240) * 4096;
                        assert_eq!(got, &data[at..at + 4096], "{b:?} round {round} read {k}");
                        seen += 1;
                    },
                    &mut || {},
                )
                .unwrap();
                assert_eq!(seen, n);
            }
            assert_eq!(ids[0], ids[1], "a buffer that did not grow keeps its id");
            assert!(ids[1] != ids[2] && ids[2] != ids[3], "a new allocation gets a new id: {ids:?}");
            if b == BackendKind::Uring {
                // Registered (or refused, under a small locked-memory limit)
                // as the ring's buffer: the last allocation, not a stale one.
                assert_eq!(REGISTERED.with(std::cell::Cell::get).0, ids[3]);
            }
        }
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        let mut a = AlignedBuf::new();
        for len in [1, 4096, 10_000] {
            let (s, _) = a.get_in(len);
            assert_eq!(s.as_ptr() as usize % ALIGN, 0);
            assert_eq!(s.len(), len);
        }
    }
}
