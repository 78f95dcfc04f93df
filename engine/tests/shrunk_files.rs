//! Files that shrink under an open store give errors, not SIGBUS.
//!
//! Hot records are copied straight out of read-only mappings of the chunk
//! files, and the record table is mapped too. When one of those files shrinks
//! while a store has it mapped (another program truncates it, a network file
//! system drops it, the disk cannot read a page back), touching the lost pages
//! raised SIGBUS and the process died with signal 7 (issue 12, item 4). The
//! guarantee: the gather returns a typed error naming the damage, the process
//! lives, records whose bytes are still in the file keep reading correctly
//! (through the file, since a mapping that faulted is never read again), and a
//! SIGBUS that has nothing to do with the store still ends the process as
//! before.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use zring_engine::{BackendKind, Codec, Error, Store};

/// 12 KiB records: three pages each, so a record past the new end of a
/// page-aligned cut has every page gone.
const REC: usize = 12 << 10;
/// Enough records for a gather to use the residency bitmap (16 or more) and
/// the decode pool (128 KiB or more).
const N: u64 = 64;

/// Record `i`: no zero bytes, so zeros read from a faulted mapping can never
/// pass for it.
fn record(i: u64) -> Vec<u8> {
    (0..REC).map(|k| ((i as usize * 31 + k) % 251) as u8 + 1).collect()
}

fn backends() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Pread];
    if Store::builder(tempfile::tempdir().unwrap().path()).backend(BackendKind::Uring).create().is_ok() {
        v.push(BackendKind::Uring);
    } else if std::env::var("ZRING_REQUIRE_URING").as_deref() == Ok("1") {
        panic!("io_uring is required (ZRING_REQUIRE_URING=1) but unavailable");
    } else {
        eprintln!("io_uring unavailable here: testing pread only");
    }
    v
}

/// A synced raw store of `N` records, and a reader on it with mappings on
/// whose pages are all resident and remembered (one gather of everything).
fn store_and_reader(dir: &Path, backend: BackendKind) -> Store {
    let writer = Store::builder(dir).codec(Codec::Raw).create().unwrap();
    let recs: Vec<Vec<u8>> = (0..N).map(record).collect();
    let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
    writer.append(&refs, None).unwrap();
    writer.sync().unwrap();
    drop(writer);
    let reader = Store::builder(dir).backend(backend).mmap(true).direct(false).open().unwrap();
    let all: Vec<u64> = (0..N).collect();
    check(&reader, &all);
    check(&reader, &all);
    check(&reader, &[3]);
    reader
}

/// Gathers `indices` and checks every record's bytes.
fn check(store: &Store, indices: &[u64]) {
    let mut out = vec![0u8; indices.len() * REC];
    store.gather(&zring_engine::Gather::fixed(indices, REC), &mut out).unwrap();
    for (k, &i) in indices.iter().enumerate() {
        assert!(out[k * REC..(k + 1) * REC] == record(i), "record {i} read back wrong");
    }
}

fn gather_err(store: &Store, indices: &[u64]) -> Error {
    let mut out = vec![0u8; indices.len() * REC];
    store
        .gather(&zring_engine::Gather::fixed(indices, REC), &mut out)
        .expect_err("a gather over a shrunk file succeeded")
}

fn only_file(dir: &Path, prefix: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "{prefix}* files: {found:?}");
    found.pop().unwrap()
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// The error of a read that met a shrunk chunk: the file, read through the
/// I/O backend, ends early (Corrupted, naming it) or fails (Io, naming it);
/// zeros copied from the faulted mapping fail their checksum.
fn assert_chunk_error(err: &Error, chunk: &Path) {
    let name = chunk.file_name().unwrap().to_str().unwrap();
    match err {
        Error::Corrupted { what, detail } => {
            assert!(format!("{what}: {detail}").contains(name), "{err} does not name {name}")
        }
        Error::Io { path, .. } => assert_eq!(path, chunk, "{err}"),
        Error::ChecksumMismatch { .. } => {}
        other => panic!("a shrunk chunk gave {other:?}"),
    }
}

#[test]
fn a_chunk_cut_in_half_under_a_reader_is_an_error_and_the_first_half_still_reads() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let reader = store_and_reader(dir.path(), backend);
        let chunk = only_file(dir.path(), "chunk-");
        truncate(&chunk, N / 2 * REC as u64);
        let all: Vec<u64> = (0..N).collect();
        assert_chunk_error(&gather_err(&reader, &all), &chunk);
        // Alone, through the file: past the new end is "ends after".
        let err = gather_err(&reader, &[N - 1]);
        assert!(matches!(err, Error::Corrupted { .. }), "{backend:?}: {err:?}");
        assert_chunk_error(&err, &chunk);
        let err = gather_err(&reader, &(N / 2..N).collect::<Vec<_>>());
        assert!(matches!(err, Error::Corrupted { .. }), "{backend:?}: {err:?}");
        // Bytes still in the file read correctly, through the file.
        check(&reader, &(0..N / 2).collect::<Vec<_>>());
        check(&reader, &[0, N / 2 - 1]);
    }
}

