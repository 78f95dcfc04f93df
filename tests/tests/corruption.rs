//! Guarantee: damaged or foreign bytes on disk, and bad arguments, give a
//! typed error and never a panic or silently wrong data.
//!
//! Every byte of the head, the table and the chunk files of a store (one per
//! codec) is flipped in turn (sampled for the larger files) and files are
//! truncated; each time the store is opened read-only, verified and read. The
//! outcome must be a typed error (`Corrupted`, `ChecksumMismatch`,
//! `NotAStore`, `UnsupportedVersion`, or `Io` for a missing file), or success
//! with every record byte-identical to what was written (a flip in bytes no
//! live record uses). A flip inside a live record's bytes must be caught by
//! `verify()`. Then the API contract around it: wrong magic and version, a
//! chunk shorter than the table says, out-of-range indices, destination
//! buffers of the wrong size, a second writer (`Locked`), writes through a
//! read-only handle (`ReadOnly`), records over the size limit.
//!
//! Format stability: `tests/fixtures/v1-small/` is a version-1 store committed
//! to the repository (written once by `write_v1_small_fixture`, which is
//! ignored; see `tests/fixtures/README.md`). `v1_fixture_still_opens` keeps
//! opening it and checks every record, so a format change that breaks old
//! stores fails here.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use zring_engine::{Codec, Error, Store, FORMAT_VERSION, MAX_RECORD_BYTES};
use zring_tests::{copy_store, read_all, record, record_for, test_dir, train, CODECS};

/// Records in each codec's damaged store.
const RECORDS: u64 = 48;
/// Small chunks, so the store has sealed chunks and a tail.
const CHUNK_BYTES: u64 = 4096;
/// At most this many positions are flipped per file.
const FLIPS_PER_FILE: usize = 400;

/// Builds a store with `RECORDS` records in `codec` (ids 0..RECORDS, then
/// records 5 and 17 deleted, so some chunk bytes are dead) and returns its
/// contents in index order.
fn build(dir: &Path, codec: Codec) -> Vec<Vec<u8>> {
    let s = Store::builder(dir).codec(codec).chunk_bytes(CHUNK_BYTES).create().expect("create");
    if codec == Codec::ZstdDict {
        train(&s);
    }
    let recs: Vec<Vec<u8>> = (0..RECORDS).map(record_for).collect();
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    s.append(&refs, None).expect("append");
    s.sync().expect("sync");
    s.delete(&[5, 17]).expect("delete");
    let got = read_all(&s).expect("read back");
    assert_eq!(got.len() as u64, RECORDS - 2);
    got
}

fn store_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        // The writer's lock and the readers' pins hold no data: nothing there
        // can be damaged, only locked.
        .filter(|p| p.file_name().is_some_and(|n| n != "lock" && n != "pins"))
        .collect();
    v.sort();
    v
}

/// Whether `e` is one of the errors damaged bytes may produce.
fn is_damage_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Corrupted { .. }
            | Error::ChecksumMismatch { .. }
            | Error::NotAStore { .. }
            | Error::UnsupportedVersion { .. }
            | Error::Io { .. }
    )
}

/// Opens `dir` read-only, verifies and reads everything. `Ok` when the
/// store reads back exactly `want`, `Err` with the first error otherwise.
/// Panics (the test's failure) when the store reads back other bytes.
fn probe(dir: &Path, want: &[Vec<u8>]) -> Result<(), Error> {
    let s = Store::open(dir)?;
    s.stats()?;
    s.verify()?;
    let got = read_all(&s)?;
    assert!(got == want, "damaged store read back different bytes without an error");
    // One record at a time too, through fixed-stride gathers.
    for (i, w) in want.iter().enumerate() {
        let mut dst = vec![0u8; w.len() + 3];
        s.gather(&zring_engine::Gather::fixed(&[i as u64], w.len() + 3), &mut dst)?;
        assert_eq!(&dst[..w.len()], &w[..], "record {i} read back differently");
    }
    Ok(())
}

/// Runs `probe` and fails the test on a panic or an unexpected error kind.
fn probe_safely(dir: &Path, want: &[Vec<u8>], what: &str) -> Result<(), Error> {
    match catch_unwind(AssertUnwindSafe(|| probe(dir, want))) {
        Ok(Err(e)) => {
            assert!(is_damage_error(&e), "{what}: unexpected error kind: {e:?}");
            Err(e)
        }
        Ok(Ok(())) => Ok(()),
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{what}: panicked: {}", msg.unwrap_or_default());
        }
    }
}

