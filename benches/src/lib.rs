//! The benchmark harness shared by zring's bench binaries.
//!
//! A bench measures named contenders in one run and prints one Markdown
//! table per question it asks. Each row is one contender: how many operations
//! it ran, its throughput in MiB/s and records/s, the per-operation latency
//! percentiles (p50/p90/p99/p99.9/max, from an hdrhistogram in microseconds),
//! and its throughput as a ratio to the table's reference row. Timings from
//! different processes stay comparable because rows serialise to JSON
//! ([`Row::to_json`] / [`Row::from_json`]): a bench that needs a fresh process
//! per setting (the engine reads `ZRING_THREADS` once) runs itself as a child
//! and collects the child's rows into its own table.
//!
//! # Overview
//! - [`Report`], [`Row`], [`Recorder`]: collect latencies and counts, print tables.
//! - [`fill_record`], [`record_set`]: deterministic, mildly compressible records
//!   shaped like uint8 image tiles (smooth gradients plus noise).
//! - [`evict`]: drop a directory's files from the page cache before a cold round,
//!   reporting which of the two methods took effect.
//! - [`bench_dir`]: where bench data lives (`ZRING_BENCH_DIR`, default
//!   `bench-data/` in the repository, never `/tmp`, which may be memory).
//! - [`disk_read_bytes`]: bytes this process made the block layer read, for
//!   checking that a cold round really went to the disk.
//! - [`block_read_bytes`]: the same, counted at the block devices.
//! - [`ensure_store`], [`warm`], [`check_gathered`]: build (or reuse) a bench
//!   store, pull it into the page cache, and check that a gather was right.
//! - [`Rng`]: a small seeded generator for index sequences.

use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use zring_engine::{Codec, Store};

/// The longest latency a histogram resolves: ten minutes, in microseconds.
const MAX_MICROS: u64 = 600_000_000;

/// Width of one tile row in [`fill_record`]; records are rows of this many pixels.
pub const TILE_WIDTH: usize = 64;

/// Records one contender's operations: latency per operation plus the bytes
/// and records it moved and the wall time of the whole run.
pub struct Recorder {
    hist: Histogram<u64>,
    bytes: u64,
    records: u64,
    started: Instant,
    busy: Duration,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder; its wall clock starts now.
    pub fn new() -> Self {
        Recorder {
            hist: Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant histogram bounds are valid"),
            bytes: 0,
            records: 0,
            started: Instant::now(),
            busy: Duration::ZERO,
        }
    }

    /// Restarts the wall clock (call after any untimed setup).
    pub fn restart_clock(&mut self) {
        self.started = Instant::now();
        self.busy = Duration::ZERO;
    }

    /// Records one operation of `elapsed` that moved `bytes` in `records` records.
    pub fn record(&mut self, elapsed: Duration, bytes: u64, records: u64) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).clamp(1, MAX_MICROS);
        self.hist.record(us).expect("value clamped into the histogram's range");
        self.bytes += bytes;
        self.records += records;
        self.busy += elapsed;
    }

    /// Times `op` and records it.
    pub fn time<T>(&mut self, bytes: u64, records: u64, op: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = op();
        self.record(t.elapsed(), bytes, records);
        out
    }

    /// Operations recorded so far.
    pub fn ops(&self) -> u64 {
        self.hist.len()
    }

    /// Wall time since the clock (re)started.
    pub fn wall(&self) -> Duration {
        self.started.elapsed()
    }

    /// Sum of the recorded operations' durations (excludes untimed work such
    /// as evictions between rounds).
    pub fn busy(&self) -> Duration {
        self.busy
    }

    /// The finished row with throughput over `secs` seconds instead of the
    /// timed operations' sum: for pipelines, where what counts is delivered
    /// batches per second of the whole loop.
    pub fn finish_over(&self, name: impl Into<String>, secs: f64) -> Row {
        Row { secs, ..self.finish(name) }
    }

    /// The finished row. Throughput divides by the sum of the timed
    /// operations, so untimed work between them (evicting the cache, a
    /// simulated training step) does not count against the contender.
    pub fn finish(&self, name: impl Into<String>) -> Row {
        let q = |p: f64| self.hist.value_at_quantile(p);
        Row {
            name: name.into(),
            ops: self.hist.len(),
            bytes: self.bytes,
            records: self.records,
            secs: self.busy.as_secs_f64(),
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: self.hist.max(),
            note: String::new(),
        }
    }
}

/// One contender's summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Operations timed.
    pub ops: u64,
    /// Bytes delivered to the caller (decoded).
    pub bytes: u64,
    /// Records delivered.
    pub records: u64,
    /// Seconds the timed operations took in total.
    pub secs: f64,
    /// Latency percentiles of one operation, microseconds.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest operation.
    pub max_us: u64,
    /// Free text shown in the last column (e.g. bytes the disk served).
    pub note: String,
}

