//! Random gathers from a zring store, side by side with the alternatives,
//! measured in one run and reported as Markdown tables with ratios.
//!
//! Every contender in a table gathers the same sequence of uniformly random
//! index batches (same seed), and its first batch is checked byte for byte
//! against the generator outside the timed region. One operation = one
//! `gather` of a whole batch; latency percentiles are per batch.
//!
//! Tables:
//! 1. hot (page-cached) 12 KiB records, batch 256: io_uring vs pread,
//!    raw / zstd / zstd-dict, buffered vs O_DIRECT, against npy-style
//!    fancy indexing (memcpy out of a memory-mapped flat file).
//! 2. batch size 1 … 8192 (raw, 12 KiB).
//! 3. record size 64 B … 4 MiB.
//! 4. decode scaling: the engine's pool reads `ZRING_THREADS` once per
//!    process, so each thread count runs in a child process of this binary.
//! 5. cold: only with `ZRING_BENCH_COLD_GIB=N` (N ≥ 5 recommended); the cache
//!    is emptied before every round and the disk's own read counters are
//!    reported next to the delivered bytes.
//!
//! `cargo bench -p zring-benches --bench gather [-- --full]`. Environment:
//! `ZRING_BENCH_DIR` (data directory), `ZRING_BENCH_HOT_MIB` (hot store size,
//! default 1024), `ZRING_BENCH_COLD_GIB` (default 0 = skip the cold table).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use memmap2::Mmap;
use zring_benches::{
    bench_dir, block_read_bytes, check_gathered, disk_read_bytes, ensure_store, env_num, evict, machine, publish,
    record_set, warm, Recorder, Report, Rng, Row,
};
use zring_engine::{BackendKind, Codec, Store};

/// The record a training loop typically reads: a uint8 (3, 64, 64) tile.
const RECORD: usize = 12 << 10;
/// The batch most rows use.
const BATCH: usize = 256;
/// Default hot store size in MiB (`ZRING_BENCH_HOT_MIB` overrides).
const HOT_MIB: f64 = 1024.0;
/// Timed seconds per row (sum of operation latencies), default and `--full`.
const ROW_SECS: f64 = 1.0;
const ROW_SECS_FULL: f64 = 3.0;
/// Most operations one row times.
const MAX_OPS: u64 = 200_000;
/// Seed of every row's index sequence.
const SEED: u64 = 7;
/// Batch sizes of table 2; the default run skips none (each row is time-bound).
const BATCHES: [usize; 5] = [1, 16, 256, 1024, 8192];
/// Table 3: (record bytes, batch) — batches shrink so one gather stays a few MiB.
const SIZES: [(usize, usize); 5] = [(64, 256), (4 << 10, 256), (12 << 10, 256), (1 << 20, 16), (4 << 20, 4)];
/// Record sizes of table 3 in the default run (12 KiB comes from table 1's store).
const SIZES_DEFAULT: [usize; 3] = [64, 4 << 10, 1 << 20];
/// Data per table-3 store in the default run, MiB, and most records per store.
const SIZE_STORE_MIB: f64 = 256.0;
const SIZE_STORE_MAX_RECORDS: u64 = 2_000_000;
/// Thread counts of table 4 (each a child process).
const THREADS: [usize; 2] = [1, 2];
/// Cold table: rounds per row, and batches per round (each round starts cold).
const COLD_ROUNDS: usize = 12;
const COLD_ROUNDS_FULL: usize = 40;
const COLD_BATCHES_PER_ROUND: usize = 8;

struct Cfg {
    full: bool,
    row_secs: f64,
}

