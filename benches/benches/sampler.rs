//! Cost of computing index batches with `zring-sampler`, per mode and batch
//! size, printed as a Markdown table.
//!
//! For each (mode, batch) the bench times `SAMPLES` runs that each fill about
//! `INDICES_PER_SAMPLE` indices batch after batch into one reused buffer, and
//! reports the median ns per index. A second pass times every batch on its own
//! into an hdrhistogram for the p50/p99 latency of one `fill` call. Steps keep
//! counting across runs, so cyclic batches cross many cycle boundaries.

use std::hint::black_box;
use std::time::Instant;

use hdrhistogram::Histogram;
use zring_sampler::{Mode, Sampler};

/// Size of the index space.
const LENGTH: u64 = 1_000_000;
/// Global batch sizes to measure.
const BATCHES: [u64; 3] = [256, 1024, 8192];
/// Seed of every sampler.
const SEED: u64 = 42;
/// Indices filled per timed run.
const INDICES_PER_SAMPLE: u64 = 4_000_000;
/// Timed runs per (mode, batch); the median is reported.
const SAMPLES: usize = 21;
/// Batches timed one by one for the latency histogram.
const LATENCY_BATCHES: u64 = 20_000;

const MODES: [(Mode, &str); 3] = [(Mode::Sequential, "sequential"), (Mode::Iid, "iid"), (Mode::Cyclic, "cyclic")];

struct Row {
    mode: &'static str,
    batch: u64,
    ns_per_index: f64,
    min_ns_per_index: f64,
    p50_us: f64,
    p99_us: f64,
}

fn measure(mode: Mode, name: &'static str, batch: u64) -> Row {
    let sampler = Sampler::new(mode, LENGTH, batch, SEED).expect("valid sampler");
    let mut out = vec![0u64; sampler.batch_len()];
    let batches_per_sample = INDICES_PER_SAMPLE / batch;
    let mut step = 0u64;

    // Warm-up: one untimed run.
    for _ in 0..batches_per_sample {
        sampler.fill(step, &mut out).expect("buffer fits");
        black_box(&out);
        step += 1;
    }

    let mut per_index = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        for _ in 0..batches_per_sample {
            sampler.fill(step, black_box(&mut out)).expect("buffer fits");
            black_box(&out);
            step += 1;
        }
        let ns = start.elapsed().as_nanos() as f64;
        per_index.push(ns / (batches_per_sample * batch) as f64);
    }
    per_index.sort_by(f64::total_cmp);

    let mut latency = Histogram::<u64>::new(3).expect("valid histogram");
    for _ in 0..LATENCY_BATCHES.min(batches_per_sample * 4) {
        let start = Instant::now();
        sampler.fill(step, black_box(&mut out)).expect("buffer fits");
        black_box(&out);
        let ns = start.elapsed().as_nanos() as u64;
        latency.record(ns.max(1)).expect("in range");
        step += 1;
    }

    Row {
        mode: name,
        batch,
        ns_per_index: per_index[SAMPLES / 2],
        min_ns_per_index: per_index[0],
        p50_us: latency.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: latency.value_at_quantile(0.99) as f64 / 1000.0,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "sampler fill, length {LENGTH}, seed {SEED}, {SAMPLES} runs of ~{INDICES_PER_SAMPLE} indices, \
         single thread ({} {}, {cpus} cpus)\n",
        std::env::consts::OS,
        std::env::consts::ARCH,
    );
    println!("| mode | batch | ns/index (median) | ns/index (best) | Mindex/s | batch p50 (us) | batch p99 (us) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (mode, name) in MODES {
        for batch in BATCHES {
            let row = measure(mode, name, batch);
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} |",
                row.mode,
                row.batch,
                row.ns_per_index,
                row.min_ns_per_index,
                1000.0 / row.ns_per_index,
                row.p50_us,
                row.p99_us,
            );
        }
    }
}
