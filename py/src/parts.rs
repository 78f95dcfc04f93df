//! `Parts`: a dataset of parts (`zring_engine::Parts`) as one read-only
//! store-like object; `PartWriter`, `JobHold`, `commit_parts` and
//! `abandon_job`, the engine's commit of staged parts (`zring_engine::parts`).
//!
//! `Parts` has the read methods of `Store` (`len`, `lengths`, `gather`,
//! `gather_var`, `fingerprint`, `stats`, `read_stats`, `verify`, `schema`,
//! `close`), so `Dataset` and `RaggedDataset` hold either, and the loader
//! turns it into a `PartsSource` where it would turn a `Store` into a
//! `StoreSource`.

use std::sync::{Arc, Mutex, PoisonError};

use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zring_engine::parts::{abandon, commit, JobHold, Mode, Options, PartWriter, Request as CommitRequest, Staged};
use zring_engine::{BudgetStatement, Fingerprint, Parts};
use zring_loader::{PartsSource, Request, Source, SourceError};

use crate::convert::to_py;
use crate::error;

/// An open dataset of parts (the Python class `zring._zring.Parts`).
#[pyclass(name = "Parts", module = "zring._zring", frozen)]
pub struct PyParts {
    /// `None` once closed; calls clone the `Arc` first, as `Store`'s do.
    inner: Mutex<Option<Arc<Parts>>>,
    path: String,
    /// The `cache_bytes` statement made at open, withdrawn at close.
    budget: Mutex<Option<BudgetStatement>>,
}

fn slice_u64<'a>(a: &'a PyReadonlyArray1<'_, u64>, name: &str) -> PyResult<&'a [u64]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{name} must be a contiguous uint64 array")))
}

/// A source error as Python sees it: an engine error keeps its class.
pub fn source_err(err: SourceError) -> PyErr {
    match err.downcast::<zring_engine::Error>() {
        Ok(e) => error::engine(*e),
        Err(other) => PyValueError::new_err(other.to_string()),
    }
}

impl PyParts {
    /// The dataset, shared; raises ValueError once closed.
    pub fn parts(&self) -> PyResult<Arc<Parts>> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| PyValueError::new_err(format!("dataset of parts {:?} is closed", self.path)))
    }
}

/// The first of `reports`' dicts with its members `summed` (counters)
/// added up over all of them; other members are the first's.
fn sum_dicts<'py>(py: Python<'py>, reports: Vec<Bound<'py, PyAny>>, summed: &[&str]) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (k, r) in reports.iter().enumerate() {
        let d = r.cast::<PyDict>()?;
        if k == 0 {
            out.update(d.as_mapping())?;
            continue;
        }
        for &key in summed {
            if let (Some(a), Some(b)) = (out.get_item(key)?, d.get_item(key)?) {
                out.set_item(key, a.extract::<u64>()? + b.extract::<u64>()?)?;
            }
        }
    }
    Ok(out)
}

/// The members of a store's `stats()` that add up over parts.
const STATS_SUMMED: &[&str] = &[
    "records",
    "logical_bytes",
    "live_bytes",
    "chunk_bytes",
    "reclaimable",
    "chunks",
    "table_bytes",
    "dict_bytes",
    "raw_records",
    "zstd_records",
    "zstd_dict_records",
];
/// The members of `read_stats()` that add up over parts.
const READS_SUMMED: &[&str] = &[
    "records",
    "cache_hits",
    "cache_misses",
    "page_cache_hits",
    "bytes_read",
    "bytes_into_place",
    "bytes_from_cache",
    "bytes_from_page_cache",
    "cache_held",
    "cache_entries",
    "window_bytes",
    "switches",
];
/// The members of `verify()` that add up over parts.
const VERIFY_SUMMED: &[&str] = &["records", "stored_bytes", "logical_bytes"];

