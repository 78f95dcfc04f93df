//! The machine's ceilings, for the benchmarks: what N threads of the codec
//! alone (or of memcpy) do with the same records, with no I/O, no table and
//! no checksum. A contender's throughput divided by its ceiling says how
//! much is left to win.

use std::time::{Duration, Instant};

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use zstd::zstd_safe::{CCtx, DCtx};

/// Each measurement repeats its pass until at least this much time has gone.
const MIN_TIME: Duration = Duration::from_millis(500);

/// Runs `pass` (one pass over thread `t`'s share of the records) on `threads`
/// threads at once until [`MIN_TIME`] has gone; returns logical bytes per second.
fn timed(threads: usize, bytes_per_pass: usize, pass: &(dyn Fn(usize) + Sync)) -> f64 {
    let start = Instant::now();
    let mut passes = 0u64;
    while start.elapsed() < MIN_TIME {
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || pass(t));
            }
        });
        passes += 1;
    }
    (bytes_per_pass as f64 * passes as f64) / start.elapsed().as_secs_f64()
}

/// One destination buffer of `len` bytes per thread.
fn slots(threads: usize, len: usize) -> Vec<std::sync::Mutex<Vec<u8>>> {
    (0..threads).map(|_| std::sync::Mutex::new(vec![0u8; len])).collect()
}

/// The `kind` ceiling over the records of `item_len` bytes in `src`, on
/// `threads` threads, in MiB/s of record (decoded) bytes. `kind` is
/// `"compress"` (zstd at `level`), `"decode"` (zstd at `level`, each record
/// decoded into its slot of another buffer),
/// `"memcpy"` (each record copied to its slot of another buffer), `"crc"`
/// (each record's CRC-32C, the checksum zring verifies), `"memcpy then crc"`
/// (each record copied, then the copy's CRC-32C) or `"memcpy+crc"` (each
/// record copied and checked in one pass by the engine's
/// [`zring_engine::copy_crc32c`]: the least a verified raw gather does).
#[pyfunction]
#[pyo3(signature = (kind, src, item_len, threads, level = 3))]
pub fn ceiling(
    py: Python<'_>,
    kind: &str,
    src: PyReadonlyArray1<'_, u8>,
    item_len: usize,
    threads: usize,
    level: i32,
) -> PyResult<f64> {
    let src = src.as_slice().map_err(|_| PyValueError::new_err("src must be a contiguous uint8 array"))?;
    if item_len == 0 || src.is_empty() || !src.len().is_multiple_of(item_len) || threads == 0 {
        return Err(PyValueError::new_err(format!(
            "need whole records of item_len > 0 and threads > 0, got {} bytes, item_len {item_len}, {threads} threads",
            src.len()
        )));
    }
    let records: Vec<&[u8]> = src.chunks_exact(item_len).collect();
    let share = records.len().div_ceil(threads);
    let mine = |t: usize| t * share..((t + 1) * share).min(records.len());
    let rate = py.detach(|| match kind {
        "compress" => Ok(timed(threads, src.len(), &|t| {
            let mut c = CCtx::create();
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(item_len));
            for r in &records[mine(t)] {
                out.clear();
                c.compress(&mut out, r, level).expect("zstd compresses");
            }
        })),
        "decode" => {
            // Each record decodes into its own slot of a buffer, as a gather
            // decodes into its slot of the batch (and as "memcpy" copies):
            // one reused record-sized buffer would stay in the L1 cache,
            // which no gather's destination does.
            let compressed: Vec<Vec<u8>> =
                records.iter().map(|r| zstd::bulk::compress(r, level).expect("zstd compresses")).collect();
            let dst = slots(threads, share * item_len);
            Ok(timed(threads, src.len(), &|t| {
                let mut d = DCtx::create();
                let mut out = dst[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for (slot, c) in out.chunks_exact_mut(item_len).zip(&compressed[mine(t)]) {
                    d.decompress(slot, c).expect("zstd decodes");
                }
            }))
        }
        "memcpy" => {
            let dst = slots(threads, share * item_len);
            Ok(timed(threads, src.len(), &|t| {
                let mut d = dst[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for (slot, r) in d.chunks_exact_mut(item_len).zip(&records[mine(t)]) {
                    slot.copy_from_slice(r);
                }
            }))
        }
        "crc" => Ok(timed(threads, src.len(), &|t| {
            let mut x = 0u64;
            for r in &records[mine(t)] {
                x ^= crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, r);
            }
            std::hint::black_box(x);
        })),
        "memcpy+crc" => {
            let dst = slots(threads, share * item_len);
            Ok(timed(threads, src.len(), &|t| {
                let mut d = dst[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut x = 0u32;
                for (slot, r) in d.chunks_exact_mut(item_len).zip(&records[mine(t)]) {
                    x ^= zring_engine::copy_crc32c(r, slot);
                }
                std::hint::black_box(x);
            }))
        }
        "memcpy then crc" => {
            let dst = slots(threads, share * item_len);
            Ok(timed(threads, src.len(), &|t| {
                let mut d = dst[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut x = 0u64;
                for (slot, r) in d.chunks_exact_mut(item_len).zip(&records[mine(t)]) {
                    slot.copy_from_slice(r);
                    x ^= crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, slot);
                }
                std::hint::black_box(x);
            }))
        }
        other => Err(other.to_string()),
    });
    rate.map(|b| b / f64::from(1 << 20)).map_err(|k| {
        PyValueError::new_err(format!(
            "unknown ceiling {k:?}: expected compress, decode, memcpy, crc, memcpy then crc or memcpy+crc"
        ))
    })
}
