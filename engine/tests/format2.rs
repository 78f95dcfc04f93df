//! Table format 2: compaction seals a store's records into a compact table
//! (no entry per record for raw records of one length, 12 bytes for any
//! other) that reads identically, and so does `seal` for a store written
//! once, by rewriting the table alone; appends, deletes and further compactions
//! on it keep every record; damage to a sealed page or a checksummed block
//! is an error naming the file.

use std::os::unix::fs::FileExt;
use std::path::Path;

use zring_engine::{Codec, Error, Store};

/// Deterministic record `id` of `len` bytes.
fn record(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            ((i / 64) as u8).wrapping_add((x >> (i % 8 * 8)) as u8 & 3)
        })
        .collect()
}

/// Every record read three ways: one at a time, as one strided batch in a
/// scrambled order, and as one ragged batch.
fn read_all(s: &Store) -> Vec<Vec<u8>> {
    let n = s.len();
    let mut lens = vec![0u64; n as usize];
    let idx: Vec<u64> = (0..n).collect();
    s.lengths(&idx, &mut lens).unwrap();
    let one: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut b = vec![0u8; lens[i as usize] as usize];
            s.gather(&zring_engine::Gather::fixed(&[i], lens[i as usize] as usize), &mut b).unwrap();
            b
        })
        .collect();
    let stride = lens.iter().copied().max().unwrap_or(0) as usize;
    let order: Vec<u64> = (0..n).map(|k| (k * 7919) % n.max(1)).collect();
    let mut batch = vec![0u8; stride * order.len()];
    s.gather(&zring_engine::Gather::fixed(&order, stride), &mut batch).unwrap();
    for (k, &i) in order.iter().enumerate() {
        let slot = &batch[k * stride..(k + 1) * stride];
        let len = lens[i as usize] as usize;
        assert_eq!(&slot[..len], &one[i as usize][..], "record {i} in a strided batch");
        assert!(slot[len..].iter().all(|&b| b == 0), "record {i}: the slot's rest is zeroed");
    }
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for &i in &order {
        offsets.push(at);
        at += lens[i as usize];
    }
    let mut ragged = vec![0u8; at as usize];
    s.gather(&zring_engine::Gather::ragged(&order, &offsets), &mut ragged).unwrap();
    for (k, &i) in order.iter().enumerate() {
        let o = offsets[k] as usize;
        assert_eq!(&ragged[o..o + one[i as usize].len()], &one[i as usize][..], "record {i} in a ragged batch");
    }
    one
}

fn append(s: &Store, recs: &[Vec<u8>], codec: Codec) {
    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    s.append(&refs, Some(codec)).unwrap();
    s.sync().unwrap();
}

/// A store's contents after `delete(indices)`: holes filled from the end in
/// descending index order.
fn deleted(mut v: Vec<Vec<u8>>, indices: &[u64]) -> Vec<Vec<u8>> {
    let mut order = indices.to_vec();
    order.sort_unstable_by(|a, b| b.cmp(a));
    order.dedup();
    for i in order {
        v.swap_remove(i as usize);
    }
    v
}

struct Case {
    name: &'static str,
    codec: Codec,
    lens: Vec<usize>,
    fixed: bool,
}

fn cases() -> Vec<Case> {
    let mixed = |n: usize, m: usize| (0..n).map(|i| (i * 37) % m).collect::<Vec<_>>();
    vec![
        Case { name: "int64 labels", codec: Codec::Raw, lens: vec![8; 20_011], fixed: true },
        Case { name: "one record per block", codec: Codec::Raw, lens: vec![5000; 97], fixed: true },
        Case { name: "two records per block", codec: Codec::Raw, lens: vec![3000; 131], fixed: true },
        Case { name: "ragged raw with empties", codec: Codec::Raw, lens: mixed(1500, 700), fixed: false },
        Case { name: "ragged zstd", codec: Codec::Zstd, lens: mixed(1200, 3000), fixed: false },
    ]
}

