//! The compiled half of the Python package `zring` (`zring._zring`).
//!
//! This crate only converts: NumPy arrays and Python values in, engine,
//! sampler and loader calls (with the GIL released), NumPy arrays and dicts
//! out. The Python half (`python/zring/`) builds the loaderx-compatible API
//! (`Dataset`, `DataLoader`, `write_dataset`, ...) on these classes:
//!
//! - `Store` ([`store::PyStore`]): an open record store.
//! - `Parts` ([`parts::PyParts`]): a dataset of parts read as one store;
//!   `commit_parts` writes its manifest.
//! - `Staging` ([`staging::PyStaging`]): a directory built beside its
//!   destination and renamed into place.
//! - `Sampler` ([`sampler::PySampler`]): the index stream on its own.
//! - `Loader` ([`loader::PyLoader`]): the step pipeline, with batches lent to
//!   NumPy through `BatchBuffer` owners.
//! - the exception hierarchy under `ZringError` ([`error`]).
//! - `ceiling`, with the `bench` feature only (`make bench`): the codec and
//!   memcpy ceilings the benchmarks report ratios against.

#[cfg(feature = "bench")]
mod ceiling;
mod convert;
mod error;
mod loader;
mod parts;
#[cfg(feature = "remote")]
mod remote;
mod sampler;
mod staging;
mod store;

use pyo3::prelude::*;

/// Convert the loaderx store at `src` into a new zring store at `dst`
/// (records, dictionary and schema.json; the table sealed in format 2);
/// returns the new store's stats.
#[pyfunction]
fn import_loaderx<'py>(
    py: Python<'py>,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
) -> PyResult<Bound<'py, PyAny>> {
    let stats = py
        .detach(|| {
            let store = zring_engine::import_loaderx(&src, &dst)?;
            let stats = store.stats()?;
            store.close()?;
            Ok(stats)
        })
        .map_err(error::engine)?;
    convert::to_py(py, &stats)
}

/// State the memory budget of this process's store data (page cache and
/// zring's record caches together) in bytes, for every store open now and
/// later; `None` withdraws the statement. Returns the statement it replaces.
///
/// The process has one budget: the latest statement still live. This call
/// makes the process-level statement, which lives until it is made again;
/// each store opened with `cache_bytes=` and each DataLoader with
/// `cache_bytes=` makes one that lives until it closes, in any order. With
/// none live, `ZRING_CACHE_BYTES`, else the measured budget.
#[pyfunction]
#[pyo3(signature = (cache_bytes))]
fn set_cache_bytes(cache_bytes: Option<u64>) -> Option<u64> {
    zring_engine::set_cache_bytes(cache_bytes)
}

/// A budget statement that lives until `release()` (a DataLoader's
/// `cache_bytes`; see `set_cache_bytes`).
#[pyclass(name = "BudgetStatement", module = "zring._zring")]
struct PyBudgetStatement {
    inner: std::sync::Mutex<Option<zring_engine::BudgetStatement>>,
    bytes: u64,
}

#[pymethods]
impl PyBudgetStatement {
    /// Withdraws the statement: the budget returns to the latest statement
    /// still live. Idempotent.
    fn release(&self) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(taken);
    }

    /// The bytes stated.
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `release()` has not been called.
    #[getter]
    fn live(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// States `cache_bytes` as the process's budget until the returned
/// statement's `release()` (or its collection).
#[pyfunction]
#[pyo3(signature = (cache_bytes))]
fn state_cache_bytes(cache_bytes: u64) -> PyBudgetStatement {
    PyBudgetStatement {
        inner: std::sync::Mutex::new(Some(zring_engine::state_cache_bytes(cache_bytes))),
        bytes: cache_bytes,
    }
}

/// Raise `FileExistsError` unless `path` may be replaced by a new store
/// (`overwrite=True`): a zring store (a `head.zr` that reads as one), a
/// loaderx store, a directory of stores, an empty directory, or nothing.
/// Nothing is changed.
#[pyfunction]
fn check_replaceable(py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
    py.detach(|| zring_engine::check_replaceable(&path)).map_err(error::engine)
}

#[pymodule]
fn _zring(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<store::PyStore>()?;
    m.add_class::<staging::PyStaging>()?;
    m.add_class::<parts::PyParts>()?;
    m.add_function(wrap_pyfunction!(parts::commit_parts, m)?)?;
    m.add_function(wrap_pyfunction!(parts::abandon_job, m)?)?;
    m.add_function(wrap_pyfunction!(parts::manifest_schema, m)?)?;
    m.add_class::<parts::PyPartWriter>()?;
    m.add_class::<parts::PyJobHold>()?;
    #[cfg(feature = "remote")]
    remote::register(m)?;
    m.add_function(wrap_pyfunction!(parts::rank_plan, m)?)?;
    m.add_function(wrap_pyfunction!(parts::manifest_parts, m)?)?;
    m.add_class::<sampler::PySampler>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyBatchBuffer>()?;
    m.add_function(wrap_pyfunction!(import_loaderx, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::mixture_allocation, m)?)?;
    m.add_function(wrap_pyfunction!(set_cache_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(state_cache_bytes, m)?)?;
    m.add_class::<PyBudgetStatement>()?;
    m.add_function(wrap_pyfunction!(check_replaceable, m)?)?;
    #[cfg(feature = "bench")]
    m.add_function(wrap_pyfunction!(ceiling::ceiling, m)?)?;
    m.add("ZringError", py.get_type::<error::ZringError>())?;
    m.add("CorruptError", py.get_type::<error::CorruptError>())?;
    m.add("ChecksumError", py.get_type::<error::ChecksumError>())?;
    m.add("NotAStoreError", py.get_type::<error::NotAStoreError>())?;
    m.add("UnsupportedVersionError", py.get_type::<error::UnsupportedVersionError>())?;
    m.add("LockedError", py.get_type::<error::LockedError>())?;
    m.add("PoisonedError", py.get_type::<error::PoisonedError>())?;
    m.add("StaleError", py.get_type::<error::StaleError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