impl Row {
    /// Throughput in MiB/s of delivered bytes.
    pub fn mib_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / (1 << 20) as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Records delivered per second.
    pub fn records_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.records as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// One line of JSON, for handing rows from a child process to its parent.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "name": self.name, "ops": self.ops, "bytes": self.bytes, "records": self.records,
            "secs": self.secs, "p50_us": self.p50_us, "p90_us": self.p90_us, "p99_us": self.p99_us,
            "p999_us": self.p999_us, "max_us": self.max_us, "note": self.note,
        })
        .to_string()
    }

    /// Parses [`Row::to_json`]'s output; `None` for any other line.
    pub fn from_json(line: &str) -> Option<Row> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let u = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Some(Row {
            name: v.get("name")?.as_str()?.to_owned(),
            ops: u("ops")?,
            bytes: u("bytes")?,
            records: u("records")?,
            secs: v.get("secs")?.as_f64()?,
            p50_us: u("p50_us")?,
            p90_us: u("p90_us")?,
            p99_us: u("p99_us")?,
            p999_us: u("p999_us")?,
            max_us: u("max_us")?,
            note: v.get("note")?.as_str()?.to_owned(),
        })
    }
}

/// A table of rows answering one question, with an optional reference row
/// that the ratio column divides by.
#[derive(Clone, Debug, Default)]
pub struct Report {
    title: String,
    rows: Vec<Row>,
    reference: Option<String>,
}

impl Report {
    /// An empty table with a heading.
    pub fn new(title: impl Into<String>) -> Self {
        Report { title: title.into(), rows: Vec::new(), reference: None }
    }

    /// Names the row whose throughput is 1.00× in the ratio column.
    pub fn reference(mut self, name: impl Into<String>) -> Self {
        self.reference = Some(name.into());
        self
    }

    /// Adds a row and prints a progress line to stderr.
    pub fn push(&mut self, row: Row) {
        eprintln!(
            "  {:<48} {:>9.1} MiB/s  p50 {:>9.3} ms  p99 {:>9.3} ms",
            row.name,
            row.mib_s(),
            ms(row.p50_us),
            ms(row.p99_us)
        );
        self.rows.push(row);
    }

    /// The rows so far.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The table as Markdown: heading, then one line per row.
    pub fn markdown(&self) -> String {
        let reference =
            self.reference.as_ref().and_then(|r| self.rows.iter().find(|row| &row.name == r)).map(Row::mib_s);
        let mut s = String::new();
        let _ = writeln!(s, "### {}\n", self.title);
        let ratio_head = match &self.reference {
            Some(r) => format!("× {r}"),
            None => "ratio".to_owned(),
        };
        let _ = writeln!(
            s,
            "| name | ops | MiB/s | records/s | {ratio_head} | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | note |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.rows {
            let ratio = match reference {
                Some(base) if base > 0.0 => format!("{:.2}", r.mib_s() / base),
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.ops,
                r.mib_s(),
                r.records_s(),
                ratio,
                fmt_ms(r.p50_us),
                fmt_ms(r.p90_us),
                fmt_ms(r.p99_us),
                fmt_ms(r.p999_us),
                fmt_ms(r.max_us),
                r.note
            );
        }
        s
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Milliseconds with three significant-ish digits (µs resolution below 1 ms).
fn fmt_ms(us: u64) -> String {
    let m = ms(us);
    if m >= 100.0 {
        format!("{m:.0}")
    } else if m >= 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.3}")
    }
}

/// A seeded xorshift64* generator: enough for index sequences and noise, and
/// the same sequence on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `count` uniform indices in `0..n`.
    pub fn indices(&mut self, count: usize, n: u64) -> Vec<u64> {
        (0..count).map(|_| self.below(n)).collect()
    }
}

/// Fills `dst` with record `index`: rows of [`TILE_WIDTH`] uint8 pixels
/// forming a smooth two-dimensional gradient (slope and phase vary per record,
/// the offset per 64-row plane, like the channels of a (3, 64, 64) tile) plus
/// two bits of noise per pixel. zstd at level 3 shrinks it about 1.4×, a
/// middle ground between incompressible JPEG bytes and all-zero tensors.
/// Deterministic in `index` alone; `benches/compare.py` uses the same formula.
pub fn fill_record(index: u64, dst: &mut [u8]) {
    let mut rng = Rng::new(index ^ 0x5EED);
    let gx = (rng.below(5) + 1) as u32;
    let gy = (rng.below(5) + 1) as u32;
    let phase = rng.below(256) as u32;
    let mut noise = 0u64;
    for (k, px) in dst.iter_mut().enumerate() {
        if k % 32 == 0 {
            noise = rng.next_u64();
        }
        let x = (k % TILE_WIDTH) as u32;
        let y = ((k / TILE_WIDTH) % TILE_WIDTH) as u32;
        let plane = (k / (TILE_WIDTH * TILE_WIDTH)) as u32;
        let smooth = (gx * x + gy * y) / 8 + phase + plane * 50;
        let n = ((noise >> ((k % 32) * 2)) & 3) as u32;
        *px = ((smooth + n) & 0xFF) as u8;
    }
}

