//! `fork()`: a child finds no zring lock held and no zring operation half done.
//!
//! A forked child has one thread, a copy of the one that called `fork`. Any
//! lock another thread held at that instant stays held forever in the child,
//! and any structure it was changing stays half changed. zring has such locks
//! everywhere a gather or a write goes: each store's snapshot and writer, its
//! read policy, the record cache's shards, the decode pool's slot, the
//! descriptor cache. A child (a torch DataLoader worker, a `multiprocessing`
//! process) that then used the store would block forever.
//!
//! So every store operation runs inside a *gate* ([`enter`]): a process-wide
//! reader-writer lock, taken shared by the outermost zring call on a thread
//! (nested calls, and pool threads working for a call, take nothing more).
//! On first use a `pthread_atfork` handler is registered whose *prepare* step
//! takes the gate exclusively, then the process-wide locks outside it: every
//! [`PerProcess`](crate::io::process::PerProcess) value (the decode pool, the memory owner with the record
//! caches, the descriptor cache), each of which registers itself on first use. `fork` thus waits until the operations under way have
//! finished and holds off new ones (a waiting writer blocks new readers of the
//! gate), and the *parent* and *child* steps release everything. The child
//! starts with every lock free and every structure whole; the pool, the rings
//! and the caches it inherited belong to threads it does not have, and are
//! replaced on first use (each is tagged with the pid that made it).
//!
//! Costs and limits: a gather takes one uncontended shared lock (tens of
//! nanoseconds against a gather's tens of microseconds at least); a `fork`
//! waits for the longest operation under way: one gather, or one block of a
//! long write (appends and compactions leave the gate between blocks,
//! [`Gated::yield_to_fork`], so a fork during an hours-long compaction waits
//! for one 64 MiB group). A child forked inside such a write cannot write to
//! that store through the inherited handle (the writer is refused in a
//! forked child), and never waits for it. An operation that never ends (a read from a hung network file
//! system) holds `fork` too, where without the gate the child would have hung
//! instead. A `fork` called from inside a zring operation on the same thread
//! cannot wait for it and skips the prepare step; zring calls no user code
//! inside its operations, so that needs a program that forks from a signal
//! handler.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::{Once, RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// zring calls under way on this thread (only the outermost takes the gate).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// What the prepare step took, released by the parent and child steps
    /// (all three run on the thread that calls `fork`).
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// The locks held across a `fork`, released in reverse order of taking.
struct Held {
    _values: crate::io::process::Held,
    _gate: RwLockWriteGuard<'static, ()>,
}

/// Proof that the calling thread is inside the gate; leaving it (dropping)
/// lets a waiting `fork` proceed once no other thread is inside.
pub(crate) struct Entered {
    guard: Option<RwLockReadGuard<'static, ()>>,
    /// Tied to the thread whose depth it counts.
    _thread: PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        drop(self.guard.take());
    }
}

/// Enters the gate (module docs).
pub(crate) fn enter() -> Entered {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(register);
    let outermost = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    let guard = outermost.then(|| GATE.read().unwrap_or_else(|p| p.into_inner()));
    Entered { guard, _thread: PhantomData }
}

/// A guard that also keeps its thread inside the gate; derefs to the guard.
/// Fields drop in order: the guard first, then the gate.
pub(crate) struct Gated<G> {
    inner: G,
    entered: Option<Entered>,
}

impl<G> Gated<G> {
    /// `inner`, taken by a thread that is inside the gate through `entered`.
    pub fn new(entered: Entered, inner: G) -> Gated<G> {
        Gated { inner, entered: Some(entered) }
    }

    /// Leaves the gate and enters it again, so that a `fork` waiting for this
    /// operation happens now: a long write (an append of many blocks, a
    /// compaction of many groups) calls it between blocks, and a fork waits
    /// for one block, not the whole operation. A child forked there inherits
    /// `inner` locked by a thread it does not have; the store refuses to write
    /// in a forked child ([`crate::Store`]), so it is never waited for there.
    pub fn yield_to_fork(&mut self) {
        drop(self.entered.take());
        self.entered = Some(enter());
    }
}

impl<G: std::ops::Deref> std::ops::Deref for Gated<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.inner
    }
}

impl<G: std::ops::DerefMut> std::ops::DerefMut for Gated<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.inner
    }
}

fn register() {
    // SAFETY: the three handlers are plain functions with the signature
    // pthread_atfork expects, and stay valid for the life of the process.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
    // Without the handlers zring is as fork-safe as before (pid-tagged pool,
    // rings and caches); nothing else to do.
    debug_assert_eq!(rc, 0, "pthread_atfork failed");
}

extern "C" fn prepare() {
    if DEPTH.with(Cell::get) > 0 {
        return; // module docs: cannot wait for ourselves
    }
    // Finish lazy one-time setup now, so no child inherits it half done.
    let _ = crate::io::uring::uring_available();
    let _ = crate::io::mmap::guard_available();
    let _ = crate::io::mmap::evictions();
    let gate = GATE.write().unwrap_or_else(|p| p.into_inner());
    let held = Held { _values: crate::io::process::hold_all(), _gate: gate };
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

extern "C" fn release() {
    // Dropping the guards unlocks them: in the parent as usual; in the child,
    // where this thread is the one that locked them, the same.
    HELD.with(|h| drop(h.borrow_mut().take()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_call_takes_the_gate_and_a_fork_would_wait_for_it() {
        let outer = enter();
        assert!(outer.guard.is_some());
        assert!(GATE.try_write().is_err(), "a fork would wait for this call");
        let inner = enter();
        assert!(inner.guard.is_none(), "nested calls take nothing more");
        drop(inner);
        drop(outer);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }
}
