//! `Staging`: a directory built beside its destination and renamed into
//! place ([`zring_engine::Staging`]); `write_dataset`, `write_ragged` and
//! `convert` build every new store in one.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use zring_engine::Staging;

use crate::error;

/// A hidden directory beside `dest` to build in; `publish()` renames it
/// into place (swapping it for an existing `dest` when `replace`),
/// `discard()` removes it.
#[pyclass(name = "Staging", module = "zring._zring")]
pub struct PyStaging {
    inner: Mutex<Option<Staging>>,
    path: String,
}

#[pymethods]
impl PyStaging {
    #[new]
    #[pyo3(signature = (dest, replace = false))]
    fn new(py: Python<'_>, dest: std::path::PathBuf, replace: bool) -> PyResult<Self> {
        let staging = py.detach(|| Staging::new(&dest, replace)).map_err(error::engine)?;
        let path = staging.path().display().to_string();
        Ok(PyStaging { inner: Mutex::new(Some(staging)), path })
    }

    /// The directory to build in.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Rename the directory into place and fsync its parent.
    fn publish(&self, py: Python<'_>) -> PyResult<()> {
        let staging = self.take()?;
        py.detach(|| staging.publish()).map_err(error::engine)
    }

    /// Remove the directory (a no-op once published or discarded).
    fn discard(&self, py: Python<'_>) {
        let staging = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        py.detach(|| drop(staging));
    }
}

impl PyStaging {
    fn take(&self) -> PyResult<Staging> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyValueError::new_err(format!("{} was already published or discarded", self.path)))
    }
}