#[test]
fn a_sealed_store_reads_identically_and_keeps_its_fingerprint() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::builder(dir.path()).chunk_bytes(64 << 10).create().unwrap();
        let recs: Vec<Vec<u8>> = case.lens.iter().enumerate().map(|(i, &l)| record(i as u64, l)).collect();
        append(&s, &recs, case.codec);
        assert_eq!(s.table_format().0, 1);
        let fp = s.fingerprint().unwrap();
        let stats = s.stats().unwrap();
        let rep = s.compact_to(2).unwrap();
        assert_eq!((rep.format_before, rep.format_after, rep.records), (1, 2, recs.len() as u64), "{}", case.name);
        let (format, table) = s.table_format();
        assert_eq!(format, 2);
        let n = recs.len() as u64;
        if case.fixed {
            // A header page and a page of block checksums per 1,023 blocks.
            assert!(table <= 4096 * (1 + n.div_ceil(1023)), "{}: {table} table bytes for {n} records", case.name);
        } else {
            // A header page, then 340 records to a 4 KiB page.
            assert_eq!(table, 4096 * (1 + n.div_ceil(340)), "{}", case.name);
        }
        assert_eq!(read_all(&s), recs, "{}: after sealing", case.name);
        assert_eq!(s.fingerprint().unwrap(), fp, "{}: compaction keeps the fingerprint", case.name);
        let after = s.stats().unwrap();
        assert_eq!(
            (after.records, after.logical_bytes, after.live_bytes),
            (stats.records, stats.logical_bytes, stats.live_bytes),
            "{}",
            case.name
        );
        s.verify().unwrap();
        drop(s);

        // Reopened, appended to (format-1 entries after the sealed section).
        let s = Store::builder(dir.path()).open_writable().unwrap();
        assert_eq!(read_all(&s), recs, "{}: reopened", case.name);
        let more: Vec<Vec<u8>> = (0..50).map(|i| record(1000 + i, case.lens[i as usize % case.lens.len()])).collect();
        append(&s, &more, case.codec);
        let mut want = recs.clone();
        want.extend(more);
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.table_format().0, 2);
        assert_eq!(read_all(&s), want, "{}: appended after sealing", case.name);
        drop(s);

        // Sealing again takes the appended records in; a delete then
        // rewrites the table in format 1; sealing once more, and back to 1.
        let s = Store::builder(dir.path()).open_writable().unwrap();
        let fp = s.fingerprint().unwrap();
        s.compact_to(2).unwrap();
        assert_eq!(s.fingerprint().unwrap(), fp);
        assert_eq!(read_all(&s), want, "{}: sealed again", case.name);
        let gone = [0, 3, want.len() as u64 - 1, want.len() as u64 / 2];
        s.delete(&gone).unwrap();
        let want = deleted(want, &gone);
        assert_eq!(s.table_format().0, 1, "{}: delete writes format 1", case.name);
        assert_eq!(read_all(&s), want, "{}: deleted from a sealed store", case.name);
        let fp = s.fingerprint().unwrap();
        let rep = s.compact_to(2).unwrap();
        assert!(rep.bytes_after < rep.bytes_before, "{}: the deleted bytes are reclaimed", case.name);
        assert_eq!(s.fingerprint().unwrap(), fp);
        assert_eq!(read_all(&s), want, "{}: compacted to format 2 after a delete", case.name);
        s.compact_to(1).unwrap();
        assert_eq!(s.table_format().0, 1);
        assert_eq!(s.fingerprint().unwrap(), fp);
        assert_eq!(read_all(&s), want, "{}: back in format 1", case.name);
        // Nothing to do: a second call changes nothing.
        assert_eq!(s.compact_to(1).unwrap().records, 0);
    }
}

