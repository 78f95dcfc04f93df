//! `Loader`: the Rust step pipeline behind `zring.DataLoader`.
//!
//! The Python `DataLoader` builds one `Loader` from its streams and calls
//! `next()` on the consumer thread. Gather threads run entirely in Rust; the
//! GIL is released while `next()` waits. Each batch buffer is handed to NumPy
//! without a copy: a `BatchBuffer` object owns the pooled buffer and is the
//! array's base object, so the buffer returns to the loader's pool when the
//! last NumPy view of it is gone.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use numpy::ndarray::ArrayViewMut1;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use zring_loader::{
    Loader, LoaderConfig, LoaderState, MixSource, Pack, PackMode, PackSource, PartsSource, PooledBuf, SchedulePoint,
    Shard, Source, StoreSource, Stream, Subset, TokenType,
};

/// The `pack=` argument of `Loader(...)` (its docs).
type PackSpec = (u64, String, u64, u64, bool, bool, bool, Option<u64>, Option<u64>, Vec<(u64, bool, String)>);

use crate::convert::{from_json, to_py};
use crate::error;
use crate::sampler::mode;
use crate::store::extract_store;

/// Owner of one pooled batch buffer while NumPy arrays view it (the Python
/// class `BatchBuffer`; it has no methods of its own).
#[pyclass(name = "BatchBuffer", module = "zring._zring", frozen)]
pub struct PyBatchBuffer {
    /// Never read or written through this field after construction: NumPy
    /// owns all access via the pointer taken in [`lend`]. It is kept only so
    /// that dropping this object returns the buffer to the pool.
    _buf: PooledBuf,
}