/// Byte ranges of live records' stored bytes in each chunk file, from the
/// table (entry layout: offset u64, chunk u32, stored u32, ...).
fn live_ranges(dir: &Path) -> Vec<(String, u64, u64)> {
    let table = store_files(dir)
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("table-"))
        .expect("table file");
    let b = std::fs::read(table).expect("read table");
    b[64..]
        .chunks_exact(32)
        .map(|e| {
            let offset = u64::from_le_bytes(e[0..8].try_into().unwrap());
            let chunk = u32::from_le_bytes(e[8..12].try_into().unwrap());
            let stored = u64::from(u32::from_le_bytes(e[12..16].try_into().unwrap()));
            (format!("chunk-{chunk:06}.zr"), offset, offset + stored)
        })
        .collect()
}

fn flip(path: &Path, at: u64) {
    let f = OpenOptions::new().read(true).write(true).open(path).expect("open for flip");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read byte");
    b[0] ^= 0x5A;
    f.write_all_at(&b, at).expect("write byte");
}

#[test]
fn flipped_bytes_are_errors_or_harmless() {
    let tmp = test_dir();
    let (mut flips, mut errors, mut harmless) = (0usize, 0usize, 0usize);
    for codec in CODECS {
        let dir = tmp.path().join(codec.name());
        let want = build(&dir, codec);
        probe(&dir, &want).expect("undamaged store reads back");
        let live = live_ranges(&dir);
        for path in store_files(&dir) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let len = std::fs::metadata(&path).unwrap().len();
            let step = (len as usize).div_ceil(FLIPS_PER_FILE).max(1) as u64;
            for at in (0..len).step_by(step as usize) {
                flip(&path, at);
                let r = probe_safely(&dir, &want, &format!("{} store, {name} byte {at} flipped", codec.name()));
                flip(&path, at);
                flips += 1;
                let in_live =
                    name.starts_with("chunk-") && live.iter().any(|(c, s, e)| *c == name && (*s..*e).contains(&at));
                // These are covered by checksums: damage must be reported.
                let must_fail = in_live || name == "head.zr" || name.starts_with("table-") || name == "dict.zr";
                match r {
                    Err(e) => {
                        // The message says which file to restore.
                        assert!(
                            e.to_string().contains(&name),
                            "{} store: flip of {name} byte {at} gave an error naming no file: {e}",
                            codec.name()
                        );
                        errors += 1
                    }
                    Ok(()) => {
                        assert!(!must_fail, "{} store: flip of {name} byte {at} went unnoticed", codec.name());
                        harmless += 1;
                    }
                }
            }
        }
        probe(&dir, &want).expect("flips were undone");
    }
    println!("corruption: {flips} flips, {errors} typed errors, {harmless} in dead bytes read back intact");
    assert!(harmless > 0, "the stores were meant to have dead bytes (deleted records)");
}

