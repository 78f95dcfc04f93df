//! The SIGBUS guard: a file that shrinks under one of the store's read-only
//! mappings must give a typed error, not kill the process.
//!
//! Touching a mapped page that no longer has file bytes behind it (another
//! program truncated the file, a network file system dropped it, the disk
//! failed to read the page back) raises SIGBUS, whose default action ends the
//! process. Every mapping the engine reads from is registered here ([`Guard`])
//! before its first access and unregistered before it is unmapped. One
//! process-wide handler, installed on first use and chained to the handler
//! that was there before, looks the faulting address up in the registry. If a
//! registered mapping holds it, the handler marks that mapping faulted, maps
//! anonymous zero pages over all of it and returns: the interrupted copy
//! resumes and reads zeros. Whoever read from the mapping checks
//! [`Guard::faulted`] afterwards and discards what it read; a faulted mapping
//! is never read again, so later reads go through the file, which reports a
//! short file as an ordinary error. Faults anywhere else, and SIGBUS sent by
//! `kill`, go to the previous handler as if this one did not exist.
//!
//! The handler takes no lock and allocates nothing: the registry is a fixed
//! array of atomic slots, each read under a sequence number so a slot being
//! reused is never seen half-written, and the handler's only calls are the
//! system calls `mmap`, `sigaction` and `raise`.
//!
//! [`available`] is false when the handler cannot be installed or another
//! handler has since replaced it; then nothing may be mapped, and readers use
//! the file.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Mappings that can be guarded at once: a store holds one per chunk file it
/// has read hot records from, plus its table. A mapping that finds every slot
/// taken is not made (its file is read instead).
const SLOTS: usize = 16384;

/// Slot states, in the two low bits of [`Slot::state`]; the bits above count
/// registrations, so a reader notices a slot that was freed and reused while
/// it read it.
const FREE: u64 = 0;
const WRITING: u64 = 1;
const LIVE: u64 = 2;
const TAG: u64 = 3;
const GENERATION: u64 = 4;

struct Slot {
    state: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU64::new(FREE),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }

    /// `(start, len)` if the slot is live, read consistently (a seqlock read).
    fn live_range(&self) -> Option<(usize, usize)> {
        loop {
            let s1 = self.state.load(Ordering::Acquire);
            if s1 & TAG != LIVE {
                return None;
            }
            let start = self.start.load(Ordering::Relaxed);
            let len = self.len.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.state.load(Ordering::Relaxed) == s1 {
                return Some((start, len));
            }
        }
    }
}

static REGISTRY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// One past the highest slot ever used: the handler scans no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// The page size, read before the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS disposition found when the handler was installed.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_FLAGS: AtomicI32 = AtomicI32::new(0);

/// A registered mapping. Dropping it unregisters the mapping, which must
/// happen before the mapping is unmapped.
pub(crate) struct Guard {
    slot: &'static Slot,
}

impl Guard {
    /// Starts loading the fault flag [`Guard::faulted`] reads into the CPU
    /// cache.
    #[inline]
    pub fn prefetch(&self) {
        crate::io::prefetch::prefetch_line(self.slot);
    }

    /// Whether an access to the mapping has faulted since it was registered.
    /// Call it after reading from the mapping: when true, what was read may be
    /// zeros in place of the file's bytes.
    #[inline]
    pub fn faulted(&self) -> bool {
        self.flag().faulted()
    }

    /// The fault flag, to be read without the guard at hand
    /// ([`crate::io::mapset`]: one array of many mappings' state). It
    /// stands for this mapping only while the guard lives: once it is
    /// dropped the slot may be reused by another mapping.
    #[inline]
    pub fn flag(&self) -> Flag {
        Flag(&self.slot.faulted)
    }
}

