//! A full disk during an append (ENOSPC injected at the write; run with
//! `cargo test -p zring-engine --features fault-injection --test full_disk`).
//! Its own binary: an armed fault is global to the process, and would fire in
//! the tests of `faults.rs` running alongside.

use zring_engine::fault::{self, Kind};
use zring_engine::{Codec, Error, Store};

#[path = "common/workload.rs"]
mod workload;
use workload::{append, ids, rec};

/// A failed append on a full disk used to keep the bytes it had written
/// (and those of earlier unsynced appends) on disk until the store was next
/// opened for writing; the handle's `len()` counted records never saved,
/// the error named the directory, and `close()` then failed with
/// `Poisoned`, hiding the disk-full error from a `with` block. Now the
/// failure gives the unsynced space back at once, `len()` is what is saved,
/// the error names the file, and `close()` does not add an error of its own.
#[test]
fn a_failed_append_gives_its_space_back_and_len_is_what_is_saved() {
    let dir = tempfile::tempdir().unwrap();
    let files = |d: &std::path::Path| -> u64 {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("chunk-") || n.starts_with("table-")
            })
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let store = Store::builder(dir.path()).chunk_bytes(64 << 10).create().unwrap();
    append(&store, 0..2500).unwrap();
    let saved = files(dir.path());
    // Unsynced appends that begin new chunks, then a full disk.
    for k in 0..10 {
        let recs: Vec<Vec<u8>> = (2500 + k * 700..2500 + (k + 1) * 700).map(rec).collect();
        store.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), Some(Codec::Raw)).unwrap();
    }
    assert_eq!(store.len(), 9500);
    assert!(files(dir.path()) > saved + (1 << 20));
    fault::arm_from(Kind::Write, 1, libc::ENOSPC);
    let recs: Vec<Vec<u8>> = (9500..10_000).map(rec).collect();
    let e = store.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), Some(Codec::Raw)).unwrap_err();
    fault::disarm();
    let Error::Io { op: "write", path, source } = &e else { panic!("{e:?}") };
    assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(name.starts_with("chunk-") || name.starts_with("table-"), "the error names {}", path.display());
    assert!(e.to_string().contains(&*name), "{e}");
    // What is saved, and the space of the rest given back.
    assert_eq!(store.len(), 2500);
    assert_eq!(files(dir.path()), saved);
    assert_eq!(ids(&store), (0..2500).collect::<Vec<_>>());
    assert!(matches!(store.sync(), Err(Error::Poisoned(_))));
    store.close().unwrap();
    drop(store);
    let store = Store::builder(dir.path()).open_writable().unwrap();
    store.verify().unwrap();
    assert_eq!(ids(&store), (0..2500).collect::<Vec<_>>());
}