#[test]
fn truncated_files_are_errors_or_harmless() {
    let tmp = test_dir();
    for codec in CODECS {
        let dir = tmp.path().join(codec.name());
        let want = build(&dir, codec);
        for path in store_files(&dir) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let len = std::fs::metadata(&path).unwrap().len();
            let original = std::fs::read(&path).unwrap();
            for cut in [0, 1, len / 3, len / 2, len.saturating_sub(33), len.saturating_sub(1)] {
                if cut >= len {
                    continue;
                }
                OpenOptions::new().write(true).open(&path).unwrap().set_len(cut).unwrap();
                let r =
                    probe_safely(&dir, &want, &format!("{} store, {name} cut to {cut} of {len} bytes", codec.name()));
                let only_dead =
                    name.starts_with("chunk-") && live_ranges(&dir).iter().all(|(c, _, e)| *c != name || *e <= cut);
                if !only_dead {
                    assert!(
                        r.is_err(),
                        "{} store: cutting {name} to {cut} of {len} bytes went unnoticed",
                        codec.name()
                    );
                }
                if let Err(e) = &r {
                    assert!(e.to_string().contains(&name), "{name} cut to {cut}: the error names no file: {e}");
                }
                // Recovery must refuse it too, not "repair" it into a different store.
                let w = catch_unwind(AssertUnwindSafe(|| Store::builder(&dir).open_writable().map(drop)));
                let w = w.unwrap_or_else(|_| {
                    panic!("{} store: open_writable panicked with {name} cut to {cut}", codec.name())
                });
                if let Err(e) = &w {
                    assert!(is_damage_error(e), "open_writable with {name} cut: unexpected {e:?}");
                    assert!(e.to_string().contains(&name), "open_writable with {name} cut: names no file: {e}");
                }
                std::fs::write(&path, &original).unwrap();
            }
            // A missing file.
            std::fs::remove_file(&path).unwrap();
            let r = probe_safely(&dir, &want, &format!("{} store, {name} removed", codec.name()));
            std::fs::write(&path, &original).unwrap();
            let only_dead = name.starts_with("chunk-") && live_ranges(&dir).iter().all(|(c, _, _)| *c != name);
            if !only_dead {
                assert!(r.is_err(), "{} store: removing {name} went unnoticed", codec.name());
            }
            if let Err(e) = &r {
                // A missing file is damage naming it, never a bare "file not found".
                assert!(matches!(e, Error::Corrupted { .. }), "{name} removed gave {e:?}");
                assert!(e.to_string().contains(&name), "{name} removed: the error names no file: {e}");
            }
        }
        probe(&dir, &want).expect("store restored");
    }
}

#[test]
fn wrong_magic_and_version_are_typed() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    build(&dir, Codec::Zstd);
    let head = dir.join("head.zr");
    let original = std::fs::read(&head).unwrap();

    let mut b = original.clone();
    b[0..4].copy_from_slice(b"NOPE");
    std::fs::write(&head, &b).unwrap();
    let e = Store::open(&dir).err().expect("wrong magic must not open");
    assert!(matches!(e, Error::NotAStore { .. }), "wrong magic gave {e:?}");
    let e = Store::builder(&dir).open_writable().err().expect("wrong magic must not open writable");
    assert!(matches!(e, Error::NotAStore { .. }), "wrong magic (writable) gave {e:?}");

    let mut b = original.clone();
    b[4..8].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&head, &b).unwrap();
    let e = Store::open(&dir).err().expect("future version must not open");
    assert!(
        matches!(e, Error::UnsupportedVersion { found, supported, .. } if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
        "future version gave {e:?}"
    );

    std::fs::write(&head, b"garbage").unwrap();
    assert!(matches!(Store::open(&dir), Err(Error::NotAStore { .. })));
    std::fs::write(&head, []).unwrap();
    assert!(matches!(Store::open(&dir), Err(Error::NotAStore { .. })));
    std::fs::write(&head, &original[..40]).unwrap();
    assert!(matches!(Store::open(&dir), Err(Error::Corrupted { .. })));

    // A table file whose header names another generation.
    std::fs::write(&head, &original).unwrap();
    Store::open(&dir).expect("head restored");
    let table = store_files(&dir).into_iter().find(|p| p.to_string_lossy().contains("table-")).unwrap();
    let t = std::fs::read(&table).unwrap();
    let mut bad = t.clone();
    bad[0] ^= 1;
    std::fs::write(&table, &bad).unwrap();
    assert!(matches!(Store::open(&dir), Err(Error::Corrupted { .. })));
    std::fs::write(&table, &t).unwrap();

    // Directories that hold no store.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(matches!(Store::open(&empty), Err(Error::NotAStore { .. })));
    assert!(matches!(Store::open(tmp.path().join("missing")), Err(Error::NotAStore { .. })));
    // create() over an existing store.
    assert!(matches!(Store::builder(&dir).create(), Err(Error::AlreadyExists { .. })));
}