#[pymethods]
impl PyParts {
    /// Open the dataset of parts at `path` (a folder with a
    /// `manifest.json`), checking every part: a missing part is a
    /// NotAStoreError, a part whose records or schema differ from the
    /// manifest's a CorruptError, each naming the part. `cache_bytes` is
    /// stated for the process until `close()` (`set_cache_bytes`).
    ///
    /// With `rank_parts=(rank, ranks)`, only the parts rank `rank` of
    /// `ranks` reads (`rank_plan`) are opened and make the dataset; the
    /// others need not be on this host.
    #[new]
    #[pyo3(signature = (path, *, cache_bytes = None, rank_parts = None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        cache_bytes: Option<u64>,
        rank_parts: Option<(u32, u32)>,
    ) -> PyResult<Self> {
        if let Some((rank, ranks)) = rank_parts {
            if ranks == 0 || rank >= ranks {
                return Err(PyValueError::new_err(format!("rank_parts=({rank}, {ranks}): need 0 <= rank < ranks")));
            }
        }
        let budget = cache_bytes.map(zring_engine::state_cache_bytes);
        let parts = py
            .detach(|| match rank_parts {
                None => Parts::open(&path),
                Some((rank, ranks)) => Parts::open_rank(&path, rank, ranks),
            })
            .map_err(error::engine)?;
        Ok(PyParts {
            inner: Mutex::new(Some(Arc::new(parts))),
            path: path.display().to_string(),
            budget: Mutex::new(budget),
        })
    }

    /// The dataset's directory.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Always False: a dataset of parts is read-only.
    #[getter]
    fn writable(&self) -> bool {
        false
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// The manifest's generation (commits so far).
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(self.parts()?.manifest().generation)
    }

    /// The committed parts read, in order: a list of dicts `dir` (relative
    /// to the dataset), `records`, `content` (8 hex digits), `start` (the
    /// dataset index of its first record), `number` (its place in the
    /// manifest).
    fn parts_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let parts = self.parts()?;
        let list = pyo3::types::PyList::empty(py);
        for (k, p) in parts.manifest().parts.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("dir", &p.dir)?;
            d.set_item("records", p.records)?;
            d.set_item("content", &p.content)?;
            d.set_item("start", parts.start(k))?;
            d.set_item("number", parts.number(k))?;
            d.set_item("whole_start", parts.whole_start(k))?;
            list.append(d)?;
        }
        Ok(list.into_any())
    }

    fn __len__(&self) -> PyResult<usize> {
        usize::try_from(self.parts()?.len()).map_err(|_| PyValueError::new_err("dataset length exceeds usize"))
    }

    /// The logical byte length of each record in `idx` (uint64 array).
    fn lengths<'py>(&self, py: Python<'py>, idx: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let src = PartsSource::ragged(self.parts()?);
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let mut out = vec![0u64; idx.len()];
        py.detach(|| src.lengths(&idx, &mut out)).map_err(source_err)?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// Decode records `idx` into the uint8 array `dst`, record `i` at byte
    /// `i * stride`, zero-padded to `stride`.
    fn gather(
        &self,
        py: Python<'_>,
        idx: PyReadonlyArray1<'_, u64>,
        mut dst: PyReadwriteArray1<'_, u8>,
        stride: usize,
    ) -> PyResult<()> {
        let src = PartsSource::fixed(self.parts()?, stride);
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let dst = dst.as_slice_mut().map_err(|_| PyValueError::new_err("dst must be a contiguous uint8 array"))?;
        let need = idx.len().checked_mul(stride).filter(|&n| n <= dst.len()).ok_or_else(|| {
            PyValueError::new_err(format!(
                "dst holds {} bytes, too few for {} records of stride {stride}",
                dst.len(),
                idx.len()
            ))
        })?;
        let dst = &mut dst[..need];
        py.detach(|| src.gather(&Request::packed(&idx), dst)).map_err(source_err)
    }

    /// Decode records `idx` into the uint8 array `dst`, record `i` at byte
    /// `offsets[i]` (one offset per index).
    fn gather_var(
        &self,
        py: Python<'_>,
        idx: PyReadonlyArray1<'_, u64>,
        mut dst: PyReadwriteArray1<'_, u8>,
        offsets: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<()> {
        let src = PartsSource::ragged(self.parts()?);
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let starts = slice_u64(&offsets, "offsets")?.to_vec();
        if starts.len() != idx.len() {
            return Err(PyValueError::new_err(format!(
                "offsets has {} entries but idx has {}; give one offset per index",
                starts.len(),
                idx.len()
            )));
        }
        let dst = dst.as_slice_mut().map_err(|_| PyValueError::new_err("dst must be a contiguous uint8 array"))?;
        py.detach(|| src.gather(&Request::at(&idx, &starts), dst)).map_err(source_err)
    }

    /// `{"records", "content"}` over all parts: the record count and a
    /// checksum over the parts' fingerprints in order. O(parts).
    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let fp: Fingerprint = self.parts()?.fingerprint();
        to_py(py, &fp)
    }

    /// Storage usage summed over the parts, with `parts` and `generation`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let parts = self.parts()?;
        let all = py
            .detach(|| {
                (0..parts.part_count()).map(|k| parts.store(k)?.stats()).collect::<zring_engine::Result<Vec<_>>>()
            })
            .map_err(error::engine)?;
        let dicts = all.iter().map(|s| to_py(py, s)).collect::<PyResult<Vec<_>>>()?;
        let out = sum_dicts(py, dicts, STATS_SUMMED)?;
        out.set_item("parts", parts.part_count())?;
        out.set_item("generation", parts.manifest().generation)?;
        Ok(out.into_any())
    }

    /// Read statistics summed over the parts open now (the policy is the
    /// first part's; all parts share the process's budget).
    fn read_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let parts = self.parts()?;
        let mut stores = parts.open_stores();
        if stores.is_empty() && parts.part_count() > 0 {
            stores.push(parts.store(0).map_err(error::engine)?);
        }
        let dicts = stores.iter().map(|s| to_py(py, &s.read_stats())).collect::<PyResult<Vec<_>>>()?;
        let out = sum_dicts(py, dicts, READS_SUMMED)?;
        let count = |key: &str| -> PyResult<u64> { out.get_item(key)?.map_or(Ok(0), |v| v.extract()) };
        let (records, hits, mapped) = (count("records")?, count("cache_hits")?, count("page_cache_hits")?);
        out.set_item("hit_rate", if records == 0 { 0.0 } else { (hits + mapped) as f64 / records as f64 })?;
        Ok(out.into_any())
    }

    /// Read and check every record of every part, one part after another;
    /// the summed report, or the first part's error.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let parts = self.parts()?;
        let all = py
            .detach(|| {
                (0..parts.part_count()).map(|k| parts.store(k)?.verify()).collect::<zring_engine::Result<Vec<_>>>()
            })
            .map_err(error::engine)?;
        let dicts = all.iter().map(|s| to_py(py, s)).collect::<PyResult<Vec<_>>>()?;
        let out = sum_dicts(py, dicts, VERIFY_SUMMED)?;
        out.set_item("parts", parts.part_count())?;
        Ok(out.into_any())
    }

    /// The first part's schema.json text (every part's, but for its codec),
    /// as read when the dataset was opened, or None.
    fn schema(&self) -> PyResult<Option<String>> {
        let parts = self.parts()?;
        if parts.part_count() == 0 {
            let s = &parts.manifest().schema;
            return Ok((!s.is_null()).then(|| s.to_string()));
        }
        Ok(parts.schema_text().map(str::to_owned))
    }

    /// Release the dataset (its stores close once running calls finish)
    /// and withdraw its `cache_bytes` statement.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
        self.budget.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close()
    }

    fn __repr__(&self) -> String {
        match self.parts() {
            Ok(p) => format!("Parts({:?}, {} parts, {} records)", self.path, p.part_count(), p.len()),
            Err(_) => format!("Parts({:?}, closed)", self.path),
        }
    }
}

