//! Fault injection for the reliability suites (cargo feature `fault-injection`).
//!
//! Every read, write, fsync and open the engine issues passes a hook here. A
//! test arms one kind with a countdown — "fail the Nth write from now with
//! ENOSPC" — runs a workload, and checks that the failure became a typed
//! error, that nothing acknowledged was lost, and that a failed fsync poisoned
//! the writer. Without the feature the hook is an empty inline function.

/// Which kind of operation to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A positional read of record bytes (one per record or span).
    Read,
    /// A positional write of record bytes or table entries, or a small file's contents.
    Write,
    /// An fsync of a file or directory.
    Fsync,
    /// Opening or creating a file.
    Open,
    /// Creating a thread's io_uring ring.
    RingSetup,
    /// An `io_uring_enter` call (submitting, or waiting for completions).
    Enter,
    /// Handing a completed read to its record's check and decode: an armed
    /// fault makes that callback panic (the errno is ignored).
    Complete,
}

/// Number of [`Kind`]s.
#[cfg(feature = "fault-injection")]
const KINDS: usize = 7;

#[cfg(feature = "fault-injection")]
mod imp {
    use super::Kind;
    use std::sync::Mutex;

    struct State {
        seen: [u64; super::KINDS],
        /// (kind, the operation count that fails, errno, and every later one too)
        armed: Option<(Kind, u64, i32, bool)>,
    }

    static STATE: Mutex<State> = Mutex::new(State { seen: [0; super::KINDS], armed: None });

    fn slot(k: Kind) -> usize {
        match k {
            Kind::Read => 0,
            Kind::Write => 1,
            Kind::Fsync => 2,
            Kind::Open => 3,
            Kind::RingSetup => 4,
            Kind::Enter => 5,
            Kind::Complete => 6,
        }
    }

    /// Fails the `nth` (1-based) operation of `kind` from now with `errno`, once.
    pub fn arm(kind: Kind, nth: u64, errno: i32) {
        let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let at = s.seen[slot(kind)] + nth.max(1);
        s.armed = Some((kind, at, errno, false));
    }

    /// Fails the `nth` (1-based) operation of `kind` from now and every later
    /// one with `errno`, until [`disarm`].
    pub fn arm_from(kind: Kind, nth: u64, errno: i32) {
        let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let at = s.seen[slot(kind)] + nth.max(1);
        s.armed = Some((kind, at, errno, true));
    }

    /// Cancels an armed fault.
    pub fn disarm() {
        STATE.lock().unwrap_or_else(|p| p.into_inner()).armed = None;
    }

    /// Operations of `kind` seen so far in this process.
    pub fn seen(kind: Kind) -> u64 {
        STATE.lock().unwrap_or_else(|p| p.into_inner()).seen[slot(kind)]
    }

    /// Whether an armed fault has not fired yet.
    pub fn pending() -> bool {
        STATE.lock().unwrap_or_else(|p| p.into_inner()).armed.is_some()
    }

    pub(crate) fn hit(kind: Kind) -> std::io::Result<()> {
        let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
        s.seen[slot(kind)] += 1;
        let n = s.seen[slot(kind)];
        match s.armed {
            Some((k, at, errno, from)) if k == kind && (at == n || from && n > at) => {
                if !from {
                    s.armed = None;
                }
                Err(std::io::Error::from_raw_os_error(errno))
            }
            _ => Ok(()),
        }
    }
}

/// A file-system mutation, as the power-loss simulation replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A file was created (or truncated to empty) at this path.
    Create(std::path::PathBuf),
    /// Bytes written at an offset.
    Write(std::path::PathBuf, u64, Vec<u8>),
    /// A file's length was set.
    SetLen(std::path::PathBuf, u64),
    /// A file's contents were made durable.
    Fsync(std::path::PathBuf),
    /// A directory's entries were made durable.
    FsyncDir(std::path::PathBuf),
    /// A rename.
    Rename(std::path::PathBuf, std::path::PathBuf),
    /// A removal.
    Remove(std::path::PathBuf),
}

#[cfg(feature = "fault-injection")]
mod trace {
    use super::Event;
    use std::sync::Mutex;

    static TRACE: Mutex<Option<Vec<Event>>> = Mutex::new(None);

    /// Starts recording every mutation the engine makes (this process).
    pub fn start_trace() {
        *TRACE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
    }

    /// Stops recording and returns what was recorded.
    pub fn take_trace() -> Vec<Event> {
        TRACE.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default()
    }

    /// Events recorded so far.
    pub fn trace_len() -> usize {
        TRACE.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(0, Vec::len)
    }

    pub(crate) fn record(event: impl FnOnce() -> Event) {
        if let Some(t) = TRACE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            t.push(event());
        }
    }
}

#[cfg(feature = "fault-injection")]
pub use imp::{arm, arm_from, disarm, pending, seen};
#[cfg(feature = "fault-injection")]
pub use trace::{start_trace, take_trace, trace_len};

#[cfg(feature = "fault-injection")]
pub(crate) use imp::hit;
#[cfg(feature = "fault-injection")]
pub(crate) use trace::record;

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn hit(_kind: Kind) -> std::io::Result<()> {
    Ok(())
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn record(_event: impl FnOnce() -> Event) {}

/// The named points where a crash test can abort the process: after the
/// step the name describes, before the next one. `ZRING_CRASH_AT=name:k`
/// (with the feature) aborts at the k-th time the process reaches `name`.
pub const CRASH_POINTS: &[&str] = &[
    "append.written",       // records and entries written, nothing synced
    "sync.flushed",         // data and table fsynced, head not yet replaced
    "atomic.before_rename", // a new head/dict/schema written and fsynced, not renamed
    "atomic.renamed",       // renamed, directory not yet fsynced
    "compact.copied",       // compaction's new chunks durable, no table for them yet
    "table.written",        // a new table generation durable, head not yet replaced
    "table.committed",      // head replaced, old table/chunks not yet removed
];

/// The crash points of a dataset of parts' commit (`parts/commit.rs`),
/// which a store's operations never reach (`engine/tests/parts_faults.rs`).
pub const PARTS_CRASH_POINTS: &[&str] = &[
    "parts.moved_one",        // a staged part moved into parts/, the others not yet
    "parts.moved",            // a commit's parts moved (and synced), no manifest yet
    "parts.manifest_written", // a new manifest written and synced, not renamed
    "parts.committed",        // the manifest renamed (the commit point), folder not yet synced
];

#[cfg(feature = "fault-injection")]
pub(crate) fn crash_point(name: &'static str) {
    use std::sync::{Mutex, OnceLock};
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: Mutex<u64> = Mutex::new(0);
    let target = TARGET.get_or_init(|| {
        let v = crate::env::crash_at()?;
        let (n, k) = v.rsplit_once(':')?;
        Some((n.to_string(), k.parse().ok()?))
    });
    if let Some((n, k)) = target {
        if n == name {
            let mut hits = HITS.lock().unwrap_or_else(|p| p.into_inner());
            *hits += 1;
            if *hits == *k {
                std::process::abort();
            }
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn crash_point(_name: &'static str) {}
