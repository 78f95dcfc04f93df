//! Bindings of the object-storage tier (`zring-remote`): staging a share
//! of a dataset in a bucket into a per-host cache, uploading parts and
//! committing them with a conditional manifest write.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zring_remote::{Error, NewPart, Remote, StageOptions};

use crate::error;

fn remote_err(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::InvalidArgument(_) | Error::CacheTooSmall(_) => PyValueError::new_err(msg),
        Error::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        Error::Stale { .. } => error::StaleError::new_err(msg),
        Error::Timeout { .. } => PyTimeoutError::new_err(msg),
        Error::Conflict(_) => error::ZringError::new_err(msg),
        Error::Io { source, .. } => match source.raw_os_error() {
            Some(code) => PyOSError::new_err((code, msg)),
            None => PyOSError::new_err(msg),
        },
        Error::Engine(e) => error::engine(e),
        _ => PyOSError::new_err(msg),
    }
}

/// A Python callable as [`zring_remote::Credentials`]: called (with the
/// GIL) for new credentials, it returns a dict of `key_id`, `secret_key`,
/// and optionally `token` and `expires_in` (seconds).
#[derive(Debug)]
struct PyCredentials(Py<PyAny>);

impl zring_remote::Credentials for PyCredentials {
    fn fetch(&self) -> Result<zring_remote::Credential, String> {
        Python::attach(|py| {
            let got = self.0.call0(py).map_err(|e| format!("the credentials callable raised {e}"))?;
            let d = got.bind(py);
            let item = |k: &str| -> Result<Option<Bound<'_, PyAny>>, String> {
                match d.get_item(k) {
                    Ok(v) if v.is_none() => Ok(None),
                    Ok(v) => Ok(Some(v)),
                    Err(_) => Ok(None),
                }
            };
            let text = |k: &str| -> Result<Option<String>, String> {
                item(k)?
                    .map(|v| {
                        v.extract::<String>().map_err(|_| format!("the credentials callable's {k:?} is not a string"))
                    })
                    .transpose()
            };
            let need = |k: &str| -> Result<String, String> {
                text(k)?.ok_or_else(|| {
                    format!(
                        "the credentials callable returned no {k:?} (a dict of key_id, secret_key, token, expires_in)"
                    )
                })
            };
            let valid_for = match item("expires_in")? {
                None => None,
                Some(v) => {
                    let secs: f64 = v
                        .extract()
                        .map_err(|_| "the credentials callable's \"expires_in\" is not a number".to_string())?;
                    if !(secs.is_finite() && secs > 0.0) {
                        return Err(format!("the credentials callable's \"expires_in\" must be positive, got {secs}"));
                    }
                    Some(std::time::Duration::from_secs_f64(secs))
                }
            };
            Ok(zring_remote::Credential {
                key_id: need("key_id")?,
                secret_key: need("secret_key")?,
                token: text("token")?,
                valid_for,
            })
        })
    }
}

/// The remote at `url`. An option `credentials` names a callable that
/// `zring.remote.options` registered (its `_CREDENTIALS`), which then signs
/// the requests.
fn open(url: &str, options: Vec<(String, String)>) -> PyResult<Remote> {
    let (named, rest): (Vec<_>, Vec<_>) = options.into_iter().partition(|(k, _)| k == "credentials");
    let credentials = match named.first() {
        None => None,
        Some((_, id)) => Some(Python::attach(|py| -> PyResult<std::sync::Arc<dyn zring_remote::Credentials>> {
            let reg = py.import("zring.remote")?.getattr("_CREDENTIALS")?;
            let f = reg.get_item(id.parse::<u64>().map_err(|_| PyValueError::new_err("a bad credentials id"))?)?;
            Ok(std::sync::Arc::new(PyCredentials(f.unbind())))
        })?),
    };
    Remote::open_with(url, &rest, credentials).map_err(remote_err)
}

/// Whether `s` is an object-storage URL (`s3://`, `gs://`, `az://`, `file://`).
#[pyfunction]
pub fn is_url(s: &str) -> bool {
    zring_remote::is_url(s)
}

/// The folder a cache keeps `url`'s dataset (or rank `rank` of `ranks`'s
/// share) in.
#[pyfunction]
#[pyo3(signature = (url, rank=None))]
pub fn cache_name(url: &str, rank: Option<(u32, u32)>) -> String {
    zring_remote::cache_name(url, rank)
}