/// A writer of staged parts (`zring.parts.write_part`): the dataset's
/// `staging/` held by descriptor (a store built at `staging + "/NAME"`
/// goes through it, never through a link), and the job's lock held shared
/// while it is open.
#[pyclass(name = "PartWriter", module = "zring._zring")]
pub struct PyPartWriter {
    inner: Mutex<Option<Arc<PartWriter>>>,
    staging: String,
}

impl PyPartWriter {
    fn get(&self) -> PyResult<Arc<PartWriter>> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| PyValueError::new_err("the part writer is closed"))
    }
}

#[pymethods]
impl PyPartWriter {
    #[new]
    #[pyo3(signature = (dataset, job = None))]
    fn new(py: Python<'_>, dataset: std::path::PathBuf, job: Option<String>) -> PyResult<Self> {
        let w = py.detach(|| PartWriter::new(&dataset, job.as_deref())).map_err(error::engine)?;
        let staging = w.staging_path().display().to_string();
        Ok(PyPartWriter { inner: Mutex::new(Some(Arc::new(w))), staging })
    }

    /// The staging folder's path.
    #[getter]
    fn staging(&self) -> &str {
        &self.staging
    }

    /// `(records, content, schema JSON or None)` of the staged part `name`.
    fn finish(&self, py: Python<'_>, name: String) -> PyResult<(u64, String, Option<String>)> {
        let w = self.get()?;
        let (fp, schema) = py.detach(|| w.finish(&name)).map_err(error::engine)?;
        Ok((fp.records, format!("{:08x}", fp.content), (!schema.is_null()).then(|| schema.to_string())))
    }

    /// Move the complete store at `src` into staging as part `name`;
    /// returns what `finish` does.
    fn adopt(&self, py: Python<'_>, src: std::path::PathBuf, name: String) -> PyResult<(u64, String, Option<String>)> {
        let w = self.get()?;
        let (fp, schema) = py.detach(|| w.adopt(&src, &name)).map_err(error::engine)?;
        Ok((fp.records, format!("{:08x}", fp.content), (!schema.is_null()).then(|| schema.to_string())))
    }