/// A registered mapping's fault flag ([`Guard::flag`]).
#[derive(Clone, Copy)]
pub(crate) struct Flag(&'static AtomicBool);

impl Flag {
    /// [`Guard::faulted`].
    #[inline]
    pub fn faulted(self) -> bool {
        // The acquire fence keeps this load after the reads of the mapping
        // that precede it (a load-load barrier; free on x86). A fault on this
        // thread set the flag in the handler, before those reads resumed; a
        // fault on another thread set it before that thread's handler mapped
        // the zeros these reads may have seen.
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed)
    }

    /// Starts loading the flag into the CPU cache.
    #[inline]
    pub fn prefetch(self) {
        crate::io::prefetch::prefetch_line(self.0);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = self.slot.state.load(Ordering::Relaxed);
        self.slot.state.store((s & !TAG) | FREE, Ordering::Release);
    }
}

/// Registers `len` bytes at `start` with the guard. `None` when the guard is
/// unavailable ([`available`]) or every slot is taken: then the mapping must
/// not be read (unmap it and read the file).
///
/// # Safety
/// `start..start + len` must be one read-only shared file mapping made with
/// `mmap` (page-aligned `start`), owned by the caller, that stays mapped until
/// the returned guard is dropped. On a fault inside it, the handler replaces
/// the whole range (rounded up to pages) with anonymous zero pages.
pub(crate) unsafe fn register(start: *const u8, len: usize) -> Option<Guard> {
    if !available() || len == 0 {
        return None;
    }
    for (i, slot) in REGISTRY.iter().enumerate() {
        let s = slot.state.load(Ordering::Relaxed);
        if s & TAG != FREE {
            continue;
        }
        let claimed = (s & !TAG) + GENERATION;
        if slot.state.compare_exchange(s, claimed | WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
            continue;
        }
        // Seqlock write: the WRITING state is ordered before the new range,
        // the range before the LIVE state.
        fence(Ordering::Release);
        slot.start.store(start as usize, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.faulted.store(false, Ordering::Relaxed);
        HIGH.fetch_max(i + 1, Ordering::Release);
        slot.state.store(claimed | LIVE, Ordering::Release);
        return Some(Guard { slot });
    }
    None
}

/// Whether mappings can be guarded: the handler is installed and is still the
/// process's SIGBUS handler (a handler installed later by other code would
/// see zring's faults first, and most end the process). Installs the handler
/// on the first call.
pub(crate) fn available() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(install) && current_handler() == Some(handler_address())
}

fn handler_address() -> usize {
    on_sigbus as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

fn current_handler() -> Option<usize> {
    // SAFETY: all-zero bytes are a valid `sigaction` (plain integers and an
    // empty mask); a null new action only queries.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `cur` is a valid, writable sigaction; the new action is null.
    (unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), &mut cur) } == 0).then_some(cur.sa_sigaction)
}

fn install() -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        PAGE.store(page as usize, Ordering::Relaxed);
    }
    // SAFETY: as in `current_handler`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as in `current_handler`.
    if unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), &mut old) } != 0 {
        return false;
    }
    // Recorded before the handler can run.
    PREV_HANDLER.store(old.sa_sigaction, Ordering::Relaxed);
    PREV_FLAGS.store(old.sa_flags, Ordering::Relaxed);
    // SAFETY: as in `current_handler`.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = handler_address();
    // No SA_NODEFER: the handler never faults itself, and a previous handler
    // it calls that raises SIGBUS again (to die with it) has that signal held
    // until the handler returns, when the disposition it restored applies.
    // SA_ONSTACK: a fault on a thread close to its stack's end still runs the
    // handler (on the alternate stack where the thread has one).
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `new.sa_mask` is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: `new` names `on_sigbus`, an `extern "C"` function with the
    // SA_SIGINFO signature that stays loaded for the process's life; `old` is
    // writable.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } != 0 {
        return false;
    }
    // Another thread may have changed the disposition between the query and
    // the install; chain to what was actually replaced.
    PREV_HANDLER.store(old.sa_sigaction, Ordering::Relaxed);
    PREV_FLAGS.store(old.sa_flags, Ordering::Relaxed);
    true
}

/// The registered mapping holding `addr`, with its range.
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    let high = HIGH.load(Ordering::Acquire).min(SLOTS);
    REGISTRY[..high].iter().find_map(|slot| {
        let (start, len) = slot.live_range()?;
        (addr.wrapping_sub(start) < len).then_some((slot, start, len))
    })
}

extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is this thread's; the handler restores it so the
    // interrupted code never sees the handler's system calls.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: for an SA_SIGINFO handler the kernel passes a valid siginfo.
    let handled = unsafe { info.as_ref() }.is_some_and(zero_faulted_mapping);
    if !handled {
        // SAFETY: `sig`, `info` and `ctx` are this delivery's, passed on
        // unchanged.
        unsafe { chain(sig, info, ctx) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// If `info` is a fault inside a registered mapping: marks it faulted and
/// maps zero pages over it, so the faulting access can resume. False for
/// anything else, or if the zero pages could not be mapped.
fn zero_faulted_mapping(info: &libc::siginfo_t) -> bool {
    // Faults carry a positive si_code; kill/tgkill/sigqueue carry zero or a
    // negative one and no address.
    if !matches!(info.si_code, libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR) {
        return false;
    }
    // SAFETY: for these si_codes the kernel filled in si_addr.
    let addr = unsafe { info.si_addr() } as usize;
    let Some((slot, start, len)) = find(addr) else { return false };
    // Set before the zero pages exist, so a thread that reads those zeros
    // without faulting still finds the flag set when it checks afterwards.
    slot.faulted.store(true, Ordering::SeqCst);
    let page = PAGE.load(Ordering::Relaxed);
    let span = len.div_ceil(page) * page;
    // SAFETY: `start..start + span` is a live mapping that zring owns:
    // `register`'s contract keeps it mapped while its slot is live, and the
    // faulting access (inside it, by a reader that holds a borrow of it) keeps
    // its owner from dropping it. Replacing it with private zero pages of the
    // same protection changes only what its readers see, which they discard
    // once they find the flag set.
    let p = unsafe {
        libc::mmap(
            start as *mut c_void,
            span,
            libc::PROT_READ,
            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Hands a SIGBUS that is not ours to the disposition found at install.
///
/// # Safety
/// Only from `on_sigbus`, with its arguments.
unsafe fn chain(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREV_HANDLER.load(Ordering::Relaxed);
    // SAFETY: `info` is the kernel's (see `on_sigbus`).
    let fault = unsafe { info.as_ref() }.is_none_or(|i| i.si_code > 0);
    if prev == libc::SIG_IGN && !fault {
        return;
    }
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // The default action (a fault cannot be ignored): reinstate it and
        // return. A fault re-executes the faulting access and ends the process
        // with SIGBUS, as without this handler; a sent signal is raised again,
        // held until this handler returns.
        // SAFETY: as in `current_handler`.
        let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: `dfl` is a valid sigaction; sigaction and raise are
        // async-signal-safe.
        unsafe {
            libc::sigaction(sig, &dfl, ptr::null_mut());
            if !fault {
                libc::raise(sig);
            }
        }
        return;
    }
    if PREV_FLAGS.load(Ordering::Relaxed) & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous disposition is a handler installed with
        // SA_SIGINFO, so this is its address with that signature.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous disposition is a plain handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_ranges_found() {
        assert!(available(), "the SIGBUS handler could not be installed");
        let page = PAGE.load(Ordering::Relaxed);
        // Fake ranges are fine here: nothing faults in them.
        let a = 0x7000_0000_0000usize;
        // SAFETY: no access is made to these ranges, so the handler never acts on them.
        let ga = unsafe { register(a as *const u8, 3 * page) }.unwrap();
        // SAFETY: as above.
        let gb = unsafe { register((a + 8 * page) as *const u8, page) }.unwrap();
        assert!(find(a + 2 * page + 5).is_some_and(|(s, _, _)| ptr::eq(s, ga.slot)));
        assert!(find(a + 8 * page).is_some_and(|(s, _, _)| ptr::eq(s, gb.slot)));
        assert!(find(a + 3 * page).is_none());
        drop(ga);
        assert!(find(a).is_none());
        assert!(!gb.faulted());
        // SAFETY: as above.
        let gc = unsafe { register((a + 16 * page) as *const u8, page) }.unwrap();
        assert!(find(a + 16 * page).is_some());
        drop((gb, gc));
    }
}