#[test]
fn chunk_shorter_than_the_table_says() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let want = build(&dir, Codec::Raw);
    let chunks: Vec<PathBuf> =
        store_files(&dir).into_iter().filter(|p| p.to_string_lossy().contains("chunk-")).collect();
    assert!(chunks.len() >= 3, "expected sealed chunks and a tail, got {chunks:?}");

    // A sealed chunk: open succeeds (open does not scan), the reads it backs fail.
    let sealed = &chunks[0];
    let len = std::fs::metadata(sealed).unwrap().len();
    OpenOptions::new().write(true).open(sealed).unwrap().set_len(len / 2).unwrap();
    let s = Store::open(&dir).expect("open does not read chunks");
    let e = s.verify().expect_err("verify must notice the short chunk");
    assert!(matches!(e, Error::Corrupted { .. }), "short sealed chunk gave {e:?}");
    let mut dst = vec![0u8; want[0].len()];
    let e = s
        .gather(&zring_engine::Gather::fixed(&[0], want[0].len()), &mut dst)
        .expect_err("record 0 lies in the cut part");
    assert!(matches!(e, Error::Corrupted { .. }), "gather from a short chunk gave {e:?}");
    drop(s);

    // The tail chunk: shorter than the head's committed length.
    let dir2 = tmp.path().join("s2");
    build(&dir2, Codec::Raw);
    let tail = store_files(&dir2).into_iter().rfind(|p| p.to_string_lossy().contains("chunk-")).unwrap();
    let len = std::fs::metadata(&tail).unwrap().len();
    OpenOptions::new().write(true).open(&tail).unwrap().set_len(len - 1).unwrap();
    let e = Store::open(&dir2).err().expect("short tail must not open");
    assert!(matches!(e, Error::Corrupted { .. }), "short tail gave {e:?}");
    let e = Store::builder(&dir2).open_writable().err().expect("recovery must not accept a short tail");
    assert!(matches!(e, Error::Corrupted { .. }), "short tail (writable) gave {e:?}");
}

#[test]
fn bad_indices_and_buffers_are_typed_and_leave_dst_untouched() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let want = build(&dir, Codec::Zstd);
    let s = Store::open(&dir).unwrap();
    let n = s.len();
    let max = want.iter().map(Vec::len).max().unwrap();

    let mut dst = vec![0xABu8; 2 * max];
    let e = s.gather(&zring_engine::Gather::fixed(&[0, n], max), &mut dst).expect_err("index == len");
    assert!(matches!(e, Error::IndexOutOfRange { index, len } if index == n && len == n), "{e:?}");
    let e = s.gather(&zring_engine::Gather::fixed(&[u64::MAX, 0], max), &mut dst).expect_err("index u64::MAX");
    assert!(matches!(e, Error::IndexOutOfRange { index: u64::MAX, .. }), "{e:?}");
    assert!(dst.iter().all(|&b| b == 0xAB), "a failed gather wrote into dst");

    let mut out = [0u64; 1];
    assert!(matches!(s.lengths(&[n], &mut out), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(s.lengths(&[0, 1], &mut out), Err(Error::InvalidArgument(_))));
    assert!(matches!(s.record_len(n + 5), Err(Error::IndexOutOfRange { .. })));

    // Destination of the wrong size.
    for len in [0, 2 * max - 1, 2 * max + 1] {
        let mut d = vec![0u8; len];
        let e = s.gather(&zring_engine::Gather::fixed(&[0, 1], max), &mut d).expect_err("wrong dst size");
        assert!(matches!(e, Error::InvalidArgument(_)), "dst of {len} bytes gave {e:?}");
    }
    let e = s.gather(&zring_engine::Gather::fixed(&[0, 1], usize::MAX), &mut []).expect_err("overflowing stride");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    // A stride shorter than a record.
    let big = want.iter().position(|r| r.len() == max).unwrap() as u64;
    let mut d = vec![0xABu8; max - 1];
    let e = s.gather(&zring_engine::Gather::fixed(&[big], max - 1), &mut d).expect_err("stride too short");
    assert!(matches!(e, Error::RecordSize { record, slot, .. } if record == big && slot == (max - 1) as u64), "{e:?}");
    assert!(d.iter().all(|&b| b == 0xAB), "a failed gather wrote into dst");

    // Ragged gathers.
    let l0 = want[0].len() as u64;
    let mut d = vec![0xABu8; 3 * max];
    let e = s.gather(&zring_engine::Gather::ragged(&[0, 1], &[0]), &mut d).expect_err("offsets count");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    if l0 > 0 {
        let e = s.gather(&zring_engine::Gather::ragged(&[0, 1], &[0, l0 - 1]), &mut d).expect_err("overlap");
        assert!(matches!(e, Error::InvalidArgument(_)), "overlapping slots gave {e:?}");
    }
    let e = s
        .gather(&zring_engine::Gather::ragged(&[big], &[(3 * max - 1) as u64]), &mut d)
        .expect_err("slot past the end");
    assert!(matches!(e, Error::RecordSize { .. }), "{e:?}");
    let e = s.gather(&zring_engine::Gather::ragged(&[0, n], &[0, l0]), &mut d).expect_err("index out of range");
    assert!(matches!(e, Error::IndexOutOfRange { .. }), "{e:?}");
    assert!(d.iter().all(|&b| b == 0xAB), "a failed gather_var wrote into dst");

    // Bad arguments on the write side, and delete checks before changing anything.
    let w = Store::builder(&dir).open_writable().unwrap();
    assert!(matches!(w.append_fixed(&[0u8; 10], 3, None), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.append_fixed(&[0u8; 10], 0, None), Err(Error::InvalidArgument(_))));
    let e = w.delete(&[0, n]).expect_err("delete out of range");
    assert!(matches!(e, Error::IndexOutOfRange { .. }), "{e:?}");
    assert_eq!(w.len(), n, "a failed delete removed records");
    assert_eq!(read_all(&w).unwrap(), want);
    let e = w.append(&[b"x".as_slice()], Some(Codec::ZstdDict)).expect_err("no dictionary");
    assert!(matches!(e, Error::NoDictionary), "{e:?}");
    assert!(matches!(w.train_dict(&[], 4096), Err(Error::InvalidArgument(_))));
}

