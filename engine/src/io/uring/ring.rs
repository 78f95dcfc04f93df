//! The io_uring backend: a ring per thread (probed once per process, made
//! again after a fork), the buffers registered with it, and a batch run on
//! it with every request the kernel owns waited for on every exit path.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring};

use super::req::{Op, Prepare, Req, ReqError, ReqErrorKind};
use super::sync::run_sync;

/// Submission queue entries per ring. Larger batches are fed in as
/// completions free slots.
pub(super) const RING_ENTRIES: u32 = 256;

/// Most transfers one thread keeps in flight: a disk's random small reads
/// peak at a moderate queue depth and get slower beyond it, and a gather runs
/// on (pool threads + 1) threads at once (bench-results/engine-notes.md).
/// `ZRING_QUEUE_DEPTH` overrides it.
pub(super) fn max_in_flight() -> usize {
    static QD: OnceLock<usize> = OnceLock::new();
    *QD.get_or_init(|| crate::env::queue_depth().unwrap_or(256).clamp(1, RING_ENTRIES as usize))
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
pub(super) fn probe() -> io::Result<()> {
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
/// each ring belongs to the one thread that made it, [`run`](super::run)), so a wait for
/// `n` completions sleeps until `n` have arrived instead of waking for each
/// one. Linux 5.19 gets `IORING_SETUP_COOP_TASKRUN` (completions wait for the
/// thread's next system call instead of interrupting it), older kernels a
/// plain ring. A ring with deferred completions says so through
/// `is_setup_single_issuer` ([`deferred`]).
pub(super) fn new_ring(entries: u32) -> io::Result<IoUring> {
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
pub(super) fn deferred(ring: &IoUring) -> bool {
    ring.params().is_setup_single_issuer()
}

/// `IORING_ENTER_GETEVENTS`.
pub(super) const GETEVENTS: u32 = 1;

/// Submits what is queued and waits for `want` completions
/// (`io_uring_enter`; fault hook: [`crate::io::fault::Kind::Enter`]).
pub(super) fn enter(ring: &mut IoUring, want: usize) -> io::Result<usize> {
    crate::io::fault::hit(crate::io::fault::Kind::Enter)?;
    ring.submit_and_wait(want)
}

thread_local! {
    // One ring per thread, tagged with the pid that made it: a forked child
    // inherits the parent's mapping of the ring, and must never submit to it.
    // `None` inside: this thread could not make a ring, and reads with pread.
    pub(super) static RING: RefCell<Option<(u32, Option<IoUring>)>> = const { RefCell::new(None) };
    // The region registered with this thread's ring as its fixed buffer
    // ([`Region`]): its id (0: none) and whether the kernel took it.
    pub(super) static REGISTERED: std::cell::Cell<(u64, bool)> = const { std::cell::Cell::new((0, false)) };
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
pub(super) const MAX_REGISTERED: usize = 64 << 20;

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
pub(super) unsafe fn register(ring: &IoUring, region: &Region) -> bool {
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
pub(super) fn unregister(id: u64) {
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
/// As for [`run`](super::run).
#[allow(clippy::too_many_arguments, reason = "run's arguments and the ring's health, passed down once")]
pub(super) unsafe fn run_uring(
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
