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
}

#[cfg(feature = "fault-injection")]
mod imp {
    use super::Kind;
    use std::sync::Mutex;

    struct State {
        seen: [u64; 4],
        armed: Option<(Kind, u64, i32)>,
    }

    static STATE: Mutex<State> = Mutex::new(State { seen: [0; 4], armed: None });

    fn slot(k: Kind) -> usize {
        match k {
            Kind::Read => 0,
            Kind::Write => 1,
            Kind::Fsync => 2,
            Kind::Open => 3,
        }
    }

    /// Fails the `nth` (1-based) operation of `kind` from now with `errno`, once.
    pub fn arm(kind: Kind, nth: u64, errno: i32) {
        let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let at = s.seen[slot(kind)] + nth.max(1);
        s.armed = Some((kind, at, errno));
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
            Some((k, at, errno)) if k == kind && at == n => {
                s.armed = None;
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
pub use imp::{arm, disarm, pending, seen};
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
