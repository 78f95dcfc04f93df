//! Guarantee: the I/O path does not change the bytes. The io_uring and pread
//! backends, with O_DIRECT reads on and off, return byte-for-byte the records
//! that were appended, through fixed-stride and ragged gathers, for every
//! codec, record sizes from 0 B to 8 MiB, and batches of 1 to 1000 records
//! (with repeated indices and ragged slots given out of order).
//!
//! pread is the reference backend. io_uring is probed first; where the kernel
//! or a container's seccomp profile refuses rings, the io_uring cases are
//! skipped with the reason printed, unless `ZRING_REQUIRE_URING=1`, which
//! turns the skip into a failure (for machines that must exercise it).

use std::path::Path;

use zring_engine::{BackendKind, Codec, Error, Store};
use zring_tests::{record, test_dir, train, Rng, CODECS};

/// Sizes that sit on the edges that matter: empty, one byte, O_DIRECT's 512 B
/// and 4 KiB alignment, and large records up to 8 MiB.
const SMALL_SIZES: [usize; 12] = [0, 1, 2, 7, 100, 511, 512, 513, 4095, 4096, 4097, 9000];
const LARGE_SIZES: [usize; 6] = [0, 1, 65_537, 1 << 20, (4 << 20) + 3, 8 << 20];
const SMALL_RECORDS: u64 = 1200;
const BATCHES: [usize; 7] = [1, 2, 3, 17, 64, 256, 1000];
const SEED: u64 = 0xBAC_4E7D;

/// Whether io_uring may be used here: `Ok` or the reason it may not. With
/// `ZRING_REQUIRE_URING=1`, unavailability fails the test.
fn uring(dir: &Path) -> Result<(), String> {
    let probe = dir.join("probe");
    Store::builder(&probe).create().expect("probe store");
    let r = match Store::builder(&probe).backend(BackendKind::Uring).open() {
        Ok(s) => {
            assert_eq!(s.backend(), BackendKind::Uring);
            Ok(())
        }
        Err(Error::Io { source, .. }) => Err(source.to_string()),
        Err(e) => panic!("probing io_uring gave an unexpected error: {e}"),
    };
    if let Err(why) = &r {
        assert!(std::env::var("ZRING_REQUIRE_URING").as_deref() != Ok("1"), "ZRING_REQUIRE_URING=1 but {why}");
        println!("skipping the io_uring cases: {why}");
    }
    r
}

/// The configurations to compare: pread always, io_uring where available,
/// each with O_DIRECT off and on.
fn configs(dir: &Path) -> Vec<(BackendKind, bool)> {
    let mut v = vec![(BackendKind::Pread, false), (BackendKind::Pread, true)];
    if uring(dir).is_ok() {
        v.extend([(BackendKind::Uring, false), (BackendKind::Uring, true)]);
    }
    v
}

/// Record `i` of a store: content seeded by `i`, length from `sizes`.
fn build(dir: &Path, codec: Codec, lens: &[usize]) -> Vec<Vec<u8>> {
    let s = Store::builder(dir).codec(codec).chunk_bytes(4 << 20).create().expect("create");
    if codec == Codec::ZstdDict {
        train(&s);
    }
    let recs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &len)| record(i as u64, len)).collect();
    for part in recs.chunks(100) {
        let refs: Vec<&[u8]> = part.iter().map(Vec::as_slice).collect();
        s.append(&refs, None).expect("append");
    }
    s.sync().expect("sync");
    recs
}

/// Gathers `batch` from `s` both ways and checks every byte against `want`.
fn check_batch(s: &Store, want: &[Vec<u8>], batch: &[u64], rng: &mut Rng, what: &str) {
    // Fixed stride: the largest record, sometimes with slack that must be zeroed.
    let max = batch.iter().map(|&i| want[i as usize].len()).max().unwrap_or(0);
    let stride = max + if rng.chance(1, 2) { 0 } else { rng.range(1, 9) as usize };
    let mut dst = vec![0xEEu8; batch.len() * stride];
    s.gather(&zring_engine::Gather::fixed(batch, stride), &mut dst).unwrap_or_else(|e| panic!("{what}: gather: {e}"));
    for (k, &i) in batch.iter().enumerate() {
        let slot = &dst[k * stride..(k + 1) * stride];
        let w = &want[i as usize];
        assert!(slot[..w.len()] == w[..], "{what}: fixed gather, slot {k} (record {i}, {} bytes) differs", w.len());
        assert!(slot[w.len()..].iter().all(|&b| b == 0), "{what}: fixed gather, slot {k} padding not zeroed");
    }

    // Ragged: slots with small gaps, handed out in a shuffled order.
    let mut lens = vec![0u64; batch.len()];
    s.lengths(batch, &mut lens).unwrap_or_else(|e| panic!("{what}: lengths: {e}"));
    for (&i, &l) in batch.iter().zip(&lens) {
        assert_eq!(l, want[i as usize].len() as u64, "{what}: length of record {i}");
    }
    let mut order: Vec<usize> = (0..batch.len()).collect();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.below(k as u64 + 1) as usize);
    }
    let mut offsets = vec![0u64; batch.len()];
    let mut at = 0u64;
    for &k in &order {
        // An empty slot never shares its offset with another slot here: that
        // case is `empty_records_in_prefix_sum_layout` below.
        at += rng.below(4) + u64::from(lens[k] == 0);
        offsets[k] = at;
        at += lens[k] + u64::from(lens[k] == 0);
    }
    let mut dst = vec![0xEEu8; at as usize + 2];
    s.gather(&zring_engine::Gather::ragged(batch, &offsets), &mut dst)
        .unwrap_or_else(|e| panic!("{what}: gather_var: {e}; batch {batch:?} offsets {offsets:?} lens {lens:?}"));
    for (k, &i) in batch.iter().enumerate() {
        let w = &want[i as usize];
        let o = offsets[k] as usize;
        assert!(
            dst[o..o + w.len()] == w[..],
            "{what}: ragged gather, slot {k} (record {i}, {} bytes) differs",
            w.len()
        );
    }
}

