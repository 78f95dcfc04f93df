//! `Store`: the engine's record store, one Python object per open store.
//!
//! Every method converts its arguments, releases the GIL around the engine
//! call, and converts the result back; the engine does the work. Index and
//! offset arrays are copied into Rust vectors before the GIL is released
//! (they are small), so no Python thread can change them mid-call.

use std::sync::{Arc, Mutex, PoisonError};

use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use zring_engine::Store;

use crate::convert::{codec_name, to_py};
use crate::error;

/// An open record store (the Python class `zring._zring.Store`).
#[pyclass(name = "Store", module = "zring._zring", frozen)]
pub struct PyStore {
    /// `None` once closed. Calls clone the `Arc` and release the mutex before
    /// touching the disk, so `close()` never waits for (or frees under) a
    /// running gather: the store is dropped when the last call finishes.
    inner: Mutex<Option<Arc<Store>>>,
    path: String,
    writable: bool,
}

fn slice_u64<'a>(a: &'a PyReadonlyArray1<'_, u64>, name: &str) -> PyResult<&'a [u64]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{name} must be a contiguous uint64 array")))
}

impl PyStore {
    /// The engine store, shared; raises ValueError once closed.
    pub fn store(&self) -> PyResult<Arc<Store>> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| PyValueError::new_err(format!("store {:?} is closed", self.path)))
    }
}

