//! Process-wide values that belong to the process that made them
//! ([`PerProcess`]), and the list of them that `fork()`'s prepare step locks
//! ([`hold_all`]); the process's exit handlers ([`at_exit`]) and heap
//! ([`trim_heap`]).

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The locks of every [`PerProcess`] value, taken by [`hold_all`] and
/// released (in reverse order of taking) when dropped.
pub(crate) struct Held {
    values: Vec<Box<dyn Any>>,
    /// The list of them, so none registers half way through a fork.
    _registry: MutexGuard<'static, Vec<&'static dyn Hold>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        while self.values.pop().is_some() {}
    }
}

/// Locks every [`PerProcess`] value made so far, in order of rank: the
/// prepare step of `fork()` ([`crate::fork`]).
pub(crate) fn hold_all() -> Held {
    let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let mut values: Vec<&'static dyn Hold> = registry.clone();
    values.sort_by_key(|v| v.rank());
    Held { values: values.into_iter().map(|v| v.hold()).collect(), _registry: registry }
}

/// Every [`PerProcess`] value used so far, which the prepare step locks.
static REGISTRY: Mutex<Vec<&'static dyn Hold>> = Mutex::new(Vec::new());

/// A lock the prepare step takes ([`PerProcess`]).
trait Hold: Sync {
    /// Locks it; the guard unlocks when dropped.
    fn hold(&'static self) -> Box<dyn Any>;
    /// The order of taking: lower first.
    fn rank(&self) -> u8;
}

/// A process-wide value that belongs to the process that made it: tagged
/// with its pid, so a forked child, which inherits a copy whose threads or
/// locks it does not have, makes its own on first use. Its lock is held
/// across `fork()` ([`crate::fork`]), found without a list kept by hand: the
/// value registers itself with the gate on first use.
pub(crate) struct PerProcess<T> {
    slot: RwLock<Option<(u32, T)>>,
    /// Set, under the registry's lock, once the value is in the registry
    /// (not a `Once`: a child forked while one ran would find it running
    /// forever).
    registered: AtomicBool,
    /// The order in which the prepare step locks the values, lower first.
    rank: u8,
    /// Whether a child drops its parent's copy (`true`: a copy of
    /// descriptors, say, is the child's own to close) or leaks it (`false`:
    /// dropping would touch threads or locks of the parent's).
    drop_inherited: bool,
}

/// A [`PerProcess`] value, read-locked.
pub(crate) struct Read<T: 'static>(RwLockReadGuard<'static, Option<(u32, T)>>);

impl<T> std::ops::Deref for Read<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.as_ref().expect("checked when read").1
    }
}

/// A [`PerProcess`] value, write-locked.
pub(crate) struct Write<T: 'static>(RwLockWriteGuard<'static, Option<(u32, T)>>);

impl<T> std::ops::Deref for Write<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.as_ref().expect("made when locked").1
    }
}

impl<T> std::ops::DerefMut for Write<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.as_mut().expect("made when locked").1
    }
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// An empty slot, locked at `rank` across a fork ([`PerProcess`]).
    pub const fn new(rank: u8, drop_inherited: bool) -> Self {
        PerProcess { slot: RwLock::new(None), registered: AtomicBool::new(false), rank, drop_inherited }
    }

    fn register(&'static self) {
        if self.registered.load(Ordering::Acquire) {
            return;
        }
        let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        if !self.registered.load(Ordering::Relaxed) {
            registry.push(self);
            self.registered.store(true, Ordering::Release);
        }
    }

    /// This process's value, read-locked, if it has been made.
    pub fn read(&'static self) -> Option<Read<T>> {
        self.register();
        let g = self.slot.read().unwrap_or_else(|p| p.into_inner());
        g.as_ref().is_some_and(|(pid, _)| *pid == std::process::id()).then(|| Read(g))
    }

    /// This process's value, write-locked; made by `make` (given the pid)
    /// if this process has none yet.
    pub fn write(&'static self, make: impl FnOnce(u32) -> T) -> Write<T> {
        self.register();
        let mut g = self.slot.write().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if g.as_ref().is_none_or(|(p, _)| *p != pid) {
            if let Some(old) = g.take() {
                if !self.drop_inherited {
                    std::mem::forget(old);
                }
            }
            *g = Some((pid, make(pid)));
        }
        Write(g)
    }
}

impl<T: Send + Sync + 'static> Hold for PerProcess<T> {
    fn hold(&'static self) -> Box<dyn Any> {
        Box::new(self.slot.write().unwrap_or_else(|p| p.into_inner()))
    }

    fn rank(&self) -> u8 {
        self.rank
    }
}

/// Runs `f` when the process exits (`atexit`).
///
/// `f` must not unwind: an `extern "C"` function that panics aborts, so it
/// catches its panics itself to stay quiet.
pub(crate) fn at_exit(f: extern "C" fn()) {
    // SAFETY: `f` is a function of this library that takes no arguments and
    // cannot unwind across the C caller (an `extern "C"` function aborts
    // instead); the library stays loaded until exit (Rust programs link it,
    // Python never unloads an extension module, and glibc runs a library's
    // exit handlers when it is unloaded).
    unsafe { libc::atexit(f) };
}

/// Returns the free pages of every heap arena to the system (glibc's
/// `malloc_trim`); nothing with other allocators.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock itself and only releases
    // pages of free chunks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// CPU time (user plus system) the calling thread has used so far, in
/// nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, a vDSO call: cheap enough per batch).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call; the clock id is
    // a constant every Linux kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0).saturating_mul(1_000_000_000) + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The calling thread's kernel thread id (`gettid`).
pub fn thread_id() -> u32 {
    // SAFETY: gettid takes no arguments, touches no memory and cannot fail.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).unwrap_or(0)
}

/// CPU time (user plus system) thread `tid` of this process has used so far,
/// in nanoseconds, from `/proc/self/task/<tid>/schedstat`; `None` once the
/// thread has exited (or where the file is missing).
pub fn task_cpu_ns(tid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A forked child of a test ([`fork`]).
#[cfg(test)]
pub(crate) struct Child(libc::pid_t);

/// Forks: the child runs `child` and exits with its status at once (no
/// destructors of the parent's run there); the parent gets the [`Child`].
#[cfg(test)]
pub(crate) fn fork(child: impl FnOnce() -> i32) -> Child {
    // SAFETY: the child runs only `child` and then `_exit`s; zring's
    // pthread_atfork handlers leave no zring lock held in it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let status = child();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(status) };
    }
    Child(pid)
}

#[cfg(test)]
impl Child {
    /// Waits for the child; its exit status, `None` if it did not exit.
    pub fn wait(self) -> Option<i32> {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is valid.
        assert_eq!(unsafe { libc::waitpid(self.0, &mut status, 0) }, self.0);
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }
}
