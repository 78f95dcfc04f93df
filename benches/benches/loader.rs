//! The loader as a training loop feels it: how long each `next()` blocks
//! (consumer wait p50/p99…) and how many batches per second arrive, for
//! pipeline depth 1, 2 and 4, against a loop that gathers each step itself
//! with no overlap at all.
//!
//! Two streams of the same length, gathered at the same indices: `data`
//! (12 KiB records like (3, 64, 64) uint8 tiles) and `label` (8 B). The data
//! stream is stored raw or zstd. Each setting runs twice: with a consumer that
//! does nothing between steps (the loader's raw delivery rate) and with a
//! simulated training step that sleeps, as a loop waiting on an accelerator
//! would (overlap is what hides the gather then).
//!
//! `cargo bench -p zring-benches --bench loader [-- --full]`;
//! `ZRING_BENCH_DIR` chooses the data directory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zring_benches::{bench_dir, check_gathered, ensure_store, machine, publish, warm, Recorder, Report, Row};
use zring_engine::{Codec, Store};
use zring_loader::{Layout, Loader, LoaderConfig, Mode, Request, Slots, Source, SourceError, Stream};
use zring_sampler::Sampler;

/// Data record bytes and label record bytes.
const DATA: usize = 12 << 10;
const LABEL: usize = 8;
/// Records per stream (~512 MiB of data: hot in the page cache).
const RECORDS: u64 = 43_690;
/// Global batch size.
const BATCH: u64 = 256;
/// Pipeline depths compared.
const DEPTHS: [usize; 3] = [1, 2, 4];
/// Loader gather threads (the loader's default).
const THREADS: usize = 2;
/// Timed steps per row after `WARMUP` untimed ones (default / `--full`).
const STEPS: u64 = 300;
const STEPS_FULL: u64 = 2000;
const WARMUP: u64 = 10;
/// The simulated training step of the second table.
const STEP_WORK: Duration = Duration::from_millis(3);
const SEED: u64 = 11;

/// A store as a fixed-layout loader source.
struct StoreSource {
    store: Store,
    len: usize,
}

impl Source for StoreSource {
    fn len(&self) -> u64 {
        self.store.len()
    }
    fn layout(&self) -> Layout {
        Layout::Fixed { record_bytes: self.len }
    }
    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let Slots::Packed = req.slots else { return Err("packed slots only".into()) };
        let gather = zring_engine::Gather::fixed(req.indices, self.len).fan_out(req.fan_out);
        Ok(self.store.gather(&gather, dst)?)
    }
    fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
        Err("fixed layout".into())
    }
}

fn open(dir: &Path) -> Store {
    Store::builder(dir).open().unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

const STEP_BYTES: u64 = BATCH * (DATA + LABEL) as u64;

/// No loader: sample and gather both streams on the consumer's thread, then work.
fn sync_row(name: &str, data: &Path, label: &Path, steps: u64, work: Duration) -> Row {
    let (data, label) = (open(data), open(label));
    let sampler = Sampler::new(Mode::Cyclic, RECORDS, BATCH, SEED).expect("sampler");
    let mut idx = vec![0u64; sampler.batch_len()];
    let mut d = vec![0u8; idx.len() * DATA];
    let mut l = vec![0u8; idx.len() * LABEL];
    let mut rec = Recorder::new();
    for step in 0..WARMUP + steps {
        if step == WARMUP {
            rec.restart_clock();
        }
        let t = Instant::now();
        sampler.fill(step, &mut idx).expect("fill");
        data.gather(&zring_engine::Gather::fixed(&idx, DATA), &mut d).expect("gather data");
        label.gather(&zring_engine::Gather::fixed(&idx, LABEL), &mut l).expect("gather label");
        if step >= WARMUP {
            rec.record(t.elapsed(), STEP_BYTES, BATCH);
        } else if step == 0 {
            check_gathered(&idx, &d, DATA, name);
            check_gathered(&idx, &l, LABEL, name);
        }
        std::thread::sleep(work);
    }
    let wall = rec.wall().as_secs_f64();
    rec.finish_over(name, wall).with_note("gather on the consumer thread; wait = the whole gather")
}

fn loader_row(name: &str, data: &Path, label: &Path, depth: usize, steps: u64, work: Duration) -> Row {
    let streams = vec![
        Stream::new("data", Arc::new(StoreSource { store: open(data), len: DATA })),
        Stream::new("label", Arc::new(StoreSource { store: open(label), len: LABEL })),
    ];
    let mut cfg = LoaderConfig::new(BATCH);
    cfg.mode = Mode::Cyclic;
    cfg.seed = SEED;
    cfg.depth = depth;
    cfg.threads = THREADS;
    let mut loader = Loader::new(streams, cfg).expect("loader");
    let mut rec = Recorder::new();
    for step in 0..WARMUP + steps {
        if step == WARMUP {
            rec.restart_clock();
        }
        let t = Instant::now();
        let batch = loader.next().expect("next");
        let waited = t.elapsed();
        if step >= WARMUP {
            rec.record(waited, STEP_BYTES, batch.len() as u64);
        } else if step == 0 {
            check_gathered(batch.indices.as_slice(), batch.column("data").expect("data").data(), DATA, name);
            check_gathered(batch.indices.as_slice(), batch.column("label").expect("label").data(), LABEL, name);
        }
        drop(batch);
        std::thread::sleep(work);
    }
    let wall = rec.wall().as_secs_f64();
    let gather = loader.stats().gather;
    loader.close().expect("close");
    rec.finish_over(name, wall).with_note(format!(
        "worker gather p50 {:.2} ms, p99 {:.2} ms",
        gather.p50_us as f64 / 1e3,
        gather.p99_us as f64 / 1e3
    ))
}

fn main() {
    let full = std::env::args().any(|a| a == "--full");
    let steps = if full { STEPS_FULL } else { STEPS };
    let started = Instant::now();
    eprintln!("loader bench: data in {}", bench_dir().display());
    let (label, _) = ensure_store("loader-label", LABEL, RECORDS, Codec::Raw);
    let mut reports = Vec::new();
    for work in [Duration::ZERO, STEP_WORK] {
        for codec in [Codec::Raw, Codec::Zstd] {
            let (data, _) = ensure_store("loader-data", DATA, RECORDS, codec);
            warm(&data);
            warm(&label);
            let what = if work.is_zero() {
                "consumer does nothing".to_owned()
            } else {
                format!("consumer sleeps {} ms per step", work.as_millis())
            };
            let sync = format!("no loader (sync gather), {}", codec.name());
            let mut rep = Report::new(format!(
                "Loader, data {} 12 KiB + label 8 B, batch {BATCH}, {THREADS} gather threads, {what}; latency = consumer wait per step",
                codec.name()
            ))
            .reference(sync.clone());
            rep.push(sync_row(&sync, &data, &label, steps, work));
            for depth in DEPTHS {
                rep.push(loader_row(
                    &format!("zring Loader depth {depth}, {}", codec.name()),
                    &data,
                    &label,
                    depth,
                    steps,
                    work,
                ));
            }
            reports.push(rep);
        }
    }
    let mut md = format!(
        "## loader ({}; {} run, {:.0} s; {RECORDS} records per stream, {steps} timed steps per row)\n\nMiB/s and records/s are per wall second of the whole loop (simulated step included); the ratio column divides by the no-loader row.\n\n",
        machine(),
        if full { "--full" } else { "default" },
        started.elapsed().as_secs_f64()
    );
    for r in &reports {
        md.push_str(&r.markdown());
        md.push('\n');
    }
    publish("loader", full, &md);
}
