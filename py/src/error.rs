//! The Python exception hierarchy and the mapping of engine, loader and
//! sampler errors onto it.
//!
//! Store failures become subclasses of `ZringError` (a `RuntimeError`);
//! bad arguments become the builtin `ValueError`/`IndexError`, I/O failures
//! the builtin `OSError` with its errno (so a missing file is a
//! `FileNotFoundError`). The engine's and loader's enums are
//! `#[non_exhaustive]`: a variant added later falls back to `ZringError`,
//! never to a bare `Exception`.

use pyo3::create_exception;
use pyo3::exceptions::{PyFileExistsError, PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

create_exception!(
    zring,
    ZringError,
    PyRuntimeError,
    "Base class of every error zring raises for a failing store or loader (also exported as ZrecordError)."
);
create_exception!(
    zring,
    CorruptError,
    ZringError,
    "Bytes on disk contradict the store's metadata; run verify() and restore the store from a copy."
);
create_exception!(zring, ChecksumError, CorruptError, "A record's bytes do not match the checksum stored for it.");
create_exception!(zring, NotAStoreError, ZringError, "The directory holds neither a zring nor a loaderx store.");
create_exception!(
    zring,
    UnsupportedVersionError,
    ZringError,
    "The store was written in a format version this build cannot read."
);
create_exception!(
    zring,
    LockedError,
    ZringError,
    "Another writer holds the store's lock (open it read-only or wait for the writer to close), or another \
     process held a write lock on the chunks a reader must pin for ZRING_LOCK_WAIT_MS."
);
create_exception!(
    zring,
    PoisonedError,
    ZringError,
    "An earlier failure left the store writer or the loader unusable; reopen (or rebuild from state())."
);

create_exception!(
    zring,
    StaleError,
    ZringError,
    "The store changed under an open handle (replaced, or its files removed outside zring); reopen it."
);

/// Converts an engine error into the matching Python exception.
pub fn engine(err: zring_engine::Error) -> PyErr {
    use zring_engine::Error as E;
    let msg = err.to_string();
    match err {
        E::Io { source, .. } => match source.raw_os_error() {
            // OSError(errno, text) picks the errno's subclass (FileNotFoundError, ...).
            Some(code) => PyOSError::new_err((code, msg)),
            None => PyOSError::new_err(msg),
        },
        E::NotAStore { .. } => NotAStoreError::new_err(msg),
        E::UnsupportedVersion { .. } => UnsupportedVersionError::new_err(msg),
        E::Corrupted { .. } => CorruptError::new_err(msg),
        E::ChecksumMismatch { .. } => ChecksumError::new_err(msg),
        E::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        E::RecordSize { .. } | E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::Locked { .. } | E::PinWait { .. } => LockedError::new_err(msg),
        E::Poisoned(_) => PoisonedError::new_err(msg),
        E::AlreadyExists { .. } | E::NotReplaceable { .. } => PyFileExistsError::new_err(msg),
        E::Stale { .. } => StaleError::new_err(msg),
        _ => ZringError::new_err(msg),
    }
}

/// Converts a sampler error: every variant is a bad argument.
pub fn sampler(err: zring_sampler::Error) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// Converts a loader error. A failed gather keeps the engine's exception
/// class, with the step and stream named in the message.
pub fn loader(err: zring_loader::Error) -> PyErr {
    use zring_loader::Error as L;
    let msg = err.to_string();
    match err {
        L::Gather { source, .. } | L::Fingerprint { source, .. } => match source.downcast::<zring_engine::Error>() {
            Ok(inner) => {
                let class = engine(*inner);
                // Keep the class, replace the text with the full context.
                pyo3::Python::attach(|py| PyErr::from_type(class.get_type(py), msg))
            }
            Err(_) => ZringError::new_err(msg),
        },
        L::NoStreams
        | L::DuplicateStream { .. }
        | L::LengthMismatch { .. }
        | L::InvalidConfig { .. }
        | L::StateMismatch { .. }
        | L::ShardCount { .. }
        | L::StreamChanged { .. }
        | L::CannotGrow { .. }
        | L::MixtureMismatch { .. }
        | L::PackMismatch { .. }
        | L::Pack { .. }
        | L::SourceStreams { .. }
        | L::Sampler(_)
        | L::Closed => PyValueError::new_err(msg),
        L::BatchTooLarge { .. } => PyMemoryError::new_err(msg),
        L::Poisoned { .. } => PoisonedError::new_err(msg),
        L::Spawn(e) => PyOSError::new_err(format!("{msg}: {e}")),
        _ => ZringError::new_err(msg),
    }
}