/// `count` consecutive records (from `first`) of `len` bytes, back to back.
pub fn record_set(first: u64, count: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; count * len];
    for (k, slot) in out.chunks_exact_mut(len.max(1)).enumerate() {
        fill_record(first + k as u64, slot);
    }
    out
}

/// The repository root (the parent of this crate's folder).
fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."))
}

/// Prints a bench's Markdown and writes it to `bench-results/{stem}.md`
/// (`{stem}-full.md` for a `--full` run).
pub fn publish(stem: &str, full: bool, md: &str) {
    println!("{md}");
    let out = repo_root().join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let name = if full { format!("{stem}-full.md") } else { format!("{stem}.md") };
        let _ = std::fs::write(out.join(name), md);
    }
}

/// The directory for bench data: `$ZRING_BENCH_DIR`, else `bench-data/` at the
/// repository root. `/tmp` is avoided on purpose: it may be memory-backed,
/// which would measure nothing about disks.
pub fn bench_dir() -> PathBuf {
    let dir = match std::env::var_os("ZRING_BENCH_DIR") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("bench-data"),
    };
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create the bench directory {}: {e}", dir.display()));
    dir
}

/// Reads a numeric environment variable, falling back to `default`.
pub fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What [`evict`] managed to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Files that got `posix_fadvise(DONTNEED)` (after `fdatasync`).
    pub fadvised: usize,
    /// Whether writing `3` to `/proc/sys/vm/drop_caches` succeeded (root only).
    pub dropped_caches: bool,
}

impl Eviction {
    /// How the cache was emptied, in words for a table note.
    pub fn describe(&self) -> String {
        match self.dropped_caches {
            true => format!("fadvise DONTNEED on {} files + drop_caches", self.fadvised),
            false => format!("fadvise DONTNEED on {} files (drop_caches not permitted)", self.fadvised),
        }
    }
}

/// Evicts every regular file under `dir` (recursively) from the page cache:
/// `fdatasync` (dirty pages cannot be dropped) then `posix_fadvise(DONTNEED)`
/// on each, then `echo 3 > /proc/sys/vm/drop_caches` when running as root.
pub fn evict(dir: &Path) -> Eviction {
    let mut ev = Eviction::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() && evict_file(&p) => ev.fadvised += 1,
                _ => {}
            }
        }
    }
    // SAFETY: geteuid has no preconditions and only reads process credentials.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        ev.dropped_caches = std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok();
    }
    ev
}

/// `fdatasync` + `posix_fadvise(DONTNEED)` on one file; whether the advice was taken.
pub fn evict_file(path: &Path) -> bool {
    let Ok(f) = File::open(path) else { return false };
    let fd = f.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `f`, which outlives both calls;
    // neither call touches memory of ours.
    unsafe {
        libc::fdatasync(fd);
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) == 0
    }
}

/// Bytes this process has caused to be read from storage so far
/// (`read_bytes` in `/proc/self/io`), if the kernel reports it.
pub fn disk_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// Bytes the block devices have read since boot, summed over every disk in
/// `/sys/block` that is not a loop, ram or zram device (sectors read × 512).
/// Unlike [`disk_read_bytes`] it also sees reads issued on a process's
/// behalf by kernel threads.
pub fn block_read_bytes() -> Option<u64> {
    let mut total = 0;
    let mut any = false;
    for e in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("loop") || name.starts_with("ram") || name.starts_with("zram") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        if let Some(sectors) = stat.split_whitespace().nth(2).and_then(|v| v.parse::<u64>().ok()) {
            total += sectors * 512;
            any = true;
        }
    }
    any.then_some(total)
}

/// Bytes allocated on disk for every file under `dir` (`st_blocks * 512`).
pub fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// `nproc`, memory and the bench directory's file system, for table headers.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|k| k.parse::<u64>().ok())
        .map_or("?".to_owned(), |k| format!("{:.1} GiB", k as f64 / (1 << 20) as f64));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} cpus, {mem} memory, Linux {}", kernel.trim())
}