fn open(dir: &Path, backend: BackendKind, direct: bool) -> Store {
    Store::builder(dir).backend(backend).direct(direct).open().unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

/// Times `op` on random batches until the row's time budget is spent.
fn run(cfg: &Cfg, name: &str, n: u64, len: usize, batch: usize, mut op: impl FnMut(&[u64], &mut [u8])) -> Row {
    let mut rng = Rng::new(SEED);
    let mut dst = vec![0u8; batch * len];
    let idx = rng.indices(batch, n);
    op(&idx, &mut dst);
    check_gathered(&idx, &dst, len, name);
    let mut rec = Recorder::new();
    let budget = Duration::from_secs_f64(cfg.row_secs);
    while rec.busy() < budget && rec.ops() < MAX_OPS {
        let idx = rng.indices(batch, n);
        rec.time((batch * len) as u64, batch as u64, || op(&idx, &mut dst));
    }
    rec.finish(name)
}

fn store_row(cfg: &Cfg, name: &str, dir: &Path, backend: BackendKind, direct: bool, len: usize, batch: usize) -> Row {
    let store = open(dir, backend, direct);
    let st = store.stats().expect("stats");
    let note = if direct && !st.direct { "O_DIRECT refused by the file system: buffered" } else { "" };
    let n = store.len();
    run(cfg, name, n, len, batch, |idx, dst| store.gather(&zring_engine::Gather::fixed(idx, len), dst).expect("gather"))
        .with_note(note)
}

/// A flat file of the same records, for npy-style fancy indexing.
fn ensure_flat(len: usize, count: u64) -> std::path::PathBuf {
    let path = bench_dir().join(format!("flat-{len}x{count}.bin"));
    if std::fs::metadata(&path).map(|m| m.len()).ok() == Some(len as u64 * count) {
        return path;
    }
    eprintln!("  building {}", path.display());
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create flat file"));
    let group = ((64usize << 20) / len).max(1) as u64;
    let mut first = 0;
    while first < count {
        let k = group.min(count - first);
        f.write_all(&record_set(first, k as usize, len)).expect("write flat file");
        first += k;
    }
    f.into_inner().expect("flush").sync_all().expect("sync flat file");
    path
}

fn mmap_row(cfg: &Cfg, name: &str, path: &Path, len: usize, batch: usize) -> Row {
    let file = std::fs::File::open(path).expect("open flat file");
    // SAFETY: the flat file is private to this bench run and nothing truncates
    // or writes it while the map exists, so the mapped bytes stay valid.
    let map = unsafe { Mmap::map(&file) }.expect("mmap flat file");
    let n = (map.len() / len) as u64;
    run(cfg, name, n, len, batch, |idx, dst| {
        for (&i, slot) in idx.iter().zip(dst.chunks_exact_mut(len)) {
            let at = i as usize * len;
            slot.copy_from_slice(&map[at..at + len]);
        }
    })
    .with_note("single thread, like numpy fancy indexing")
}

fn hot_records() -> u64 {
    (env_num("ZRING_BENCH_HOT_MIB", HOT_MIB) * (1 << 20) as f64 / RECORD as f64) as u64
}

fn hot_stores() -> [(Codec, std::path::PathBuf); 3] {
    let n = hot_records();
    [Codec::Raw, Codec::Zstd, Codec::ZstdDict].map(|c| (c, ensure_store("hot", RECORD, n, c).0))
}

fn table_hot(cfg: &Cfg, stores: &[(Codec, std::path::PathBuf)], flat: &Path) -> Report {
    let mut rep = Report::new(format!("Hot gather: {BATCH} random × 12 KiB records per batch, page-cached"))
        .reference("npy mmap fancy-index");
    rep.push(mmap_row(cfg, "npy mmap fancy-index", flat, RECORD, BATCH));
    for (codec, dir) in stores {
        let st = open(dir, BackendKind::Pread, false).stats().expect("stats");
        let ratio = st.logical_bytes as f64 / st.chunk_bytes.max(1) as f64;
        for backend in [BackendKind::Uring, BackendKind::Pread] {
            let name = format!("zring {} {} buffered", codec.name(), backend.name());
            let row = store_row(cfg, &name, dir, backend, false, RECORD, BATCH);
            let row = if row.note.is_empty() { row.with_note(format!("compression {ratio:.2}x")) } else { row };
            rep.push(row);
        }
    }
    let direct_codecs: &[Codec] = if cfg.full { &[Codec::Raw, Codec::Zstd, Codec::ZstdDict] } else { &[Codec::Raw] };
    for (codec, dir) in stores.iter().filter(|(c, _)| direct_codecs.contains(c)) {
        for backend in [BackendKind::Uring, BackendKind::Pread] {
            let name = format!("zring {} {} O_DIRECT", codec.name(), backend.name());
            let row = store_row(cfg, &name, dir, backend, true, RECORD, BATCH);
            let row = if row.note.is_empty() {
                row.with_note("bypasses the cache: every read goes to the disk")
            } else {
                row
            };
            rep.push(row);
        }
    }
    rep
}

fn table_batches(cfg: &Cfg, stores: &[(Codec, std::path::PathBuf)], flat: &Path) -> Report {
    let mut rep = Report::new("Batch size: random 12 KiB records, hot; ratio vs mmap at the same batch in the note");
    let codecs: &[Codec] = if cfg.full { &[Codec::Raw, Codec::Zstd] } else { &[Codec::Raw] };
    for &batch in &BATCHES {
        let base = mmap_row(cfg, &format!("npy mmap fancy-index, batch {batch}"), flat, RECORD, batch);
        let base_mib = base.mib_s();
        rep.push(base);
        for (codec, dir) in stores.iter().filter(|(c, _)| codecs.contains(c)) {
            let backends: &[BackendKind] = if cfg.full || batch == BATCH {
                &[BackendKind::Uring, BackendKind::Pread]
            } else {
                &[BackendKind::Uring]
            };
            for &backend in backends {
                let name = format!("zring {} {}, batch {batch}", codec.name(), backend.name());
                let row = store_row(cfg, &name, dir, backend, false, RECORD, batch);
                let note = format!("{:.2}x mmap", row.mib_s() / base_mib.max(f64::MIN_POSITIVE));
                rep.push(row.with_note(note));
            }
        }
    }
    rep
}

fn table_sizes(cfg: &Cfg, hot_raw: &Path, flat12: &Path) -> Report {
    let mut rep =
        Report::new("Record size: random gathers, raw codec, hot; ratio vs mmap of the same size in the note");
    for (len, batch) in SIZES {
        if !cfg.full && !SIZES_DEFAULT.contains(&len) && len != RECORD {
            continue;
        }
        let (dir, flat) = if len == RECORD {
            (hot_raw.to_path_buf(), flat12.to_path_buf())
        } else {
            let mib = if cfg.full { env_num("ZRING_BENCH_HOT_MIB", HOT_MIB) } else { SIZE_STORE_MIB };
            let count = ((mib * (1 << 20) as f64) as u64 / len as u64).clamp(64, SIZE_STORE_MAX_RECORDS);
            (ensure_store("size", len, count, Codec::Raw).0, ensure_flat(len, count))
        };
        warm(&dir);
        warm(&flat);
        let label = human(len);
        let base = mmap_row(cfg, &format!("npy mmap, {label} × {batch}"), &flat, len, batch);
        let base_mib = base.mib_s();
        rep.push(base);
        for backend in [BackendKind::Uring, BackendKind::Pread] {
            let row = store_row(
                cfg,
                &format!("zring raw {}, {label} × {batch}", backend.name()),
                &dir,
                backend,
                false,
                len,
                batch,
            );
            let note = format!("{:.2}x mmap", row.mib_s() / base_mib.max(f64::MIN_POSITIVE));
            rep.push(row.with_note(note));
        }
    }
    rep
}

fn human(len: usize) -> String {
    match len {
        l if l >= 1 << 20 => format!("{} MiB", l >> 20),
        l if l >= 1 << 10 => format!("{} KiB", l >> 10),
        l => format!("{l} B"),
    }
}

/// Rows of the decode-scaling table, run inside a child with ZRING_THREADS set.
fn child_threads(cfg: &Cfg) {
    let threads = std::env::var("ZRING_THREADS").unwrap_or_default();
    let stores = hot_stores();
    for (codec, dir) in &stores {
        if *codec == Codec::Raw && !cfg.full {
            continue;
        }
        for batch in [BATCH, 1024] {
            let name = format!("zring {} io_uring, batch {batch}, ZRING_THREADS={threads}", codec.name());
            let row = store_row(cfg, &name, dir, BackendKind::Uring, false, RECORD, batch);
            println!("ROW {}", row.to_json());
        }
    }
}

fn table_threads(cfg: &Cfg) -> Report {
    let mut rep = Report::new("Decode scaling: hot 12 KiB records, io_uring; one process per ZRING_THREADS value");
    let exe = std::env::current_exe().expect("own path");
    let mut rows: Vec<Row> = Vec::new();
    for t in THREADS {
        let mut cmd = Command::new(&exe);
        cmd.arg("--child-threads").env("ZRING_THREADS", t.to_string());
        if cfg.full {
            cmd.arg("--full");
        }
        let out = cmd.output().expect("run the child bench");
        assert!(out.status.success(), "child bench failed: {}", String::from_utf8_lossy(&out.stderr));
        rows.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("ROW "))
                .filter_map(Row::from_json),
        );
    }
    // Order rows so each 2-thread row follows its 1-thread twin, with the speed-up noted.
    let key = |r: &Row| r.name.split(", ZRING_THREADS=").next().unwrap_or("").to_owned();
    let one: Vec<Row> = rows.iter().filter(|r| r.name.ends_with("=1")).cloned().collect();
    for base in one {
        let k = key(&base);
        let base_mib = base.mib_s();
        rep.push(base);
        for r in rows.iter().filter(|r| key(r) == k && !r.name.ends_with("=1")) {
            let note = format!("{:.2}x one thread", r.mib_s() / base_mib.max(f64::MIN_POSITIVE));
            rep.push(r.clone().with_note(note));
        }
    }
    rep
}

