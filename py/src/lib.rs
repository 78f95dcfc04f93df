//! The compiled half of the Python package `zring` (`zring._zring`).
//!
//! This crate only converts: NumPy arrays and Python values in, engine,
//! sampler and loader calls (with the GIL released), NumPy arrays and dicts
//! out. The Python half (`python/zring/`) builds the loaderx-compatible API
//! (`Dataset`, `DataLoader`, `write_dataset`, ...) on these classes:
//!
//! - `Store` ([`store::PyStore`]): an open record store.
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
/// The process has one budget: this call states it and holds until it is
/// called again; without it, the first store still open that was opened
/// with `cache_bytes=` states it (later stores' values do not count while
/// it is open); with neither, `ZRING_CACHE_BYTES`, else the measured budget.
#[pyfunction]
#[pyo3(signature = (cache_bytes))]
fn set_cache_bytes(cache_bytes: Option<u64>) -> Option<u64> {
    zring_engine::set_cache_bytes(cache_bytes)
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
    m.add_class::<sampler::PySampler>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyBatchBuffer>()?;
    m.add_function(wrap_pyfunction!(import_loaderx, m)?)?;
    m.add_function(wrap_pyfunction!(set_cache_bytes, m)?)?;
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
