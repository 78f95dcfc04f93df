//! In-memory sources and a deadlock guard shared by the loader's tests.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use zring_loader::{Batch, Layout, Loader, Request, Slots, Source, SourceError, Stream};

/// How long a pipeline test may take before it counts as deadlocked. Far
/// above what any of them needs, so a loaded machine does not fail them.
pub const DEADLOCK: Duration = Duration::from_secs(10);

/// Runs `f` on its own thread and fails the test if it does not finish within
/// `limit`, so a deadlocked pipeline fails fast instead of hanging the suite.
pub fn with_timeout<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(panic::catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(payload)) => panic::resume_unwind(payload),
        Err(_) => panic!("did not finish within {limit:?}: the pipeline is stuck"),
    }
}

/// Byte `j` of fixed-size record `i`: differs between records and positions.
pub fn fixed_byte(i: u64, j: usize) -> u8 {
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (j as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 56) as u8 ^ (i as u8) ^ (j as u8)
}

/// The content of fixed-size record `i`.
pub fn fixed_record(i: u64, record_bytes: usize) -> Vec<u8> {
    (0..record_bytes).map(|j| fixed_byte(i, j)).collect()
}

/// The content of ragged record `i`: `i % 13` bytes (some records are empty).
pub fn ragged_record(i: u64) -> Vec<u8> {
    (0..(i % 13) as usize).map(|j| fixed_byte(i, j + 1000)).collect()
}

/// What a [`MemSource`] does besides answering.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Return an error when asked for this record.
    pub fail_on: Option<u64>,
    /// Panic when asked for this record.
    pub panic_on: Option<u64>,
    /// Sleep up to this many microseconds per gather (varying with the
    /// indices), so steps finish out of order on several threads.
    pub jitter_us: u64,
}

/// Records computed from their index, fixed-size or ragged: record `i` is
/// the common test record of `base + i` (sources with different bases hold
/// different records).
#[derive(Debug)]
pub struct MemSource {
    pub len: u64,
    pub layout: Layout,
    pub faults: Faults,
    pub base: u64,
}

impl MemSource {
    pub fn fixed(len: u64, record_bytes: usize) -> Arc<Self> {
        Self::with_faults(len, Layout::Fixed { record_bytes }, Faults::default())
    }

    pub fn ragged(len: u64) -> Arc<Self> {
        Self::with_faults(len, Layout::Ragged, Faults::default())
    }

    pub fn with_faults(len: u64, layout: Layout, faults: Faults) -> Arc<Self> {
        Arc::new(MemSource { len, layout, faults, base: 0 })
    }

    /// Records `base ..` of the common test records.
    pub fn based(base: u64, len: u64, layout: Layout, faults: Faults) -> Arc<Self> {
        Arc::new(MemSource { len, layout, faults, base })
    }

    fn check(&self, indices: &[u64]) -> Result<(), SourceError> {
        if let Some(bad) = self.faults.fail_on {
            if indices.contains(&bad) {
                return Err(format!("record {bad} is unreadable").into());
            }
        }
        if let Some(bad) = self.faults.panic_on {
            if indices.contains(&bad) {
                panic!("source panicked on record {bad}");
            }
        }
        for &i in indices {
            if i >= self.len {
                return Err(format!("index {i} out of range {}", self.len).into());
            }
        }
        if self.faults.jitter_us > 0 {
            let first = indices.first().copied().unwrap_or(0);
            let us = first.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            thread::sleep(Duration::from_micros(us % self.faults.jitter_us));
        }
        Ok(())
    }
}

impl Source for MemSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn layout(&self) -> Layout {
        self.layout
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        self.check(req.indices)?;
        match (req.slots, self.layout) {
            (Slots::Packed, Layout::Fixed { record_bytes }) => {
                assert_eq!(dst.len(), req.indices.len() * record_bytes, "loader sized dst wrongly")
            }
            (Slots::Offsets(offsets), _) => {
                assert_eq!(offsets.len(), req.indices.len() + 1);
                assert_eq!(offsets[0], 0);
                assert_eq!(*offsets.last().unwrap() as usize, dst.len());
            }
            _ => {}
        }
        for (&i, out) in req.indices.iter().zip(req.slots(self, dst)?) {
            match self.layout {
                Layout::Fixed { .. } => {
                    for (j, b) in out.iter_mut().enumerate() {
                        *b = fixed_byte(self.base + i, j);
                    }
                }
                Layout::Ragged => out.copy_from_slice(&ragged_record(self.base + i)),
            }
        }
        Ok(())
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        self.check(indices)?;
        assert_eq!(out.len(), indices.len());
        for (&i, o) in indices.iter().zip(out) {
            *o = ragged_record(self.base + i).len() as u64;
        }
        Ok(())
    }
}