/// Records appended per `append_fixed` call while building a bench store.
const BUILD_GROUP_BYTES: usize = 64 << 20;
/// Records sampled to train a `zstd_dict` store's dictionary.
const DICT_SAMPLES: usize = 4096;
/// Upper bound on the trained dictionary's size.
const DICT_MAX_BYTES: usize = 112 << 10;

/// Opens the bench store `name` holding `count` records of `len` bytes from
/// [`fill_record`] with `codec`, building it first unless a complete one is
/// already there (stores are kept between runs; delete the bench directory to
/// rebuild). Returns its directory and the seconds the build took (0 when reused).
pub fn ensure_store(name: &str, len: usize, count: u64, codec: Codec) -> (PathBuf, f64) {
    let dir = bench_dir().join(format!("{name}-{len}x{count}-{}", codec.name()));
    if let Ok(s) = Store::builder(&dir).open() {
        if s.len() == count {
            return (dir, 0.0);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("  building {} ({:.0} MiB)", dir.display(), (len as u64 * count) as f64 / (1 << 20) as f64);
    let t = Instant::now();
    let store = Store::builder(&dir).codec(codec).create().unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    if codec == Codec::ZstdDict {
        let n = DICT_SAMPLES.min(count as usize);
        let step = (count / n as u64).max(1);
        let samples: Vec<Vec<u8>> = (0..n as u64)
            .map(|k| {
                let mut v = vec![0u8; len];
                fill_record(k * step, &mut v);
                v
            })
            .collect();
        let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        store.train_dict(&refs, DICT_MAX_BYTES).expect("train the dictionary");
    }
    let group = (BUILD_GROUP_BYTES / len.max(1)).max(1) as u64;
    let mut first = 0;
    while first < count {
        let n = group.min(count - first);
        let data = record_set(first, n as usize, len);
        store.append_fixed(&data, len, Some(codec)).expect("append");
        first += n;
    }
    store.sync().expect("sync");
    (dir, t.elapsed().as_secs_f64())
}

/// Reads every file under `dir` once, so a "hot" measurement starts with the
/// data in the page cache.
pub fn warm(dir: &Path) {
    use std::io::Read;
    let mut buf = vec![0u8; 8 << 20];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(mut f) = File::open(&p) {
                while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
            }
        }
    }
}

/// Checks that `dst` holds the [`fill_record`] records at `indices`, each in a
/// slot of `stride` bytes; panics naming the first mismatch. Benches call it
/// once per contender, outside the timed region, so a fast wrong answer
/// cannot win.
pub fn check_gathered(indices: &[u64], dst: &[u8], stride: usize, name: &str) {
    let mut want = vec![0u8; stride];
    for (k, (&i, got)) in indices.iter().zip(dst.chunks_exact(stride)).enumerate() {
        fill_record(i, &mut want);
        assert!(got == want.as_slice(), "{name}: slot {k} (record {i}) holds the wrong bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_deterministic_and_differ() {
        let a = record_set(7, 3, 12288);
        assert_eq!(a, record_set(7, 3, 12288));
        assert_ne!(a[..12288], a[12288..24576]);
        let mut one = vec![0u8; 12288];
        fill_record(8, &mut one);
        assert_eq!(one[..], a[12288..24576]);
    }

    #[test]
    fn rows_survive_json() {
        let mut r = Recorder::new();
        r.record(Duration::from_micros(1500), 4096, 2);
        r.record(Duration::from_micros(10), 4096, 2);
        let row = r.finish("x").with_note("n");
        let back = Row::from_json(&row.to_json()).unwrap();
        assert_eq!(back, row);
        assert_eq!(row.ops, 2);
        assert_eq!(row.records, 4);
        assert!(row.max_us >= 1500 && row.p50_us <= 11);
        assert!(Row::from_json("not json").is_none());
    }

    #[test]
    fn ratio_column_divides_by_the_reference() {
        let mk = |name: &str, bytes: u64| Row {
            name: name.into(),
            ops: 1,
            bytes,
            records: 1,
            secs: 1.0,
            p50_us: 1,
            p90_us: 1,
            p99_us: 1,
            p999_us: 1,
            max_us: 1,
            note: String::new(),
        };
        let mut rep = Report::new("t").reference("base");
        rep.push(mk("base", 1 << 20));
        rep.push(mk("fast", 3 << 20));
        let md = rep.markdown();
        assert!(md.contains("| fast | 1 | 3.0 | 1 | 3.00 |"), "{md}");
        assert!(md.contains("| base | 1 | 1.0 | 1 | 1.00 |"), "{md}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = Rng::new(1);
        assert!(rng.indices(10_000, 37).iter().all(|&i| i < 37));
    }
}
