//! `Sampler`: the index stream of the loader, usable on its own.

use numpy::PyArray1;
use pyo3::prelude::*;
use zring_sampler::{Blocks, Mode, Sampler, SamplerState};

use crate::convert::{from_json, to_py};
use crate::error;

/// Parses a mode number (0 sequential, 1 iid, 2 cyclic, 3 blocked).
pub fn mode(mode: u64) -> PyResult<Mode> {
    let m = u8::try_from(mode).unwrap_or(u8::MAX);
    Mode::from_u8(m).map_err(error::sampler)
}

/// A seekable stream of index batches (the Python class `Sampler`).
#[pyclass(name = "Sampler", module = "zring._zring")]
pub struct PySampler {
    inner: Sampler,
}

#[pymethods]
impl PySampler {
    /// Batches of `batch_size` indices over `[0, length)`; mode 0
    /// sequential, 1 iid (with replacement), 2 cyclic (without), 3 blocked
    /// (without, a window of `window_blocks` blocks of `block_records`
    /// consecutive indices at a time; 64 and 256 when left out).
    #[new]
    #[pyo3(signature = (length, batch_size, mode = 1, seed = 42, block_records = None, window_blocks = None))]
    fn new(
        length: u64,
        batch_size: u64,
        mode: u64,
        seed: u64,
        block_records: Option<u64>,
        window_blocks: Option<u64>,
    ) -> PyResult<Self> {
        let blocks = Blocks {
            block_records: block_records.unwrap_or(Blocks::DEFAULT.block_records),
            window_blocks: window_blocks.unwrap_or(Blocks::DEFAULT.window_blocks),
        };
        let inner =
            Sampler::with_blocks(self::mode(mode)?, length, batch_size, seed, Some(blocks)).map_err(error::sampler)?;
        Ok(PySampler { inner })
    }

    /// Rebuild a sampler from `state()` (JSON text).
    #[staticmethod]
    fn from_state_json(text: &str) -> PyResult<Self> {
        let state: SamplerState = from_json(text, "sampler state")?;
        let inner = Sampler::from_state(&state).map_err(error::sampler)?;
        Ok(PySampler { inner })
    }

    /// The batch of the current step as a uint64 array; advances one step.
    fn next<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        PyArray1::from_vec(py, self.inner.next_batch())
    }

    /// The batch of any step, without moving.
    fn batch<'py>(&self, py: Python<'py>, step: u64) -> Bound<'py, PyArray1<u64>> {
        PyArray1::from_vec(py, self.inner.batch(step))
    }

    /// Move to `step` (0-based); the next `next()` returns its batch.
    fn seek(&mut self, step: u64) {
        self.inner.seek(step);
    }

    /// The step whose batch `next()` returns next.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// Indices per batch: `min(batch_size, length)`.
    #[getter]
    fn batch_len(&self) -> usize {
        self.inner.batch_len()
    }

    /// The state as a dict (mode, seed, step, length, batch_size).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.state())
    }
}

/// Each source's rows among the first `rows` of a mixture of `weights` (as
/// given; normalised as the loader does) at `batch_size` rows per batch:
/// what `zring_sampler::Mixture::allocation` counts. With `schedule`, a list
/// of `(step, weights)` corners, the weights follow it; with `pieces`, the
/// JSON text of a saved state's `"schedule"` (taken as saved).
#[pyfunction]
#[pyo3(signature = (weights, batch_size, rows, *, schedule = None, pieces = None))]
pub fn mixture_allocation(
    weights: Vec<f64>,
    batch_size: u64,
    rows: u64,
    schedule: Option<Vec<(u64, Vec<f64>)>>,
    pieces: Option<&str>,
) -> PyResult<Vec<u64>> {
    use zring_sampler::{Mixture, SchedulePiece, SchedulePoint};
    let lengths = vec![1; weights.len()];
    let m = match (schedule, pieces) {
        (_, Some(text)) => {
            let pieces: Vec<SchedulePiece> = crate::convert::from_json(text, "schedule pieces")?;
            Mixture::scheduled(Mode::Iid, &lengths, pieces, batch_size, 0)
        }
        (Some(points), None) => {
            let points: Vec<SchedulePoint> =
                points.into_iter().map(|(step, weights)| SchedulePoint { step, weights }).collect();
            SchedulePiece::new(0, lengths.len(), &points)
                .and_then(|p| Mixture::scheduled(Mode::Iid, &lengths, vec![p], batch_size, 0))
        }
        (None, None) => Mixture::new(Mode::Iid, &lengths, &weights, batch_size, 0),
    }
    .map_err(error::sampler)?;
    let mut out = vec![0; weights.len()];
    m.allocation(rows, &mut out).map_err(error::sampler)?;
    Ok(out)
}