#[test]
fn one_writer_at_a_time_and_read_only_refuses_writes() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let want = build(&dir, Codec::Raw);
    let w = Store::builder(&dir).open_writable().expect("first writer");
    let e = Store::builder(&dir).open_writable().err().expect("second writer must be refused");
    assert!(matches!(e, Error::Locked { .. }), "second writer gave {e:?}");
    // Readers are never blocked by the writer.
    let r = Store::open(&dir).expect("reader beside a writer");
    assert!(!r.is_writable());
    assert!(matches!(r.append(&[b"x".as_slice()], None), Err(Error::ReadOnly(_))));
    assert!(matches!(r.append_fixed(&[0u8; 4], 2, None), Err(Error::ReadOnly(_))));
    assert!(matches!(r.delete(&[0]), Err(Error::ReadOnly(_))));
    assert!(matches!(r.compact(), Err(Error::ReadOnly(_))));
    assert!(matches!(r.sync(), Err(Error::ReadOnly(_))));
    assert!(matches!(r.set_schema("{}"), Err(Error::ReadOnly(_))));
    let samples = zring_tests::dict_samples();
    let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
    assert!(matches!(r.train_dict(&refs, 4096), Err(Error::ReadOnly(_))));
    assert_eq!(read_all(&r).unwrap(), want, "refused writes changed the store");
    drop(w);
    // The lock goes with the writer.
    Store::builder(&dir).open_writable().expect("lock released on drop");
}

#[test]
fn records_over_the_limit_are_refused() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    let s = Store::builder(&dir).codec(Codec::Raw).create().unwrap();
    s.append(&[b"before".as_slice()], None).unwrap();
    // Zeroed allocations are mapped lazily: this costs address space, not memory,
    // as long as nothing reads it (the length check comes first).
    let huge = vec![0u8; MAX_RECORD_BYTES as usize + 1];
    let e = s.append(&[b"ok".as_slice(), &huge], None).expect_err("a record over the limit");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    drop(huge);
    assert_eq!(s.len(), 1, "a refused append added records");
    s.sync().unwrap();
    assert_eq!(read_all(&s).unwrap(), vec![b"before".to_vec()]);
}

/// Rewrites `dir/head.zr` with `edit` applied to its bytes and a valid
/// checksum, as a damaged-but-self-consistent head (or a hostile one) would be.
fn rewrite_head(dir: &Path, edit: impl FnOnce(&mut [u8])) {
    let p = dir.join("head.zr");
    let mut b = std::fs::read(&p).unwrap();
    edit(&mut b);
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
}

/// Opens `dir` read-only and writable, expecting a typed error and no panic.
fn expect_typed_open_error(dir: &Path, what: &str) {
    for writable in [false, true] {
        let r = catch_unwind(AssertUnwindSafe(|| {
            if writable {
                Store::builder(dir).open_writable().map(drop)
            } else {
                Store::open(dir).map(drop)
            }
        }));
        match r {
            Err(_) => panic!("{what}: open (writable {writable}) panicked"),
            Ok(Ok(())) => panic!("{what}: open (writable {writable}) succeeded"),
            Ok(Err(e)) => assert!(matches!(e, Error::Corrupted { .. }), "{what}: writable {writable} gave {e:?}"),
        }
    }
}