/// Wraps `buf` as a writable 1-D uint8 NumPy array without copying.
fn lend(py: Python<'_>, mut buf: PooledBuf) -> PyResult<Bound<'_, PyArray1<u8>>> {
    let len = buf.len();
    let ptr = buf.as_mut_slice().as_mut_ptr();
    // Moving `buf` into the Python object moves the `Vec` header only; its
    // heap block (where `ptr` points) stays where it is.
    let owner = Bound::new(py, PyBatchBuffer { _buf: buf })?;
    // SAFETY: `ptr` points at `len` initialised bytes of the heap block that
    // `owner` now owns, and the pointer was derived from a unique `&mut`
    // borrow, so writes through it are allowed. Nothing else reads or
    // writes that block: `PyBatchBuffer` exposes no access to `_buf`, and
    // the pool only gets the block back when `owner` is dropped.
    let view = unsafe { ArrayViewMut1::from_shape_ptr(len, ptr) };
    // SAFETY: `borrow_from_array` requires that `container` keep the data
    // valid and unmoved for as long as the NumPy array exists. The array
    // holds a strong reference to `owner` as its base object, `owner` owns
    // the heap block and never reallocates it (it is never mutated after
    // construction), and the block is released (returned to the pool) only
    // in `owner`'s drop, which cannot run while the array (or any view of
    // it, which references the array or `owner`) is alive.
    Ok(unsafe { PyArray1::borrow_from_array(&view, owner.into_any()) })
}

/// The streams of a list of `(name, Store, record_bytes)` tuples; `what`
/// prefixes error messages ("source 3 ").
fn stream_list(streams: &Bound<'_, PyList>, what: &str) -> PyResult<Vec<Stream>> {
    let mut list = Vec::with_capacity(streams.len());
    for item in streams.iter() {
        let tuple = item
            .cast::<PyTuple>()
            .map_err(|_| PyTypeError::new_err("each stream must be a (name, Store, record_bytes) tuple"))?;
        let name: String = tuple.get_item(0)?.extract()?;
        let handle = tuple.get_item(1)?;
        let record_bytes: Option<usize> = tuple.get_item(2)?.extract()?;
        // A split (zring.split): `(records, key)`, the store's records it
        // holds in increasing order and the hash of its definition.
        let subset: Option<(PyReadonlyArray1<'_, u64>, u64)> =
            if tuple.len() > 3 { tuple.get_item(3)?.extract()? } else { None };
        // A dataset of parts reads as one source over all its parts.
        let source: Arc<dyn Source> = if let Ok(parts) = handle.cast::<crate::parts::PyParts>() {
            let parts = parts.get().parts()?;
            match record_bytes {
                Some(record_bytes) => Arc::new(PartsSource::fixed(parts, record_bytes)),
                None => Arc::new(PartsSource::ragged(parts)),
            }
        } else {
            let store = extract_store(&handle, &format!("{what}stream {name:?}"))?;
            match record_bytes {
                Some(record_bytes) => Arc::new(StoreSource::fixed(store, record_bytes)),
                None => Arc::new(StoreSource::ragged(store)),
            }
        };
        let source = match subset {
            None => source,
            Some((records, key)) => {
                let map = records.as_slice().map(<[u64]>::to_vec).unwrap_or_else(|_| records.as_array().to_vec());
                Arc::new(
                    Subset::new(source, map, key)
                        .map_err(|e| PyValueError::new_err(format!("{what}stream {name:?}: {e}")))?,
                )
            }
        };
        list.push(Stream::new(name, source));
    }
    Ok(list)
}

/// How long `next()` waits without the GIL before it looks for signals:
/// Ctrl-C reaches a consumer blocked on a slow step within this much (plus
/// the time to take the GIL back).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The step pipeline (the Python class `Loader`).
#[pyclass(name = "Loader", module = "zring._zring", frozen)]
pub struct PyLoader {
    /// `None` once closed. Taken only without the GIL, and by `next()` for
    /// one [`SIGNAL_POLL`] slice of its wait at a time, so another thread's
    /// `state()`, `stats()` or `close()` waits at most one slice.
    inner: Mutex<Option<Loader>>,
    /// The process that started the gather threads. A forked child has a
    /// copy of this object but none of the threads.
    pid: u32,
}

impl PyLoader {
    /// Raises in a forked child: its copy of the loader has no threads, so
    /// `next()` would wait forever.
    fn check_pid(&self) -> PyResult<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(PyRuntimeError::new_err(format!(
                "this DataLoader was created in process {} and its gather threads do not survive fork; \
                 create a new DataLoader in process {now}",
                self.pid
            )));
        }
        Ok(())
    }

    /// Forgets the loader without joining its threads when running in a
    /// forked child, where those threads do not exist; the parent still owns
    /// the real ones. Returns the loader only in the process that made it.
    fn take(&self) -> Option<Loader> {
        if std::process::id() == self.pid {
            return self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
        // In a child the mutex may have been held by a parent thread at the
        // moment of fork (a `next()` in progress) and will never be released:
        // only try it, and leak the loader either way.
        if let Ok(mut guard) = self.inner.try_lock() {
            if let Some(loader) = guard.take() {
                std::mem::forget(loader);
            }
        }
        None
    }

    fn with<T>(&self, f: impl FnOnce(&mut Loader) -> T) -> PyResult<T> {
        self.check_pid()?;
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let loader = guard.as_mut().ok_or_else(|| PyValueError::new_err("the loader is closed"))?;
        Ok(f(loader))
    }
}

#[pymethods]
impl PyLoader {
    /// Build a loader over `streams`, a list of `(name, Store, record_bytes)`
    /// where `record_bytes` is the size of every record (fixed layout) or
    /// None (ragged). With `weights`, a mixture: `streams` is then a list of
    /// such lists, one per source, and `weights` one number per source.
    /// `state` is the JSON text of a saved `state()`; when given it sets
    /// batch size, mode, seed, start step (and shard, unless `shard` is
    /// given), and a `batch_size`, `mode` or `seed` given with it must
    /// equal the state's. Without a state, `batch_size` is required and
    /// `mode` and `seed` default to 1 and 42.
    ///
    /// With `pack=(seq_len, "concat" | "first_fit", pad_bits, token_bytes,
    /// signed, labels, mask_boundaries, eod_bits, bos_bits, stored)`, a
    /// loader of packed token rows: each source is one ragged stream of
    /// token documents (a list of one tuple; a list of such lists with
    /// `weights`), and batches have the fixed columns `tokens`,
    /// `segment_ids` and `positions` (then `labels` and `loss_mask` with
    /// `labels`). `stored` is each source's `(token_bytes, signed, name)`; the
    /// `*_bits` are tokens as the bits of one delivered little-endian token.
    ///
    /// `block_records` and `window_blocks` set mode 3's block shape (each
    /// left out is chosen from the first stream: a block of at least 1 MiB
    /// of records, a window of a quarter of its record cache); a state
    /// fixes them (given with it, they must be the state's).
    ///
    /// `schedule`, with `weights`: the mixture's weights over the steps, a
    /// list of `(step, weights)` points (`zring_sampler::SchedulePiece`;
    /// `weights` then only count the sources). With a state saved under
    /// other weights, the run follows these from the state's step on.
    #[new]
    #[pyo3(signature = (streams, *, batch_size = None, mode = None, seed = None, shard = None, depth = 4, threads = 4, state = None, weights = None, pack = None, block_records = None, window_blocks = None, schedule = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        streams: &Bound<'_, PyList>,
        batch_size: Option<u64>,
        mode: Option<u64>,
        seed: Option<u64>,
        shard: Option<(u32, u32)>,
        depth: usize,
        threads: usize,
        state: Option<&str>,
        weights: Option<Vec<f64>>,
        pack: Option<PackSpec>,
        block_records: Option<u64>,
        window_blocks: Option<u64>,
        schedule: Option<Vec<(u64, Vec<f64>)>>,
    ) -> PyResult<Self> {
        if block_records == Some(0) || window_blocks == Some(0) {
            let what = if block_records == Some(0) { "block_records" } else { "window_blocks" };
            return Err(PyValueError::new_err(format!("{what} must be at least 1, got 0")));
        }
        let sources = match &weights {
            None => vec![stream_list(streams, "")?],
            Some(weights) => {
                if weights.len() != streams.len() {
                    return Err(PyValueError::new_err(format!(
                        "{} weights for {} sources",
                        weights.len(),
                        streams.len()
                    )));
                }
                let mut sources = Vec::with_capacity(streams.len());
                for (k, item) in streams.iter().enumerate() {
                    let list = item
                        .cast::<PyList>()
                        .map_err(|_| PyTypeError::new_err("each source must be a list of streams"))?;
                    sources.push(stream_list(list, &format!("source {k} "))?);
                }
                sources
            }
        };
        let mode = mode.map(self::mode).transpose()?;
        let mut config = match state {
            Some(text) => {
                let saved: LoaderState = from_json(text, "loader state")?;
                let sampler = &saved.sampler;
                let conflict = |what: &str, given: String, saved: String| {
                    PyValueError::new_err(format!(
                        "{what}={given} conflicts with the state, which was saved with {what}={saved}; a state fixes \
                         batch_size, mode, seed and mode 3's block_records and window_blocks: leave {what} out \
                         (or pass the state's value)"
                    ))
                };
                if let Some(b) = batch_size.filter(|&b| b != sampler.batch_size) {
                    return Err(conflict("batch_size", b.to_string(), sampler.batch_size.to_string()));
                }
                if let Some(m) = mode.filter(|&m| m != sampler.mode) {
                    let show = |m: zring_loader::Mode| format!("{} ({m:?})", m as u8);
                    return Err(conflict("mode", show(m), show(sampler.mode)));
                }
                if let Some(s) = seed.filter(|&s| s != sampler.seed) {
                    return Err(conflict("seed", s.to_string(), sampler.seed.to_string()));
                }
                // The state fixes mode 3's block shape too: a field given
                // with the state's value is accepted, another is refused.
                let shape = |given: Option<u64>, what: &str, saved: Option<u64>| match (given, saved) {
                    (Some(g), Some(s)) if g != s => Err(conflict(what, g.to_string(), s.to_string())),
                    (Some(g), None) => Err(PyValueError::new_err(format!(
                        "{what}={g} conflicts with the state, which was saved by a loader of mode {} without \
                         blocks; {what} applies to mode 3 only: leave it out",
                        sampler.mode as u8
                    ))),
                    _ => Ok(()),
                };
                shape(block_records, "block_records", sampler.blocks.map(|b| b.block_records))?;
                shape(window_blocks, "window_blocks", sampler.blocks.map(|b| b.window_blocks))?;
                LoaderConfig::from_state(&saved)
            }
            None => {
                let batch_size =
                    batch_size.ok_or_else(|| PyTypeError::new_err("batch_size is required without state"))?;
                let mut c = LoaderConfig::new(batch_size);
                c.mode = mode.unwrap_or(zring_loader::Mode::Iid);
                c.seed = seed.unwrap_or(42);
                c
            }
        };
        if state.is_none() && (block_records.is_some() || window_blocks.is_some()) {
            // A 0 asks the loader to choose that field.
            config.blocks = Some(zring_loader::Blocks {
                block_records: block_records.unwrap_or(0),
                window_blocks: window_blocks.unwrap_or(0),
                // 0: the loader's shard count.
                shards: 0,
            });
        }
        if let Some((index, count)) = shard {
            config.shard = Shard::new(index, count).map_err(error::sampler)?;
        }
        config.depth = depth;
        config.threads = threads;
        config.schedule =
            schedule.map(|points| points.into_iter().map(|(step, weights)| SchedulePoint { step, weights }).collect());
        if let Some((seq_len, how, pad_id, token_bytes, signed, labels, mask_boundaries, eod_id, bos_id, stored)) = pack
        {
            let mode = match how.as_str() {
                "concat" => PackMode::Concat,
                "first_fit" => PackMode::FirstFit,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "pack mode must be \"concat\" or \"first_fit\", got {other:?}"
                    )))
                }
            };
            let pack = Pack {
                signed,
                labels,
                mask_boundaries,
                eod_id,
                bos_id,
                ..Pack::new(seq_len, mode, pad_id, token_bytes)
            };
            if stored.len() != sources.len() {
                return Err(PyValueError::new_err(format!(
                    "{} token types for {} packed sources",
                    stored.len(),
                    sources.len()
                )));
            }
            let mut docs: Vec<PackSource> = Vec::with_capacity(sources.len());
            let given = weights.clone().unwrap_or_else(|| vec![1.0]);
            for (k, ((weight, streams), (bytes, signed, name))) in
                given.into_iter().zip(sources).zip(stored).enumerate()
            {
                let [stream] = <[Stream; 1]>::try_from(streams).map_err(|s| {
                    PyValueError::new_err(format!("packed source {k} must be one stream of documents, got {}", s.len()))
                })?;
                let tokens = TokenType { bytes, signed };
                docs.push(PackSource { weight, source: stream.source, tokens, name: Some(name) });
            }
            let mixture = weights.is_some();
            let loader = py.detach(|| Loader::new_packed_typed(docs, mixture, pack, config)).map_err(error::loader)?;
            return Ok(PyLoader { inner: Mutex::new(Some(loader)), pid: std::process::id() });
        }
        let loader = match weights {
            None => {
                let list = sources.into_iter().next().unwrap_or_default();
                py.detach(|| Loader::new(list, config))
            }
            Some(weights) => {
                let sources = weights.into_iter().zip(sources).map(|(w, s)| MixSource::new(w, s)).collect();
                py.detach(|| Loader::new_mixture(sources, config))
            }
        }
        .map_err(error::loader)?;
        Ok(PyLoader { inner: Mutex::new(Some(loader)), pid: std::process::id() })
    }

    /// Wait for the next step. Returns `(step, indices, columns, sources)`
    /// where `columns` is a list of `(name, data, offsets)`: `data` a uint8
    /// array viewing the pooled buffer, `offsets` the `len + 1` byte
    /// boundaries of a ragged column (uint64 array) or None; `sources` each
    /// row's source (uint32 array) for a mixture, else None.
    ///
    /// The wait runs without the GIL in slices of [`SIGNAL_POLL`]; between
    /// slices the lock is let go (so `state()`, `stats()` and `close()` from
    /// other threads get in) and, with the GIL, pending signals are handled:
    /// Ctrl-C raises `KeyboardInterrupt` here, and the step stays next.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let batch = loop {
            match py.detach(|| self.with(|l| l.next_timeout(SIGNAL_POLL)))?.map_err(error::loader)? {
                Some(batch) => break batch,
                None => py.check_signals()?,
            }
        };
        let step = batch.step;
        let indices = PyArray1::from_slice(py, &batch.indices);
        let sources = match &batch.sources {
            Some(s) => PyArray1::from_slice(py, s).into_any(),
            None => py.None().into_bound(py),
        };
        let columns = PyList::empty(py);
        for column in batch.into_columns() {
            let (name, data, offsets) = column.into_parts();
            let data = lend(py, data)?;
            let offsets = match offsets {
                Some(o) => PyArray1::from_slice(py, &o).into_any(),
                None => py.None().into_bound(py),
            };
            columns.append((&*name, data, offsets))?;
        }
        PyTuple::new(py, [step.into_pyobject(py)?.into_any(), indices.into_any(), columns.into_any(), sources])
    }

    /// The state to resume from, as a dict; its step is the next one `next()`
    /// would return.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = py.detach(|| self.with(|l| l.state()))?;
        to_py(py, &state)
    }

    /// The state that resumes at `step` (delivered or not), as a dict: what
    /// `state()` returns once `step` is next.
    fn state_at<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyAny>> {
        let state = py.detach(|| self.with(|l| l.state_at(step)))?;
        to_py(py, &state)
    }

    /// Per source, the records delivered in the cycle under way before
    /// `step` (documents begun, for packed rows) and the cycle's records
    /// (`zring_loader::Loader::delivered_in_cycle`).
    fn delivered_in_cycle<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Vec<(Bound<'py, PyArray1<u64>>, u64)>> {
        let got = py.detach(|| self.with(|l| l.delivered_in_cycle(step)))?.map_err(error::loader)?;
        Ok(got.into_iter().map(|(d, n)| (PyArray1::from_vec(py, d), n)).collect())
    }

    /// The records per batch this loader delivers.
    fn batch_len(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.with(|l| l.batch_len()))
    }

    /// Pipeline statistics (wait and gather percentiles, counters) as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = py.detach(|| self.with(|l| l.stats()))?;
        to_py(py, &stats)
    }

    /// Stop the gather threads and release the streams. Safe to call twice.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(mut loader) = py.detach(|| self.take()) {
            py.detach(|| loader.close()).map_err(error::loader)?;
        }
        Ok(())
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        if std::process::id() != self.pid {
            return true;
        }
        py.detach(|| self.inner.lock().unwrap_or_else(PoisonError::into_inner).is_none())
    }
}

impl Drop for PyLoader {
    fn drop(&mut self) {
        // In the process that made it, dropping the loader stops and joins its
        // threads (without the GIL, so other Python threads run meanwhile);
        // in a forked child `take` forgets it instead.
        if let Some(loader) = self.take() {
            Python::attach(|py| py.detach(move || drop(loader)));
        }
    }
}