#[pymethods]
impl PyStore {
    /// Open the store at `path`.
    ///
    /// mode "r" opens read-only (zring or loaderx format), "a" takes the
    /// single-writer lock and creates the store if missing, "x" creates a
    /// new store and fails if one exists. `codec` is the default codec of
    /// appends, `level` the zstd level, `chunk_bytes` the chunk file size,
    /// `cache_bytes` the memory budget of the read policy (default: detected).
    /// `sealable` lays appended records out for `seal()` (chunks start only
    /// every 340 records; meant for a store written once).
    #[new]
    #[pyo3(signature = (path, mode = "r", *, codec = None, level = None, chunk_bytes = None, cache_bytes = None, sealable = false))]
    #[allow(clippy::too_many_arguments, reason = "one argument per keyword of the Python constructor")]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        mode: &str,
        codec: Option<&str>,
        level: Option<i32>,
        chunk_bytes: Option<u64>,
        cache_bytes: Option<u64>,
        sealable: bool,
    ) -> PyResult<Self> {
        let mut builder = Store::builder(&path).sealable(sealable);
        if let Some(c) = codec_name(codec)? {
            builder = builder.codec(c);
        }
        if let Some(l) = level {
            builder = builder.level(l);
        }
        if let Some(b) = chunk_bytes {
            builder = builder.chunk_bytes(b);
        }
        if let Some(b) = cache_bytes {
            builder = builder.cache_bytes(b);
        }
        let (store, writable) = match mode {
            "r" => (py.detach(|| builder.open()), false),
            "a" => (py.detach(|| builder.open_writable()), true),
            "x" => (py.detach(|| builder.create()), true),
            other => {
                return Err(PyValueError::new_err(format!(
                    "mode {other:?} is not a store mode: use \"r\" (read), \"a\" (append, create if missing) or \"x\" (create new)"
                )))
            }
        };
        Ok(PyStore {
            inner: Mutex::new(Some(Arc::new(store.map_err(error::engine)?))),
            path: path.display().to_string(),
            writable,
        })
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Whether this handle holds the writer lock.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    fn __len__(&self) -> PyResult<usize> {
        let len = self.store()?.len();
        usize::try_from(len).map_err(|_| PyValueError::new_err("store length exceeds usize"))
    }

    /// The logical byte length of each record in `idx` (uint64 array).
    fn lengths<'py>(&self, py: Python<'py>, idx: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let store = self.store()?;
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let mut out = vec![0u64; idx.len()];
        py.detach(|| store.lengths(&idx, &mut out)).map_err(error::engine)?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// Decode records `idx` into the uint8 array `dst`, record `i` at byte
    /// `i * stride`. A record shorter than `stride` leaves the rest of its slot zeroed.
    fn gather(
        &self,
        py: Python<'_>,
        idx: PyReadonlyArray1<'_, u64>,
        mut dst: PyReadwriteArray1<'_, u8>,
        stride: usize,
    ) -> PyResult<()> {
        let store = self.store()?;
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let dst = dst.as_slice_mut().map_err(|_| PyValueError::new_err("dst must be a contiguous uint8 array"))?;
        let need = idx.len().checked_mul(stride);
        if need.is_none_or(|n| n > dst.len()) {
            return Err(PyValueError::new_err(format!(
                "dst holds {} bytes but {} records of stride {stride} need {}",
                dst.len(),
                idx.len(),
                idx.len() as u128 * stride as u128
            )));
        }
        // loaderx accepts a destination larger than the batch; the rest is left untouched.
        let dst = &mut dst[..idx.len() * stride];
        py.detach(|| store.gather(&zring_engine::Gather::fixed(&idx, stride), dst)).map_err(error::engine)
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
        let store = self.store()?;
        let idx = slice_u64(&idx, "idx")?.to_vec();
        let offsets = slice_u64(&offsets, "offsets")?.to_vec();
        if offsets.len() != idx.len() {
            return Err(PyValueError::new_err(format!(
                "offsets has {} entries but idx has {}; give one offset per index",
                offsets.len(),
                idx.len()
            )));
        }
        let dst = dst.as_slice_mut().map_err(|_| PyValueError::new_err("dst must be a contiguous uint8 array"))?;
        py.detach(|| store.gather(&zring_engine::Gather::ragged(&idx, &offsets), dst)).map_err(error::engine)
    }

    /// Append records: record `i` is `src[offsets[i] : offsets[i] + lens[i]]`.
    /// Returns the index of the first new record.
    #[pyo3(signature = (src, offsets, lens, codec = None))]
    fn append(
        &self,
        py: Python<'_>,
        src: PyReadonlyArray1<'_, u8>,
        offsets: PyReadonlyArray1<'_, u64>,
        lens: PyReadonlyArray1<'_, u64>,
        codec: Option<&str>,
    ) -> PyResult<u64> {
        let store = self.store()?;
        let codec = codec_name(codec)?;
        let src = src.as_slice().map_err(|_| PyValueError::new_err("src must be a contiguous uint8 array"))?;
        let offsets = slice_u64(&offsets, "offsets")?;
        let lens = slice_u64(&lens, "lens")?;
        if offsets.len() != lens.len() {
            return Err(PyValueError::new_err(format!(
                "offsets has {} entries but lens has {}",
                offsets.len(),
                lens.len()
            )));
        }
        let mut records = Vec::with_capacity(lens.len());
        for (i, (&off, &len)) in offsets.iter().zip(lens).enumerate() {
            let range = usize::try_from(off)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(o, l)| Some(o..o.checked_add(l)?))
                .and_then(|r| src.get(r));
            match range {
                Some(bytes) => records.push(bytes),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "record {i} spans bytes {off}..{} but src holds {} bytes",
                        off as u128 + len as u128,
                        src.len()
                    )))
                }
            }
        }
        py.detach(|| store.append(&records, codec)).map_err(error::engine)
    }

    /// Append `len(src) / item_len` records of `item_len` bytes each.
    /// Returns the index of the first new record.
    #[pyo3(signature = (src, item_len, codec = None))]
    fn append_fixed(
        &self,
        py: Python<'_>,
        src: PyReadonlyArray1<'_, u8>,
        item_len: usize,
        codec: Option<&str>,
    ) -> PyResult<u64> {
        let store = self.store()?;
        let codec = codec_name(codec)?;
        let src = src.as_slice().map_err(|_| PyValueError::new_err("src must be a contiguous uint8 array"))?;
        if item_len == 0 && !src.is_empty() {
            return Err(PyValueError::new_err("item_len is 0 but src is not empty"));
        }
        if item_len != 0 && src.len() % item_len != 0 {
            return Err(PyValueError::new_err(format!(
                "src holds {} bytes, not a multiple of item_len {item_len}",
                src.len()
            )));
        }
        py.detach(|| store.append_fixed(src, item_len, codec)).map_err(error::engine)
    }

    /// Make appended records and the record table durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store()?;
        py.detach(|| store.sync()).map_err(error::engine)
    }

    /// Delete records; the tail moves into each hole so indices stay dense.
    fn delete(&self, py: Python<'_>, idx: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        let store = self.store()?;
        let idx = slice_u64(&idx, "idx")?.to_vec();
        py.detach(|| store.delete(&idx)).map_err(error::engine)
    }

    /// Give a store written once a format-2 table without copying records;
    /// returns the report dict (`format_after` 1 when its records do not lie
    /// as a sealed table needs, or it was format 2 already).
    fn seal<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        let report = py.detach(|| store.seal()).map_err(error::engine)?;
        to_py(py, &report)
    }

    /// Rewrite live records to reclaim deleted space; returns the report dict.
    #[pyo3(signature = (format=None))]
    fn compact<'py>(&self, py: Python<'py>, format: Option<u32>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        let report = py
            .detach(|| match format {
                None => store.compact(),
                Some(f) => store.compact_to(f),
            })
            .map_err(error::engine)?;
        to_py(py, &report)
    }

    /// The read policy in force and the reads since open, as a dict (policy,
    /// policy_reason, budget_bytes, cache_hits, page_cache_hits, hit_rate,
    /// bytes_read, bytes_from_cache, ...). Cheap: no table scan.
    fn read_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        to_py(py, &store.read_stats())
    }

    /// What a checkpoint records of the store, as a dict: `records` and
    /// `content`, a 32-bit checksum over every record's stored checksum and
    /// length in index order. O(1) for a store whose head carries it.
    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        let fp = py.detach(|| store.fingerprint()).map_err(error::engine)?;
        to_py(py, &fp)
    }

    /// Storage usage as a dict (records, live_bytes, chunk_bytes, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        let stats = py.detach(|| store.stats()).map_err(error::engine)?;
        to_py(py, &stats)
    }

    /// Read and check every record; returns the report dict or raises
    /// CorruptError / ChecksumError.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.store()?;
        let report = py.detach(|| store.verify()).map_err(error::engine)?;
        to_py(py, &report)
    }

    /// Train and install a zstd dictionary from samples (concatenated in
    /// `samples`, lengths in `sizes`); returns its size in bytes.
    fn train_dict(
        &self,
        py: Python<'_>,
        samples: PyReadonlyArray1<'_, u8>,
        sizes: PyReadonlyArray1<'_, u64>,
        max_size: usize,
    ) -> PyResult<usize> {
        let store = self.store()?;
        let buf = samples.as_slice().map_err(|_| PyValueError::new_err("samples must be a contiguous uint8 array"))?;
        let sizes = slice_u64(&sizes, "sizes")?;
        let mut parts = Vec::with_capacity(sizes.len());
        let mut at = 0usize;
        for &s in sizes {
            let end = usize::try_from(s).ok().and_then(|s| at.checked_add(s)).filter(|&e| e <= buf.len()).ok_or_else(
                || PyValueError::new_err(format!("sizes add up to more than the {} bytes in samples", buf.len())),
            )?;
            parts.push(&buf[at..end]);
            at = end;
        }
        py.detach(|| store.train_dict(&parts, max_size)).map_err(error::engine)
    }

    /// Whether the store has a zstd dictionary.
    fn has_dict(&self) -> PyResult<bool> {
        Ok(self.store()?.has_dict())
    }

    /// The dataset schema (schema.json text), or None for a raw store.
    fn schema(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let store = self.store()?;
        py.detach(|| store.schema()).map_err(error::engine)
    }

    /// Store the dataset schema (schema.json text).
    fn set_schema(&self, py: Python<'_>, text: &str) -> PyResult<()> {
        let store = self.store()?;
        let text = text.to_owned();
        py.detach(|| store.set_schema(&text)).map_err(error::engine)
    }

    /// The bytes of names.intent (a delete's record for the record names), or None.
    fn names_intent<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let store = self.store()?;
        let got = py.detach(|| store.names_intent()).map_err(error::engine)?;
        Ok(got.map(|b| pyo3::types::PyBytes::new(py, &b)))
    }

    /// Write names.intent atomically, or remove it durably (None).
    #[pyo3(signature = (data))]
    fn set_names_intent(&self, py: Python<'_>, data: Option<Vec<u8>>) -> PyResult<()> {
        let store = self.store()?;
        py.detach(|| store.set_names_intent(data.as_deref())).map_err(error::engine)
    }

    /// Release this handle; the store closes once running calls finish.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(store) = taken {
            // Only the last holder closes (flushes, unlocks); a loader may
            // still share this store and keeps it open until it is dropped.
            if Arc::strong_count(&store) == 1 {
                py.detach(|| store.close()).map_err(error::engine)?;
            }
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        let state = match self.store() {
            Ok(s) => format!("{} records", s.len()),
            Err(_) => "closed".to_owned(),
        };
        format!("Store({:?}, {}, {state})", self.path, if self.writable { "writable" } else { "read-only" })
    }
}

/// Extracts the shared store of a `Store` argument, with a TypeError naming
/// `what` when the object is something else.
pub fn extract_store(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Arc<Store>> {
    let cell = obj.cast::<PyStore>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a zring Store, got {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    cell.get().store()
}