fn run(lens: &[usize], batches: &[usize], label: &str) {
    let tmp = test_dir();
    let configs = configs(tmp.path());
    let mut gathers = 0usize;
    for codec in CODECS {
        let dir = tmp.path().join(codec.name());
        let want = build(&dir, codec, lens);
        // Buffered reads run twice: through the backend (mmap off) and from the
        // chunk mappings where pages are resident (mmap on).
        let runs =
            configs.iter().flat_map(|&(b, d)| [(b, d, false), (b, d, true)].into_iter().take(if d { 1 } else { 2 }));
        for (backend, direct, mmap) in runs {
            let s = Store::builder(&dir).backend(backend).direct(direct).mmap(mmap).open().expect("open");
            assert_eq!(s.backend(), backend);
            if direct && !s.is_direct() {
                println!("{label}: O_DIRECT is not supported by the file system under {}", dir.display());
            }
            let what =
                format!("{label} {} store, {} direct={} mmap={mmap}", codec.name(), backend.name(), s.is_direct());
            // Same seed for every configuration: the same batches are compared.
            let mut rng = Rng::new(SEED ^ codec as u64);
            for &n in batches {
                let batch: Vec<u64> = (0..n).map(|_| rng.below(want.len() as u64)).collect();
                check_batch(&s, &want, &batch, &mut rng, &format!("{what}, batch of {n}"));
                gathers += 2;
            }
            // Every record once, in order.
            let all: Vec<u64> = (0..want.len() as u64).collect();
            check_batch(&s, &want, &all, &mut rng, &format!("{what}, every record"));
            let rep = s.verify().unwrap_or_else(|e| panic!("{what}: verify: {e}"));
            assert_eq!(rep.records, want.len() as u64);
            gathers += 2;
        }
    }
    let names: Vec<String> =
        configs.iter().map(|(b, d)| format!("{}{}", b.name(), if *d { "+direct" } else { "" })).collect();
    println!("backends {label}: {gathers} gathers identical across {}", names.join(", "));
}

#[test]
fn small_records_identical_across_backends() {
    let mut rng = Rng::new(SEED);
    let lens: Vec<usize> =
        (0..SMALL_RECORDS).map(|_| SMALL_SIZES[rng.below(SMALL_SIZES.len() as u64) as usize]).collect();
    run(&lens, &BATCHES, "small");
}

#[test]
fn large_records_identical_across_backends() {
    run(&LARGE_SIZES, &[1, 2, 6, 10], "large");
}

#[test]
fn auto_picks_uring_when_available() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    build(&dir, Codec::Raw, &[3, 4]);
    let s = Store::builder(&dir).backend(BackendKind::Auto).open().unwrap();
    // ZRING_BACKEND overrides Auto for the whole process.
    match (uring(tmp.path()), std::env::var("ZRING_BACKEND").ok().as_deref()) {
        (_, Some("pread")) | (Err(_), _) => assert_eq!(s.backend(), BackendKind::Pread),
        (Ok(()), _) => assert_eq!(s.backend(), BackendKind::Uring),
    }
    assert_eq!(s.stats().unwrap().backend, s.backend().name());
}

/// Regression: `gather_var` rejected the layout every caller builds first,
/// slots packed back to back (offsets the prefix sum of the lengths), when
/// the batch holds an empty record: the empty slot shares its offset with the
/// next slot. `gather_var` sorts slots by offset alone (an unstable sort), so
/// when the indices are not listed in slot order it may see the non-empty slot
/// first and call the empty one "overlapping". An empty slot overlaps nothing.
#[test]
fn empty_records_in_prefix_sum_layout() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let lens: Vec<usize> = (0..64).map(|i| if i % 3 == 0 { 0 } else { 5 }).collect();
    let want = build(&dir, Codec::Raw, &lens);
    let s = Store::open(&dir).unwrap();
    // Slots packed in index order; the batch lists the records shuffled.
    let mut packed = Vec::with_capacity(want.len());
    let mut at = 0u64;
    for w in &want {
        packed.push(at);
        at += w.len() as u64;
    }
    let mut rng = Rng::new(SEED);
    for round in 0..20 {
        let mut batch: Vec<u64> = (0..want.len() as u64).collect();
        for k in (1..batch.len()).rev() {
            batch.swap(k, rng.below(k as u64 + 1) as usize);
        }
        let offsets: Vec<u64> = batch.iter().map(|&i| packed[i as usize]).collect();
        let mut dst = vec![0u8; at as usize];
        s.gather(&zring_engine::Gather::ragged(&batch, &offsets), &mut dst)
            .unwrap_or_else(|e| panic!("round {round}: packed slots with empty records: {e}"));
        assert_eq!(dst, want.concat(), "round {round}");
    }
}