fn table_cold(cfg: &Cfg, gib: f64) -> Report {
    let count = (gib * (1u64 << 30) as f64 / RECORD as f64) as u64;
    let rounds = if cfg.full { COLD_ROUNDS_FULL } else { COLD_ROUNDS };
    let mut stores = vec![(Codec::Raw, ensure_store("cold", RECORD, count, Codec::Raw).0)];
    if cfg.full {
        stores.push((Codec::Zstd, ensure_store("cold", RECORD, count, Codec::Zstd).0));
    }
    let flat = ensure_flat(RECORD, count);
    let ev = evict(&bench_dir());
    let mut rep = Report::new(format!(
        "Cold gather: {gib:.1} GiB of 12 KiB records, {BATCH} random per batch, {COLD_BATCHES_PER_ROUND} batches per round, cache emptied before each of {rounds} rounds ({})",
        ev.describe()
    ))
    .reference("npy mmap fancy-index, cold");
    // The mmap reference: page faults bring the records in one page at a time.
    {
        let file = std::fs::File::open(&flat).expect("open flat file");
        // SAFETY: as in mmap_row: the flat file is not modified while mapped.
        let map = unsafe { Mmap::map(&file) }.expect("mmap flat file");
        let row = cold_rounds("npy mmap fancy-index, cold", count, rounds, |idx, dst| {
            for (&i, slot) in idx.iter().zip(dst.chunks_exact_mut(RECORD)) {
                let at = i as usize * RECORD;
                slot.copy_from_slice(&map[at..at + RECORD]);
            }
        });
        rep.push(row);
    }
    for (codec, dir) in &stores {
        for direct in [false, true] {
            for backend in [BackendKind::Uring, BackendKind::Pread] {
                let store = open(dir, backend, direct);
                let mode = if store.stats().expect("stats").direct { "O_DIRECT" } else { "buffered" };
                let name = format!("zring {} {} {mode}, cold", codec.name(), backend.name());
                let row = cold_rounds(&name, count, rounds, |idx, dst| {
                    store.gather(&zring_engine::Gather::fixed(idx, RECORD), dst).expect("gather")
                });
                rep.push(row);
            }
        }
    }
    rep
}