/// The chunk files of the store in `dir`, by name, with their bytes.
fn chunk_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("chunk-"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// A store written once (`sealable`, appended in several calls across
/// several chunks) gets its format-2 table from `seal` without a record
/// copied: its chunk files stay byte for byte, and it reads, verifies and
/// fingerprints as before. The writer that appended every record seals
/// from what it learnt while appending; a handle opened later reads the
/// table once: both write the same table. Appends and deletes afterwards
/// keep every record, as after a compaction to format 2.
#[test]
fn sealing_a_store_written_once_rewrites_only_its_table() {
    for case in cases() {
        let recs: Vec<Vec<u8>> = case.lens.iter().enumerate().map(|(i, &l)| record(i as u64, l)).collect();
        let mut tables = Vec::new();
        for reopened in [false, true] {
            let name = format!("{} (sealed by {} handle)", case.name, if reopened { "a new" } else { "the writing" });
            let dir = tempfile::tempdir().unwrap();
            let s = Store::builder(dir.path()).chunk_bytes(16 << 10).sealable(true).create().unwrap();
            for part in recs.chunks(777) {
                append(&s, part, case.codec);
            }
            let chunks = chunk_files(dir.path());
            assert!(chunks.len() > 1 || case.lens.len() < 1000, "{name}: {} chunks", chunks.len());
            let fp = s.fingerprint().unwrap();
            let s = match reopened {
                false => s,
                true => {
                    drop(s);
                    Store::builder(dir.path()).open_writable().unwrap()
                }
            };
            let rep = s.seal().unwrap();
            assert_eq!((rep.format_before, rep.format_after, rep.records), (1, 2, 0), "{name}");
            assert_eq!(rep.bytes_after, rep.bytes_before, "{name}");
            let (format, table) = s.table_format();
            assert_eq!((format, table), (2, rep.table_bytes_after), "{name}");
            let n = recs.len() as u64;
            if case.fixed {
                assert!(table <= 4096 * (1 + n.div_ceil(1023)), "{name}: {table} table bytes for {n} records");
            } else {
                assert_eq!(table, 4096 * (1 + n.div_ceil(340)), "{name}");
            }
            assert_eq!(chunk_files(dir.path()), chunks, "{name}: no record is copied");
            assert_eq!(read_all(&s), recs, "{name}: after sealing");
            assert_eq!(s.fingerprint().unwrap(), fp, "{name}: sealing keeps the fingerprint");
            s.verify().unwrap();
            // Sealed already: a second seal changes nothing.
            let again = s.seal().unwrap();
            assert_eq!((again.format_before, again.format_after, again.table_bytes_after), (2, 2, table), "{name}");
            tables.push(std::fs::read(table_file(dir.path())).unwrap());

            let more: Vec<Vec<u8>> =
                (0..50).map(|i| record(1000 + i, case.lens[i as usize % case.lens.len()])).collect();
            append(&s, &more, case.codec);
            let mut want = recs.clone();
            want.extend(more);
            assert_eq!(s.table_format().0, 2, "{name}: appends keep format 2");
            assert_eq!(read_all(&s), want, "{name}: appended after sealing");
            let gone = [1, want.len() as u64 - 2, want.len() as u64 / 3];
            s.delete(&gone).unwrap();
            let want = deleted(want, &gone);
            assert_eq!(s.table_format().0, 1, "{name}: a delete writes format 1");
            drop(s);
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(read_all(&s), want, "{name}: deleted from a sealed store, reopened");
            s.verify().unwrap();
        }
        assert!(tables[0] == tables[1], "{}: the survey and the table pass write different tables", case.name);
    }
}

/// Without `sealable`, appends switch chunks anywhere: raw records of one
/// length still fill every chunk alike and seal, other records that span
/// chunks do not; `seal` then leaves the store as it was (and the writer
/// usable), and the records stay readable.
#[test]
fn seal_leaves_a_store_it_cannot_seal_as_it_was() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::builder(dir.path()).chunk_bytes(4 << 10).create().unwrap();
        let recs: Vec<Vec<u8>> = case.lens.iter().enumerate().map(|(i, &l)| record(i as u64, l)).collect();
        append(&s, &recs, case.codec);
        let before = std::fs::read(table_file(dir.path())).unwrap();
        let rep = s.seal().unwrap();
        if case.fixed {
            assert_eq!(rep.format_after, 2, "{}: raw records of one length seal", case.name);
        } else {
            assert_eq!((rep.format_after, rep.table_bytes_after), (1, before.len() as u64), "{}", case.name);
            assert_eq!(std::fs::read(table_file(dir.path())).unwrap(), before, "{}: table untouched", case.name);
        }
        assert_eq!(read_all(&s), recs, "{}", case.name);
        append(&s, &[record(9, 24)], Codec::Zstd);
        assert_eq!(s.len(), recs.len() as u64 + 1);
        s.verify().unwrap();
    }
    // An empty store has nothing to seal.
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder(dir.path()).sealable(true).create().unwrap();
    assert_eq!(s.seal().unwrap().format_after, 1);
}

#[test]
fn compacting_to_an_unknown_format_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder(dir.path()).create().unwrap();
    append(&s, &[record(1, 10), record(2, 20)], Codec::Zstd);
    for bad in [0, 3] {
        let e = s.compact_to(bad).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("format")), "{e}");
    }
    assert_eq!(read_all(&s), vec![record(1, 10), record(2, 20)]);
    // The writer is not poisoned by the refusal.
    append(&s, &[record(3, 30)], Codec::Zstd);
    assert_eq!(s.len(), 3);
}

fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at).unwrap();
}

fn table_file(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("table-"))
        .unwrap()
}