/// Regression (found by fuzz/table_open): a head whose checksum is valid but
/// whose record count makes `64 + records * 32` overflow u64 panicked in
/// `Table::open_native` ("attempt to multiply with overflow") with overflow
/// checks on, and with them off wrapped to a small size that passed the
/// length check. Guarantee: a head naming an impossible table size is
/// `Corrupted`.
#[test]
fn head_with_overflowing_record_count_is_corrupted() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    build(&dir, Codec::Raw);
    for records in [u64::MAX, u64::MAX / 32 + 1, 1 << 59] {
        rewrite_head(&dir, |b| b[16..24].copy_from_slice(&records.to_le_bytes()));
        expect_typed_open_error(&dir, &format!("records = {records}"));
    }
}

/// Regression (found while fuzzing heads): `chunk_base + chunk_count` is
/// computed in u32 without a check, so a checksum-valid head with a chunk
/// base near u32::MAX panics on open (overflow) instead of reporting damage.
#[test]
fn head_with_overflowing_chunk_range_is_corrupted() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    build(&dir, Codec::Raw);
    rewrite_head(&dir, |b| b[24..28].copy_from_slice(&u32::MAX.to_le_bytes()));
    expect_typed_open_error(&dir, "chunk_base = u32::MAX");
}

// ---- format fixture ----

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join("v1-small")
}

/// Ids of the fixture's records, in index order, and each record's contents.
/// Records 0..40 are appended (codec by id: raw, zstd, zstd_dict in turn),
/// 3 and 10 deleted (swap-last), the store compacted, 40..45 appended.
fn fixture_expected() -> Vec<(u64, Vec<u8>)> {
    let mut ids: Vec<u64> = (0..40).collect();
    for i in [10usize, 3] {
        ids.swap_remove(i);
    }
    ids.extend(40..45);
    ids.into_iter().map(|id| (id, fixture_record(id))).collect()
}

fn fixture_record(id: u64) -> Vec<u8> {
    // Lengths 0..=300 bytes, including an empty record (id 0).
    record(id, (id as usize * 37) % 301)
}

fn fixture_codec(id: u64) -> Codec {
    CODECS[id as usize % 3]
}

#[test]
#[ignore = "writes tests/fixtures/v1-small; run by hand only when the fixture must be made again"]
fn write_v1_small_fixture() {
    let tmp = test_dir();
    let dir = tmp.path().join("v1-small");
    let s = Store::builder(&dir).chunk_bytes(1024).create().unwrap();
    train(&s);
    for id in 0..40u64 {
        s.append(&[&fixture_record(id)], Some(fixture_codec(id))).unwrap();
    }
    s.sync().unwrap();
    s.delete(&[3, 10]).unwrap();
    s.compact().unwrap();
    for id in 40..45u64 {
        s.append(&[&fixture_record(id)], Some(fixture_codec(id))).unwrap();
    }
    s.sync().unwrap();
    drop(s);
    let out = fixture_dir();
    if out.exists() {
        std::fs::remove_dir_all(&out).unwrap();
    }
    copy_store(&dir, &out);
}

fn check_fixture(s: &Store) {
    let want = fixture_expected();
    assert_eq!(s.len(), want.len() as u64);
    let got = read_all(s).expect("read the fixture");
    for (i, ((id, w), g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g, w, "fixture record {i} (id {id}) differs");
    }
    let st = s.stats().unwrap();
    assert!(st.has_dict);
    assert!(st.zstd_dict_records > 0 && st.zstd_records > 0 && st.raw_records > 0, "{st:?}");
    assert_eq!(st.raw_records + st.zstd_records + st.zstd_dict_records, want.len() as u64);
    assert!(st.chunks > 1, "the fixture spans several chunks: {st:?}");
    assert_eq!(s.verify().unwrap().records, want.len() as u64);
}