    /// Replace the staged part `name`'s schema.json with `json`.
    fn set_schema(&self, py: Python<'_>, name: String, json: String) -> PyResult<()> {
        let w = self.get()?;
        py.detach(|| w.set_schema(&name, &json)).map_err(error::engine)
    }

    /// Release the staging folder and the job's lock.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close();
    }
}

/// A job's lock in a dataset, held shared while this object is open (a
/// job's driver holds one per dataset its tasks write to).
#[pyclass(name = "JobHold", module = "zring._zring")]
pub struct PyJobHold {
    inner: Mutex<Option<JobHold>>,
}

#[pymethods]
impl PyJobHold {
    #[new]
    fn new(py: Python<'_>, dataset: std::path::PathBuf, job: String) -> PyResult<Self> {
        let h = py.detach(|| JobHold::hold(&dataset, &job)).map_err(error::engine)?;
        Ok(PyJobHold { inner: Mutex::new(Some(h)) })
    }

    /// Release the lock.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// One dataset's commit as Python gives it: the dataset, its staged parts
/// as `(name, records, content)`, and whether it overwrites.
type CommitArgs = (std::path::PathBuf, Vec<(String, u64, String)>, bool);

/// Commit staged parts to one or several datasets (the columns of one
/// table): `requests` is a list of `(dataset, [(name, records, content)],
/// overwrite)`; all are checked before any is applied. Returns a list of
/// `(generation, warnings)`, one per request. `job` is the committing
/// job (its staged leftovers are removed), `older_than` the age in seconds
/// at which staged parts of no job are removed (None: never), `keep_staged`
/// removes nothing staged.
#[pyfunction]
#[pyo3(signature = (requests, job = None, older_than = None, keep_staged = false))]
pub fn commit_parts(
    py: Python<'_>,
    requests: Vec<CommitArgs>,
    job: Option<String>,
    older_than: Option<f64>,
    keep_staged: bool,
) -> PyResult<Vec<(u64, Vec<String>)>> {
    let reqs: Vec<CommitRequest> = requests
        .into_iter()
        .map(|(root, parts, overwrite)| CommitRequest {
            root,
            parts: parts.into_iter().map(|(name, records, content)| Staged { name, records, content }).collect(),
            mode: if overwrite { Mode::Overwrite } else { Mode::Append },
        })
        .collect();
    let opts = Options {
        job,
        remove_older_than: older_than.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))),
        keep_staged,
    };
    let done = py.detach(|| commit(&reqs, &opts)).map_err(error::engine)?;
    Ok(done.into_iter().map(|c| (c.generation, c.warnings)).collect())
}

/// Remove what job `job` staged in the dataset at `dataset` (a job that
/// gives up); nothing committed is touched.
#[pyfunction]
pub fn abandon_job(py: Python<'_>, dataset: std::path::PathBuf, job: String) -> PyResult<()> {
    py.detach(|| abandon(&dataset, &job)).map_err(error::engine)
}

/// The parts the manifest of the dataset at `path` lists, in order, as
/// `(dir, records, content)`; the manifest's checksum is checked, the parts
/// are not opened.
#[pyfunction]
pub fn manifest_parts(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Vec<(String, u64, String)>> {
    let m = py.detach(|| zring_engine::parts::read_manifest(&path)).map_err(error::engine)?;
    Ok(m.parts.into_iter().map(|p| (p.dir, p.records, p.content)).collect())
}

/// The schema the manifest of the dataset at `path` records for its parts
/// (JSON without the codec), or None.
#[pyfunction]
pub fn manifest_schema(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<String>> {
    let m = py.detach(|| zring_engine::parts::read_manifest(&path)).map_err(error::engine)?;
    Ok((!m.schema.is_null()).then(|| m.schema.to_string()))
}

/// A part as [`rank_plan`] lists it: directory, records, rank, decoded bytes.
type PlannedPart = (String, u64, u32, Option<u64>);

/// Which rank reads each committed part of the dataset at `path` when
/// `ranks` ranks each read only their own (`zring_engine::parts::assign_ranks`):
/// a list of `(dir, records, rank, decoded bytes or None)` in manifest
/// order. Reads the manifest only.
#[pyfunction]
pub fn rank_plan(py: Python<'_>, path: std::path::PathBuf, ranks: u32) -> PyResult<Vec<PlannedPart>> {
    if ranks == 0 {
        return Err(PyValueError::new_err("ranks must be at least 1"));
    }
    let m = py.detach(|| zring_engine::parts::read_manifest(&path)).map_err(error::engine)?;
    let owner = zring_engine::parts::assign_ranks(&zring_engine::parts::placement_weights(&m), ranks);
    Ok(m.parts.into_iter().zip(owner).map(|(p, r)| (p.dir, p.records, r, p.bytes)).collect())
}