/// A batch flattened to plain values, for comparing sequences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub step: u64,
    pub indices: Vec<u64>,
    pub columns: Vec<(String, Vec<u8>, Option<Vec<u64>>)>,
}

pub fn snapshot(b: &Batch) -> Snapshot {
    Snapshot {
        step: b.step,
        indices: b.indices.to_vec(),
        columns: b
            .columns
            .iter()
            .map(|c| (c.name().to_owned(), c.data().to_vec(), c.offsets().map(<[u64]>::to_vec)))
            .collect(),
    }
}

/// The next `n` batches of `loader`, flattened.
pub fn take(loader: &mut Loader, n: usize) -> Vec<Snapshot> {
    (0..n).map(|_| snapshot(&loader.next().expect("a batch"))).collect()
}

/// A fixed stream "img" (12-byte records) and a ragged stream "txt", both of
/// `len` records.
pub fn two_streams(len: u64) -> Vec<Stream> {
    vec![Stream::new("img", MemSource::fixed(len, 12)), Stream::new("txt", MemSource::ragged(len))]
}

/// Asserts that every column of `b` holds what the source holds at its indices.
pub fn assert_matches_source(b: &Batch) {
    for c in &b.columns {
        match c.offsets() {
            None => {
                let width = c.data().len() / b.indices.len();
                for (k, &i) in b.indices.iter().enumerate() {
                    assert_eq!(
                        &c.data()[k * width..][..width],
                        &fixed_record(i, width)[..],
                        "step {} column {} record {k} (index {i})",
                        b.step,
                        c.name()
                    );
                }
            }
            Some(offsets) => {
                assert_eq!(offsets.len(), b.indices.len() + 1);
                assert_eq!(*offsets.last().unwrap() as usize, c.data().len());
                for (k, &i) in b.indices.iter().enumerate() {
                    assert_eq!(
                        &c.data()[offsets[k] as usize..offsets[k + 1] as usize],
                        &ragged_record(i)[..],
                        "step {} column {} record {k} (index {i})",
                        b.step,
                        c.name()
                    );
                }
            }
        }
    }
}

/// What a [`Probe`] saw: per hinted gather, the indices and their hints.
pub type Seen = Arc<Mutex<Vec<(Vec<u64>, Vec<Option<u64>>)>>>;

/// A [`MemSource`] that says whether it wants hints and records every hinted
/// gather; a plain gather is counted separately.
pub struct Probe {
    pub inner: Arc<MemSource>,
    pub wants: bool,
    pub hinted: Seen,
    pub plain: Arc<Mutex<u64>>,
}

impl Probe {
    pub fn new(inner: Arc<MemSource>, wants: bool) -> Arc<Probe> {
        Arc::new(Probe { inner, wants, hinted: Seen::default(), plain: Arc::default() })
    }
}

impl Source for Probe {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn layout(&self) -> Layout {
        self.inner.layout()
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        if req.next.is_empty() {
            *self.plain.lock().unwrap() += 1;
        } else {
            assert_eq!(req.next.len(), req.indices.len());
            self.hinted.lock().unwrap().push((req.indices.to_vec(), req.next.to_vec()));
        }
        self.inner.gather(&req.hints(&[]), dst)
    }
    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        self.inner.lengths(indices, out)
    }
    fn wants_hints(&self) -> bool {
        self.wants
    }
}

/// Ragged records (documents) in memory, read whole by the `Source`
/// defaults, with no block shape (nothing is read ahead): the rows a
/// packed loader over a store of the same documents must match.
pub struct Docs(pub Vec<Vec<u8>>);

impl Source for Docs {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn layout(&self) -> Layout {
        Layout::Ragged
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        for (&d, out) in req.indices.iter().zip(req.slots(self, dst)?) {
            out.copy_from_slice(&self.0[d as usize]);
        }
        Ok(())
    }

    fn lengths(&self, indices: &[u64], out: &mut [u64]) -> Result<(), SourceError> {
        for (&i, o) in indices.iter().zip(out) {
            *o = self.0[i as usize].len() as u64;
        }
        Ok(())
    }
}
