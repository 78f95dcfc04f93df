//! Snapshot pins keep a reader's own chunks only, and superseded chunks go
//! when the last handle over them closes.
//!
//! A reader used to pin every chunk id from its snapshot's first to
//! infinity, so it kept the output of every later compaction too: with one
//! reader alive and 4 MiB of live data, four delete + compact rounds left
//! 20 MiB of chunk files. And chunks a reader kept stayed on disk after it
//! closed, until some writer opened the store. Handles in one process pin
//! through their own open file descriptions, exactly as processes do
//! (`snapshot::pins`); the Python suite repeats this across processes.

use zring_engine::{Codec, Store};

const RECORD: usize = 64 << 10;
const RECORDS: u32 = 64; // 4 MiB live
const MIB: u64 = 1 << 20;

fn record(id: u32) -> Vec<u8> {
    (0..RECORD).map(|i| (id as usize * 131 + i / 97) as u8).collect()
}

fn chunk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("chunk-"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn read_all(s: &Store) -> Vec<Vec<u8>> {
    (0..s.len())
        .map(|i| {
            let mut b = vec![0u8; RECORD];
            s.gather(&zring_engine::Gather::fixed(&[i], RECORD), &mut b).unwrap();
            b
        })
        .collect()
}

/// One delete + compact round keeping 4 MiB live: record `k`'s slot gets a
/// new record.
fn round(w: &Store, k: u32) {
    w.delete(&[0]).unwrap();
    let r = record(1000 + k);
    w.append(&[&r], Some(Codec::Raw)).unwrap();
    w.sync().unwrap();
    w.compact().unwrap();
}

#[test]
fn a_long_lived_reader_keeps_only_its_snapshots_chunks_and_frees_them_on_close() {
    for writer_closes_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let w = Store::builder(dir.path()).codec(Codec::Raw).chunk_bytes(MIB).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..RECORDS).map(record).collect();
        w.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
        w.sync().unwrap();
        let reader = Store::open(dir.path()).unwrap();
        assert_eq!(read_all(&reader), recs);
        let mut most = 0;
        for k in 0..4 {
            round(&w, k);
            most = most.max(chunk_bytes(dir.path()));
        }
        println!("one reader alive, four delete + compact rounds of 4 MiB live: at most {most} bytes of chunk files");
        // The reader's 4 MiB, the live 4 MiB and, during a round, its copy.
        assert!(most <= 12 * MIB, "{most} bytes of chunk files");
        assert_eq!(chunk_bytes(dir.path()), 8 * MIB);
        // The reader still reads the snapshot it opened.
        assert_eq!(read_all(&reader), recs);
        if writer_closes_first {
            drop(w);
            assert_eq!(chunk_bytes(dir.path()), 8 * MIB, "a pinned chunk went");
            // The last handle over the old chunks removes them as it
            // closes: no writer has to open the store first.
            drop(reader);
        } else {
            // The reader held the last pin on them: they go as it closes.
            drop(reader);
            assert_eq!(chunk_bytes(dir.path()), 4 * MIB);
            drop(w);
        }
        assert_eq!(chunk_bytes(dir.path()), 4 * MIB, "writer_closes_first={writer_closes_first}");
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.len(), u64::from(RECORDS));
        s.verify().unwrap();
    }
}

/// A writer's own published snapshot pins the chunks its appends add: a
/// gather still holding an older snapshot keeps them through the writer's
/// own compaction, and its chunks go once it is done.
#[test]
fn appends_that_add_chunks_are_pinned_by_the_writers_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let w = Store::builder(dir.path()).codec(Codec::Raw).chunk_bytes(MIB).create().unwrap();
    let reader = Store::open(dir.path()).unwrap();
    // The empty store's one chunk, extended by appends, then four more.
    let recs: Vec<Vec<u8>> = (0..RECORDS).map(record).collect();
    for r in &recs {
        w.append(&[r], None).unwrap();
    }
    w.sync().unwrap();
    assert_eq!(read_all(&w), recs);
    // The reader opened before the appends: its snapshot is the empty chunk 0.
    assert_eq!(reader.len(), 0);
    w.delete(&[0]).unwrap();
    w.compact().unwrap();
    // Chunk 0 is the reader's (the file the appends extended: 1 MiB); the
    // other old chunks went at once.
    assert_eq!(chunk_bytes(dir.path()), 5 * MIB - RECORD as u64);
    drop(reader);
    drop(w);
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert!(!names.iter().any(|n| n == "chunk-000000.zr"), "{names:?}");
}