/// Stage `url`'s dataset (or rank `rank`'s share) into `cache`; returns a
/// dict of what was done. `progress(done, total)` is called with the GIL
/// held, at most every 0.2 s.
#[pyfunction]
#[pyo3(signature = (url, cache, options, rank=None, cache_bytes=None, progress=None, lazy=false))]
#[allow(clippy::too_many_arguments)]
pub fn stage<'py>(
    py: Python<'py>,
    url: String,
    cache: PathBuf,
    options: Vec<(String, String)>,
    rank: Option<(u32, u32)>,
    cache_bytes: Option<u64>,
    progress: Option<Py<PyAny>>,
    lazy: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let r = open(&url, options)?;
    let opts = StageOptions { rank, cache_bytes, lazy, ..Default::default() };
    let mut last = std::time::Instant::now();
    let mut report = |done: u64, total: u64| {
        if let Some(cb) = &progress {
            if done == total || last.elapsed().as_millis() >= 200 {
                last = std::time::Instant::now();
                Python::attach(|py| {
                    let _ = cb.call1(py, (done, total));
                });
            }
        }
    };
    let staged = py.detach(|| zring_remote::stage(&r, &cache, &opts, &mut report)).map_err(remote_err)?;
    let s = r.stats();
    let d = PyDict::new(py);
    d.set_item("path", staged.path.display().to_string())?;
    d.set_item("share_bytes", staged.share_bytes)?;
    d.set_item("fetched_bytes", staged.fetched_bytes)?;
    d.set_item("fetched_objects", staged.fetched)?;
    d.set_item("reused_objects", staged.reused)?;
    d.set_item("removed_bytes", staged.removed_bytes)?;
    request_stats(&d, &s)?;
    Ok(d)
}

/// A remote's request counters into `d`: requests asked for, HTTP attempts
/// sent (retries, resumed bodies and listing pages included), throttling
/// answers, other 5xx answers, attempts with no answer, and requests that
/// failed after their retries.
fn request_stats(d: &Bound<'_, PyDict>, s: &zring_remote::Stats) -> PyResult<()> {
    d.set_item("requests", s.requests)?;
    d.set_item("http_attempts", s.attempts)?;
    d.set_item("throttles", s.throttles)?;
    d.set_item("server_errors", s.server_errors)?;
    d.set_item("failed_connections", s.failed_connections)?;
    d.set_item("request_errors", s.errors)?;
    Ok(())
}

/// A process's hold on a staged dataset (no other stage evicts it while held).
#[pyclass(name = "CacheHold", module = "zring._zring")]
pub struct PyCacheHold {
    inner: Mutex<Option<zring_remote::Hold>>,
}

#[pymethods]
impl PyCacheHold {
    #[new]
    #[pyo3(signature = (cache, url, rank=None))]
    fn new(py: Python<'_>, cache: PathBuf, url: String, rank: Option<(u32, u32)>) -> PyResult<Self> {
        let h = py.detach(|| zring_remote::hold(&cache, &url, rank)).map_err(remote_err)?;
        Ok(PyCacheHold { inner: Mutex::new(Some(h)) })
    }