#[test]
fn v1_fixture_still_opens() {
    let dir = fixture_dir();
    assert!(dir.join("head.zr").exists(), "missing fixture {}; see tests/fixtures/README.md", dir.display());
    let head = std::fs::read(dir.join("head.zr")).unwrap();
    assert_eq!(&head[0..4], b"ZRNG");
    assert_eq!(u32::from_le_bytes(head[4..8].try_into().unwrap()), 1, "the fixture is format version 1");
    // Read-only, in place (opening read-only writes nothing).
    let s = Store::open(&dir).expect("open the v1 fixture");
    check_fixture(&s);
    drop(s);
    // Writable, on a copy: recovery accepts it and it takes new records.
    let tmp = test_dir();
    let copy = tmp.path().join("v1");
    copy_store(&dir, &copy);
    let w = Store::builder(&copy).open_writable().expect("open the fixture writable");
    check_fixture(&w);
    let at = w.append(&[b"new".as_slice()], Some(Codec::ZstdDict)).unwrap();
    w.sync().unwrap();
    drop(w);
    let r = Store::open(&copy).unwrap();
    let mut d = [0u8; 3];
    r.gather(&zring_engine::Gather::fixed(&[at], 3), &mut d).unwrap();
    assert_eq!(&d, b"new");
}

// ---- a store without its head ----

/// Every file of `dir` (recursively) and its bytes.
fn snapshot_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(snapshot_bytes(&p));
        } else if p.file_name().is_some_and(|n| n != "lock" && n != "pins") {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

/// Regression: a writer open of a directory whose `head.zr` was removed took
/// it for an empty directory and laid out a new store there, truncating
/// `chunk-000000.zr` and `table-000001.zr` (a 400-record store lost every
/// record). Guarantee: `open_writable` and `create` on a directory holding
/// store files but no head are `Corrupted` naming the directory and what is
/// missing, and every byte of every file is unchanged; a reader gets the
/// same error. Layouts: each codec (the dictionary store has `dict.zr`), a
/// format-2 table after `compact_to(2)`, and a store with `schema.json`.
#[test]
fn writer_open_without_head_changes_no_byte() {
    let tmp = test_dir();
    let mut dirs = Vec::new();
    for codec in CODECS {
        let dir = tmp.path().join(codec.name());
        build(&dir, codec);
        dirs.push(dir);
    }
    let f2 = tmp.path().join("format2");
    {
        let s = Store::builder(&f2).codec(Codec::Raw).chunk_bytes(CHUNK_BYTES).create().unwrap();
        let recs = vec![7u8; 16 * 400];
        s.append_fixed(&recs, 16, None).unwrap();
        s.set_schema("{\"format\": \"loaderx-zrecord\", \"dtype\": \"<f4\", \"shape\": [4]}").unwrap();
        s.compact_to(2).unwrap();
        assert_eq!(s.table_format().0, 2);
    }
    dirs.push(f2);
    for dir in dirs {
        std::fs::remove_file(dir.join("head.zr")).unwrap();
        let before = snapshot_bytes(&dir);
        assert!(before.iter().any(|(p, b)| p.to_string_lossy().contains("chunk-") && !b.is_empty()));
        for how in ["open_writable", "create", "open"] {
            let r = match how {
                "open_writable" => Store::builder(&dir).open_writable(),
                "create" => Store::builder(&dir).create(),
                _ => Store::open(&dir),
            };
            let e = r.err().unwrap_or_else(|| panic!("{how} of {} without head.zr succeeded", dir.display()));
            assert!(matches!(e, Error::Corrupted { .. }), "{how}: {e:?}");
            let msg = e.to_string();
            assert!(
                msg.contains(&dir.display().to_string()) && msg.contains("no head.zr but") && msg.contains("restore"),
                "{how}: {msg}"
            );
            assert_eq!(snapshot_bytes(&dir), before, "{how} of {} changed its files", dir.display());
        }
    }
}

/// A create interrupted before its first head leaves an empty table and an
/// empty chunk 0 and nothing else: no record is lost by laying the store
/// out again, so that directory still opens writable.
#[test]
fn an_interrupted_create_is_laid_out_again() {
    let tmp = test_dir();
    let dir = tmp.path().join("s");
    drop(Store::builder(&dir).create().unwrap());
    std::fs::remove_file(dir.join("head.zr")).unwrap();
    let s = Store::builder(&dir).open_writable().expect("an empty unborn store opens writable");
    s.append(&[b"x".as_slice()], None).unwrap();
    s.sync().unwrap();
    assert_eq!(s.len(), 1);
}
