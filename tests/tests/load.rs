//! Guarantee: gathers stay correct under concurrency, and handles release
//! everything they hold.
//!
//! 16 threads gather for a bounded time (about 3 s) while a writer appends and
//! syncs: half share the writer's handle (which sees appends at once), half
//! use read-only handles of their own, reopened now and then to see newly
//! synced records. Records are appended in id order and never deleted, so
//! record `i` must hold id `i`; every gathered byte is checked. Then a
//! read-only store is opened, read and closed 10,000 times, and the number of
//! open file descriptors (`/proc/self/fd`) must come back to its baseline.
//!
//! The two tests share a lock: the descriptor count is per process, and the
//! concurrent test opens descriptors of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zring_engine::{BackendKind, Codec, Store};
use zring_tests::{record_for, record_id, test_dir, Rng};

const READERS: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(3);
const INITIAL_RECORDS: u64 = 500;
const OPEN_CLOSE_CYCLES: usize = 10_000;

static PROCESS_WIDE: Mutex<()> = Mutex::new(());

fn append_ids(s: &Store, ids: std::ops::Range<u64>, codec: Codec) {
    let recs: Vec<Vec<u8>> = ids.clone().map(record_for).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    let first = s.append(&refs, Some(codec)).expect("append");
    assert_eq!(first, ids.start, "appends land at the end");
}

/// Gathers a random batch below `len` and checks every record; returns the
/// number of records checked.
fn gather_and_check(s: &Store, len: u64, rng: &mut Rng, who: &str) -> u64 {
    let n = rng.range(1, 64) as usize;
    let batch: Vec<u64> = (0..n).map(|_| rng.below(len)).collect();
    let mut lens = vec![0u64; n];
    s.lengths(&batch, &mut lens).unwrap_or_else(|e| panic!("{who}: lengths below {len}: {e}"));
    let mut offsets = Vec::with_capacity(n);
    let mut total = 0u64;
    for l in &lens {
        offsets.push(total);
        total += l;
    }
    let mut dst = vec![0u8; total as usize];
    s.gather(&zring_engine::Gather::ragged(&batch, &offsets), &mut dst)
        .unwrap_or_else(|e| panic!("{who}: gather_var below {len}: {e}"));
    for (k, &i) in batch.iter().enumerate() {
        let slot = &dst[offsets[k] as usize..(offsets[k] + lens[k]) as usize];
        assert_eq!(record_id(slot), Some(i), "{who}: record {i} holds wrong bytes");
    }
    n as u64
}

#[test]
fn gathers_stay_correct_while_a_writer_appends() {
    let _g = PROCESS_WIDE.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let store = Arc::new(Store::builder(&dir).chunk_bytes(256 << 10).create().expect("create"));
    append_ids(&store, 0..INITIAL_RECORDS, Codec::Zstd);
    store.sync().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let synced = Arc::new(AtomicU64::new(INITIAL_RECORDS));
    let deadline = Instant::now() + RUN_FOR;
    let writer = {
        let (store, stop, synced) = (store.clone(), stop.clone(), synced.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(7);
            let mut next = INITIAL_RECORDS;
            let mut appends = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = rng.range(1, 32);
                let codec = [Codec::Raw, Codec::Zstd][rng.below(2) as usize];
                append_ids(&store, next..next + n, codec);
                next += n;
                appends += 1;
                if rng.chance(1, 2) {
                    store.sync().expect("sync");
                    synced.store(next, Ordering::Release);
                }
            }
            store.sync().expect("final sync");
            (appends, next)
        })
    };
    let readers: Vec<_> = (0..READERS)
        .map(|t| {
            let (store, dir, synced) = (store.clone(), dir.clone(), synced.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t as u64);
                let shared = t % 2 == 0;
                let who = format!("reader {t} ({})", if shared { "writer's handle" } else { "own handle" });
                let mut own: Option<Store> = None;
                let (mut gathers, mut records, mut reopens) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    let s: &Store = if shared {
                        &store
                    } else {
                        if own.is_none() || rng.chance(1, 20) {
                            let seen = synced.load(Ordering::Acquire);
                            let backend = [BackendKind::Auto, BackendKind::Pread][rng.below(2) as usize];
                            let h = Store::builder(&dir).backend(backend).open().expect("reader open");
                            assert!(h.len() >= seen, "{who}: opened {} records, {seen} were synced", h.len());
                            own = Some(h);
                            reopens += 1;
                        }
                        own.as_ref().expect("opened above")
                    };
                    records += gather_and_check(s, s.len(), &mut rng, &who);
                    gathers += 1;
                }
                (gathers, records, reopens)
            })
        })
        .collect();
    let mut totals = (0u64, 0u64, 0u64);
    for (t, r) in readers.into_iter().enumerate() {
        let (g, n, o) = r.join().unwrap_or_else(|_| panic!("reader {t} failed"));
        assert!(g > 0, "reader {t} never gathered");
        totals = (totals.0 + g, totals.1 + n, totals.2 + o);
    }
    stop.store(true, Ordering::Relaxed);
    let (appends, len) = writer.join().expect("writer failed");
    assert!(appends > 0 && len > INITIAL_RECORDS, "the writer never appended");
    drop(store);
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.len(), len);
    s.verify().expect("verify after the run");
    println!(
        "load: {READERS} readers, {} gathers of {} records, {} reader opens, {appends} appends to {len} records",
        totals.0, totals.1, totals.2
    );
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd").count()
}

#[test]
fn open_close_cycles_release_descriptors() {
    let _g = PROCESS_WIDE.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    {
        // Several chunks and a dictionary-free mix of codecs.
        let s = Store::builder(&dir).chunk_bytes(8 << 10).create().unwrap();
        append_ids(&s, 0..100, Codec::Zstd);
        append_ids(&s, 100..200, Codec::Raw);
        s.sync().unwrap();
    }
    let mut rng = Rng::new(11);
    let cycle = |rng: &mut Rng, k: usize| {
        let backend = [BackendKind::Auto, BackendKind::Pread][k % 2];
        let direct = matches!(k % 3, 0);
        let s = Store::builder(&dir).backend(backend).direct(direct).open().expect("open");
        gather_and_check(&s, s.len(), rng, "cycle");
        drop(s);
    };
    // Warm up: per-thread rings and the gather pool are created once and kept.
    for k in 0..6 {
        cycle(&mut rng, k);
    }
    let baseline = open_fds();
    for k in 0..OPEN_CLOSE_CYCLES {
        cycle(&mut rng, k);
    }
    let after = open_fds();
    println!("load: {OPEN_CLOSE_CYCLES} open/read/close cycles, descriptors {baseline} before, {after} after");
    assert_eq!(after, baseline, "open/close cycles leaked {} descriptors", after as i64 - baseline as i64);
}