#[test]
fn a_chunk_cut_to_nothing_under_a_reader_is_an_error_for_every_gather() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let reader = store_and_reader(dir.path(), backend);
        let chunk = only_file(dir.path(), "chunk-");
        truncate(&chunk, 0);
        let all: Vec<u64> = (0..N).collect();
        assert_chunk_error(&gather_err(&reader, &all), &chunk);
        for indices in [&all[..], &all[..20], &[0][..], &[N - 1][..]] {
            let err = gather_err(&reader, indices);
            assert!(matches!(err, Error::Corrupted { .. }), "{backend:?}: {err:?}");
            assert_chunk_error(&err, &chunk);
        }
    }
}

/// With the record cache in front of O_DIRECT reads (a budget of half the
/// data), a chunk cut under the reader: records the cache holds are still its
/// verified committed bytes; every other record past the cut is an error.
#[test]
fn a_chunk_cut_under_a_reader_with_the_record_cache_is_an_error_past_the_cut() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        drop(store_and_reader(dir.path(), backend));
        let budget = N * REC as u64 / 2;
        let reader = Store::builder(dir.path()).backend(backend).cache_bytes(budget).open().unwrap();
        let all: Vec<u64> = (0..N).collect();
        check(&reader, &all);
        check(&reader, &all);
        let stats = reader.read_stats();
        assert_eq!(stats.policy, "direct", "{stats:?}");
        assert!(stats.cache_hits > 0, "{stats:?}");
        let chunk = only_file(dir.path(), "chunk-");
        truncate(&chunk, N / 2 * REC as u64);
        assert_chunk_error(&gather_err(&reader, &all), &chunk);
        for i in 0..N {
            let mut out = vec![0u8; REC];
            match reader.gather(&zring_engine::Gather::fixed(&[i], REC), &mut out) {
                Ok(()) => assert!(out == record(i), "{backend:?}: record {i} read back wrong"),
                Err(e) => {
                    assert!(i >= N / 2, "{backend:?}: record {i} before the cut failed: {e}");
                    assert_chunk_error(&e, &chunk);
                }
            }
        }
    }
}

#[test]
fn a_table_cut_under_a_reader_is_corrupted_naming_the_table() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let reader = store_and_reader(dir.path(), backend);
        let table = only_file(dir.path(), "table-");
        let name = table.file_name().unwrap().to_str().unwrap().to_owned();
        let all: Vec<u64> = (0..N).collect();
        let assert_shrank = |err: Error| match err {
            Error::Corrupted { what, detail } => {
                assert!(what.contains(&name), "{what}: {detail}");
                assert!(detail.contains("shrank"), "{what}: {detail}");
            }
            other => panic!("{backend:?}: a shrunk table gave {other:?}"),
        };
        // The 64-byte header and the first half of the 32-byte entries stay.
        // The cut is inside the table's only page, which stays mapped: the
        // entries past it read as zeros, without a fault.
        truncate(&table, 64 + 32 * (N / 2));
        assert_shrank(gather_err(&reader, &all));
        assert_shrank(gather_err(&reader, &[N - 1]));
        assert_shrank(reader.record_len(N / 2).unwrap_err());
        check(&reader, &(0..N / 2).collect::<Vec<_>>());
        // Cut to nothing: the mapped page is gone, and reading it faults.
        truncate(&table, 0);
        assert_shrank(gather_err(&reader, &[0]));
        assert_shrank(gather_err(&reader, &all));
    }
}

/// Run by `a_sigbus_outside_the_store_still_ends_the_process` in a child
/// process: with the guard installed (a store read through its mappings), a
/// mapping zring does not own is cut and touched.
#[test]
#[ignore = "run in a child process by a_sigbus_outside_the_store_still_ends_the_process"]
fn child_touches_a_foreign_shrunk_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let _reader = store_and_reader(dir.path(), BackendKind::Pread);
    let path = dir.path().join("foreign");
    std::fs::write(&path, vec![1u8; 1 << 16]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads a valid rlimit; it only stops a core dump.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    // SAFETY: a fresh read-only shared mapping of an open file; nothing else
    // uses the address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            1 << 16,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    truncate(&path, 0);
    // SAFETY: `p` is a live mapping of 64 KiB; reading its last byte after the
    // file shrank raises SIGBUS, which this test means to provoke.
    let byte = unsafe { std::ptr::read_volatile((p as *const u8).add((1 << 16) - 1)) };
    println!("read {byte} from a page the file no longer has");
}

#[test]
fn a_sigbus_outside_the_store_still_ends_the_process() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_touches_a_foreign_shrunk_mapping", "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