    /// Release the hold.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// Upload the local store `local` as part `name` of the dataset at `url`;
/// the bytes uploaded.
#[pyfunction]
pub fn upload_part(
    py: Python<'_>,
    url: String,
    options: Vec<(String, String)>,
    local: PathBuf,
    name: String,
) -> PyResult<u64> {
    let r = open(&url, options)?;
    py.detach(|| zring_remote::upload_part(&r, &local, &name)).map_err(remote_err)
}

/// Upload the local store `local` to `url` itself (a single store's
/// files); the bytes uploaded.
#[pyfunction]
pub fn upload_store(py: Python<'_>, url: String, options: Vec<(String, String)>, local: PathBuf) -> PyResult<u64> {
    let r = open(&url, options)?;
    py.detach(|| zring_remote::upload_store(&r, &local, "")).map_err(remote_err)
}

/// An uploaded part to commit: name, records, content, schema JSON, decoded bytes.
type UploadedPart = (String, u64, String, Option<String>, Option<u64>);

/// Commit uploaded parts `(name, records, content, schema JSON or None,
/// decoded bytes or None)` to the dataset at `url`; `(generation, retries,
/// warnings)`.
#[pyfunction]
pub fn commit(
    py: Python<'_>,
    url: String,
    options: Vec<(String, String)>,
    parts: Vec<UploadedPart>,
    overwrite: bool,
) -> PyResult<(u64, u32, Vec<String>)> {
    let r = open(&url, options)?;
    let mut new = Vec::with_capacity(parts.len());
    for (name, records, content, schema, bytes) in parts {
        let schema = match schema {
            Some(s) => {
                serde_json::from_str(&s).map_err(|e| PyValueError::new_err(format!("part {name}: schema: {e}")))?
            }
            None => serde_json::Value::Null,
        };
        new.push(NewPart { name, records, content, schema, bytes });
    }
    let c = py.detach(|| zring_remote::commit(&r, &new, overwrite)).map_err(remote_err)?;
    Ok((c.generation, c.retries, c.warnings))
}

/// Remove the uploaded parts `names` the manifest at `url` does not list.
#[pyfunction]
pub fn remove_unlisted(
    py: Python<'_>,
    url: String,
    options: Vec<(String, String)>,
    names: Vec<String>,
) -> PyResult<Vec<String>> {
    let r = open(&url, options)?;
    py.detach(|| zring_remote::remove_unlisted(&r, &names)).map_err(remote_err)
}

/// `(size, etag)` of the object `key` under `url`, or None if there is none.
#[pyfunction]
pub fn stat_object(
    py: Python<'_>,
    url: String,
    options: Vec<(String, String)>,
    key: String,
) -> PyResult<Option<(u64, String)>> {
    let r = open(&url, options)?;
    match py.detach(|| r.head(&key)) {
        Ok(o) => Ok(Some((o.size, o.etag))),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(remote_err(e)),
    }
}

/// `(key, size, etag)` of every object under `sub` of `url`.
#[pyfunction]
pub fn list_objects(
    py: Python<'_>,
    url: String,
    options: Vec<(String, String)>,
    sub: String,
) -> PyResult<Vec<(String, u64, String)>> {
    let r = open(&url, options)?;
    let l = py.detach(|| r.list(&sub)).map_err(remote_err)?;
    Ok(l.into_iter().map(|o| (o.key, o.size, o.etag)).collect())
}

/// The line cache of a dataset of parts staged lazily: its chunk files
/// filled line by line as they are read, within the cap.
#[pyclass(name = "LineCache", module = "zring._zring")]
pub struct PyLineCache {
    inner: std::sync::Arc<zring_remote::LineCache>,
}

#[pymethods]
impl PyLineCache {
    /// Make the line cache of `url` staged lazily in `cache` the fill of
    /// the open dataset of parts `parts`.
    #[new]
    #[pyo3(signature = (parts, url, options, cache, cap, rank=None))]
    fn new(
        py: Python<'_>,
        parts: PyRef<'_, crate::parts::PyParts>,
        url: String,
        options: Vec<(String, String)>,
        cache: PathBuf,
        cap: u64,
        rank: Option<(u32, u32)>,
    ) -> PyResult<Self> {
        let r = open(&url, options)?;
        let p = parts.parts()?;
        let lc = py.detach(|| zring_remote::LineCache::open(r, &cache, rank, cap)).map_err(remote_err)?;
        p.set_fill(std::sync::Arc::new(zring_remote::Filler(lc.clone()))).map_err(error::engine)?;
        Ok(PyLineCache { inner: lc })
    }

    /// Counters: lines and bytes fetched and evicted, fills that hit and
    /// missed, seconds spent fetching, and the bytes held against the cap.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.inner.stats());
        let d = PyDict::new(py);
        d.set_item("lines_fetched", s.lines_fetched)?;
        d.set_item("bytes_fetched", s.bytes_fetched)?;
        d.set_item("lines_evicted", s.lines_evicted)?;
        d.set_item("bytes_evicted", s.bytes_evicted)?;
        d.set_item("fills_hit", s.hits)?;
        d.set_item("fills_fetched", s.misses)?;
        d.set_item("fetch_seconds", s.fetch_ns as f64 / 1e9)?;
        d.set_item("cache_used_bytes", s.used_bytes)?;
        d.set_item("cache_cap_bytes", s.cap_bytes)?;
        request_stats(&d, &s.requests)?;
        Ok(d)
    }
}

/// Registers the tier's functions in the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(is_url, m)?)?;
    m.add_function(wrap_pyfunction!(cache_name, m)?)?;
    m.add_function(wrap_pyfunction!(stage, m)?)?;
    m.add_class::<PyCacheHold>()?;
    m.add_class::<PyLineCache>()?;
    m.add_function(wrap_pyfunction!(upload_part, m)?)?;
    m.add_function(wrap_pyfunction!(upload_store, m)?)?;
    m.add_function(wrap_pyfunction!(commit, m)?)?;
    m.add_function(wrap_pyfunction!(remove_unlisted, m)?)?;
    m.add_function(wrap_pyfunction!(list_objects, m)?)?;
    m.add_function(wrap_pyfunction!(stat_object, m)?)?;
    Ok(())
}