fn cold_rounds(name: &str, n: u64, rounds: usize, mut op: impl FnMut(&[u64], &mut [u8])) -> Row {
    let mut rng = Rng::new(SEED);
    let mut dst = vec![0u8; BATCH * RECORD];
    let mut rec = Recorder::new();
    let (mut disk, mut proc_io) = (0u64, 0u64);
    let mut first = true;
    for _ in 0..rounds {
        evict(&bench_dir());
        for _ in 0..COLD_BATCHES_PER_ROUND {
            let idx = rng.indices(BATCH, n);
            let (b0, p0) = (block_read_bytes().unwrap_or(0), disk_read_bytes().unwrap_or(0));
            rec.time((BATCH * RECORD) as u64, BATCH as u64, || op(&idx, &mut dst));
            disk += block_read_bytes().unwrap_or(0).saturating_sub(b0);
            proc_io += disk_read_bytes().unwrap_or(0).saturating_sub(p0);
            if first {
                check_gathered(&idx, &dst, RECORD, name);
                first = false;
            }
        }
    }
    let row = rec.finish(name);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let note = format!(
        "disk served {:.0} MiB ({:.2}x delivered, {:.0} MiB/s); /proc/self/io read_bytes {:.0} MiB",
        mib(disk),
        disk as f64 / row.bytes.max(1) as f64,
        mib(disk) / row.secs.max(f64::MIN_POSITIVE),
        mib(proc_io)
    );
    row.with_note(note)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--full");
    let cfg = Cfg { full, row_secs: if full { ROW_SECS_FULL } else { ROW_SECS } };
    if args.iter().any(|a| a == "--child-threads") {
        child_threads(&cfg);
        return;
    }
    let started = Instant::now();
    eprintln!("gather bench: data in {}", bench_dir().display());
    let stores = hot_stores();
    let flat = ensure_flat(RECORD, hot_records());
    for (_, d) in &stores {
        warm(d);
    }
    warm(&flat);
    let mut reports = vec![table_hot(&cfg, &stores, &flat)];
    reports.push(table_batches(&cfg, &stores, &flat));
    reports.push(table_sizes(&cfg, &stores[0].1, &flat));
    reports.push(table_threads(&cfg));
    let cold = env_num("ZRING_BENCH_COLD_GIB", 0.0);
    if cold > 0.0 {
        reports.push(table_cold(&cfg, cold));
    }
    let mut md = format!(
        "## gather ({}; {} run, {:.0} s; hot store {:.0} MiB per codec)\n\n",
        machine(),
        if full { "--full" } else { "default" },
        started.elapsed().as_secs_f64(),
        hot_records() as f64 * RECORD as f64 / (1 << 20) as f64
    );
    if cold <= 0.0 {
        md.push_str("Cold table skipped (set ZRING_BENCH_COLD_GIB=5 or more to run it).\n\n");
    }
    for r in &reports {
        md.push_str(&r.markdown());
        md.push('\n');
    }
    publish("gather", full, &md);
}