/// Every sealed table page and every block is covered: a flipped bit in
/// either is an error naming the file, found by the gather that touches it.
#[test]
fn damage_to_a_sealed_page_or_block_names_the_file() {
    for fixed in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::builder(dir.path()).chunk_bytes(1 << 20).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..3000).map(|i| record(i, if fixed { 16 } else { 10 + i as usize % 50 })).collect();
        append(&s, &recs, Codec::Raw);
        s.compact_to(2).unwrap();
        drop(s);
        let table = table_file(dir.path());
        let pages = std::fs::metadata(&table).unwrap().len() / 4096 - 1;
        assert!(pages >= 1);
        for p in 0..pages {
            for at in [4096 * (p + 1), 4096 * (p + 1) + 4 + 37 * p, 4096 * (p + 2) - 1] {
                flip(&table, at);
                let s = Store::open(dir.path()).unwrap();
                let mut seen = 0;
                for i in 0..s.len() {
                    let mut b = vec![0u8; 64];
                    if let Err(e) = s.gather(&zring_engine::Gather::fixed(&[i], 64), &mut b) {
                        let Error::Corrupted { what, detail } = &e else { panic!("{e:?}") };
                        assert!(what.ends_with(&*table.file_name().unwrap().to_string_lossy()), "{e}");
                        assert!(detail.contains(&format!("table page {p}")), "{e}");
                        seen += 1;
                    }
                }
                assert!(seen > 0, "fixed={fixed}: a flip at table byte {at} went unnoticed");
                drop(s);
                flip(&table, at);
            }
        }
        let chunk = dir.path().join("chunk-000001.zr");
        let len = std::fs::metadata(&chunk).unwrap().len();
        for at in [0, len / 2, len - 1] {
            flip(&chunk, at);
            let s = Store::open(dir.path()).unwrap();
            let e = s.verify().unwrap_err();
            let Error::ChecksumMismatch { file, .. } = &e else { panic!("{e:?}") };
            assert!(file.starts_with("chunk-000001.zr"), "{e}");
            drop(s);
            flip(&chunk, at);
        }
        assert_eq!(read_all(&Store::open(dir.path()).unwrap()), recs);
    }
}

/// Delete and compaction read each checksummed block of a fixed section
/// once and copy every record out of it (they used to read and check the
/// whole 4 KiB block again for each 4-byte label in it). The records they
/// write are the right ones, with the mapping and through the file, and a
/// damaged block still fails them, naming the chunk, with nothing changed.
#[test]
fn delete_and_compaction_copy_every_label_of_a_block_read_once() {
    for mmap in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::builder(dir.path()).chunk_bytes(64 << 10).mmap(mmap).create().unwrap();
        // 1,024 labels to a block, 16 to a chunk, and a short last block.
        let recs: Vec<Vec<u8>> = (0..40_000u32).map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes().to_vec()).collect();
        append(&s, &recs, Codec::Raw);
        s.compact_to(2).unwrap();
        assert_eq!(s.table_format().0, 2);
        s.delete(&[7]).unwrap();
        let want = deleted(recs.clone(), &[7]);
        assert_eq!(read_all(&s), want, "mmap={mmap}: after the delete");
        s.compact_to(2).unwrap();
        assert_eq!(read_all(&s), want, "mmap={mmap}: sealed again");
        let gone = [0, 1023, 1024, 39_000];
        s.delete(&gone).unwrap();
        let want = deleted(want, &gone);
        s.compact_to(2).unwrap();
        assert_eq!(read_all(&s), want, "mmap={mmap}: after deletes across blocks");
        s.verify().unwrap();
        drop(s);

        let chunk = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("chunk-"))
            .min()
            .unwrap();
        flip(&chunk, 5000);
        let s = Store::builder(dir.path()).mmap(mmap).open_writable().unwrap();
        for e in [s.delete(&[0]).unwrap_err(), s.compact_to(1).unwrap_err()] {
            let Error::ChecksumMismatch { file, .. } = &e else { panic!("mmap={mmap}: {e:?}") };
            assert!(file.starts_with(&*chunk.file_name().unwrap().to_string_lossy()), "{e}");
        }
        assert_eq!(s.len(), want.len() as u64);
        drop(s);
        flip(&chunk, 5000);
        assert_eq!(read_all(&Store::open(dir.path()).unwrap()), want);
    }
}

#[test]
fn an_empty_append_after_two_seals_keeps_every_record() {
    // Found by the store_ops fuzz target: two fixed-length appends, each
    // sealed, then an append of no records.
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder(dir.path()).chunk_bytes(4096).mmap(false).direct(false).create().unwrap();
    let mut model: Vec<Vec<u8>> = Vec::new();
    for (count, len) in [(5usize, 38usize), (5, 34)] {
        let src: Vec<u8> = (0..count * len).map(|i| (i * 131 + len) as u8).collect();
        s.append_fixed(&src, len, None).unwrap();
        model.extend(src.chunks_exact(len).map(<[u8]>::to_vec));
        s.seal().unwrap();
    }
    s.verify().unwrap();
    let empty: [&[u8]; 0] = [];
    s.append(&empty, Some(Codec::Raw)).unwrap();
    assert_eq!(read_all(&s), model);
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(read_all(&s), model);
}
