use super::commit::*;
use super::manifest::*;
use super::open::*;
use crate::error::Error;
use crate::format::fingerprint::Fingerprint;
use crate::read::request::Gather;
use crate::store::Store;
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// A dataset of six raw parts of 20 records each in `root`, record `i`
/// (`record(i)`) at global index `i`.
fn six_parts(root: &Path, record: impl Fn(u32) -> Vec<u8>) {
    let entries: Vec<PartEntry> = (0..6u32)
        .map(|k| {
            let name = format!("p{k}");
            let store = Store::builder(root.join(&name)).codec(crate::format::codec::Codec::Raw).create().unwrap();
            let data: Vec<Vec<u8>> = (k * 20..k * 20 + 20).map(&record).collect();
            store.append(&data.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
            store.sync().unwrap();
            PartEntry::new(name, store.fingerprint().unwrap())
        })
        .collect();
    commit_manifest(root, Value::Null, entries, false).unwrap();
}

fn part(root: &Path, name: &str, recs: std::ops::Range<u32>) -> PartEntry {
    let store = Store::builder(root.join(name)).create().unwrap();
    let data: Vec<Vec<u8>> = recs.map(|i| i.to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    store.append(&refs, None).unwrap();
    store.sync().unwrap();
    PartEntry::new(name, store.fingerprint().unwrap())
}

#[test]
fn indices_map_to_parts_and_the_manifest_only_grows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let a = part(root, "a", 0..10);
    let b = part(root, "b", 10..13);
    let m = commit_manifest(root, Value::Null, vec![a.clone(), b.clone()], false).unwrap();
    assert_eq!(m.generation, 1);
    let parts = Parts::open_with_capacity(root, 1).unwrap();
    assert_eq!(parts.len(), 13);
    assert_eq!(parts.locate(0).unwrap(), (0, 0));
    assert_eq!(parts.locate(9).unwrap(), (0, 9));
    assert_eq!(parts.locate(10).unwrap(), (1, 0));
    assert_eq!(parts.locate(12).unwrap(), (1, 2));
    assert!(matches!(parts.locate(13), Err(Error::IndexOutOfRange { index: 13, len: 13 })));
    // One store open at a time: part 1 is opened on demand.
    let s = parts.store(1).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(parts.open_stores().len(), 1);
    let before = parts.fingerprint();

    // An append must keep the old parts first.
    let c = part(root, "c", 13..20);
    let err = commit_manifest(root, Value::Null, vec![b.clone(), a.clone(), c.clone()], false).unwrap_err();
    assert!(err.to_string().contains("must list its 2 committed parts first"), "{err}");
    let m = commit_manifest(root, Value::Null, vec![a.clone(), b.clone(), c.clone()], false).unwrap();
    assert_eq!(m.generation, 2);
    let grown = Parts::open(root).unwrap();
    assert_eq!(grown.len(), 20);
    assert!(grown.extends(before));
    assert!(!grown.extends(Fingerprint { records: 10, content: before.content }));
    // An overwrite that drops a part is not a continuation.
    commit_manifest(root, Value::Null, vec![b.clone(), c.clone()], true).unwrap();
    assert!(!Parts::open(root).unwrap().extends(before));
}

#[test]
fn a_gather_over_parts_reads_each_record_into_its_slot_and_checks_slots_across_parts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let entries: Vec<PartEntry> = (0..12u32).map(|k| part(root, &format!("p{k}"), k * 5..k * 5 + 5)).collect();
    commit_manifest(root, Value::Null, entries, false).unwrap();
    let idx: Vec<u64> = (0..200u64).map(|i| (i * 37 + 11) % 60).collect();
    let want: Vec<u8> = idx.iter().flat_map(|&i| (i as u32).to_le_bytes()).collect();
    // All parts in one group (capacity 64), and a group of one part at a time (capacity 2).
    for capacity in [64, 2] {
        let parts = Parts::open_with_capacity(root, capacity).unwrap();
        let mut dst = vec![0xffu8; idx.len() * 4];
        parts.gather(&Gather::fixed(&idx, 4), &mut dst).unwrap();
        assert_eq!(dst, want, "capacity {capacity}");
        // Ragged slots in reverse order, and fixed slots wider than the records.
        let starts: Vec<u64> = (0..idx.len() as u64).rev().map(|k| k * 4).collect();
        let mut dst = vec![0u8; idx.len() * 4];
        parts.gather(&Gather::ragged(&idx, &starts), &mut dst).unwrap();
        let back: Vec<u8> = idx.iter().rev().flat_map(|&i| (i as u32).to_le_bytes()).collect();
        assert_eq!(dst, back);
        let mut dst = vec![0xffu8; 2 * 8];
        parts.gather(&Gather::fixed(&[59, 0], 8), &mut dst).unwrap();
        assert_eq!(dst, [59, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    let parts = Parts::open(root).unwrap();
    // Two records of different parts in overlapping slots: refused, nothing written.
    let mut dst = vec![7u8; 8];
    let err = parts.gather(&Gather::ragged(&[1, 58], &[0, 2]), &mut dst).unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
    assert_eq!(dst, [7u8; 8]);
    assert!(matches!(
        parts.gather(&Gather::fixed(&[60], 4), &mut [0u8; 4]),
        Err(Error::IndexOutOfRange { index: 60, len: 60 })
    ));
    assert!(matches!(parts.gather(&Gather::fixed(&[3], 2), &mut [0u8; 2]), Err(Error::RecordSize { .. })));
}

/// Parts each compressed with their own dictionary: a gather across them
/// decodes every record with its own part's dictionary (each part's is
/// taken once per gather, not per record), and a dictionary's record in a
/// part of another is never decoded with the wrong one.
#[test]
fn a_gather_over_parts_decodes_each_record_with_its_parts_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let record = |k: u32, i: u32| -> Vec<u8> {
        let word = format!("part{k}-{}-", ["alpha", "beta", "gamma"][k as usize % 3]);
        let mut r: Vec<u8> = word.bytes().cycle().take(600).collect();
        r.extend_from_slice(&i.to_le_bytes());
        r
    };
    let entries: Vec<PartEntry> = (0..3u32)
        .map(|k| {
            let name = format!("d{k}");
            let store = Store::builder(root.join(&name)).create().unwrap();
            let data: Vec<Vec<u8>> = (0..64).map(|i| record(k, i)).collect();
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            assert!(store.train_dict(&refs, 4 << 10).unwrap() > 0);
            store.append(&refs, Some(crate::format::codec::Codec::ZstdDict)).unwrap();
            store.sync().unwrap();
            assert!(store.stats().unwrap().zstd_dict_records > 0);
            PartEntry::new(name, store.fingerprint().unwrap())
        })
        .collect();
    commit_manifest(root, Value::Null, entries, false).unwrap();
    let parts = Parts::open(root).unwrap();
    let idx: Vec<u64> = (0..192u64).map(|i| (i * 37 + 5) % 192).collect();
    let starts: Vec<u64> = (0..idx.len() as u64).map(|k| k * 604).collect();
    for _ in 0..2 {
        let mut dst = vec![0u8; idx.len() * 604];
        parts.gather(&Gather::ragged(&idx, &starts), &mut dst).unwrap();
        for (k, &i) in idx.iter().enumerate() {
            assert_eq!(dst[k * 604..][..604], record((i / 64) as u32, (i % 64) as u32)[..], "record {i}");
        }
    }
}

/// Small parts' entries are copied into the dataset's array when it opens
/// (`Dense`): a gather reads them from there, each record still checked
/// against its checksum on every read, and a damaged record or table
/// entry is an error naming its part.
#[test]
fn a_gather_over_parts_reads_entries_from_the_datasets_copy_and_names_a_damaged_part() {
    if !crate::env::parts_dense() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let record = |i: u32| -> Vec<u8> { (0..100u32).map(|b| (i * 13 + b) as u8).collect() };
    six_parts(root, record);
    let idx: Vec<u64> = (0..300u64).map(|i| (i * 53 + 7) % 120).collect();
    let want: Vec<u8> = idx.iter().flat_map(|&i| record(i as u32)).collect();
    // Every part open, and one part open at a time (parts closed and opened again).
    for capacity in [64, 1] {
        let parts = Parts::open_with_capacity(root, capacity).unwrap();
        let d = parts.dense.as_ref().expect("small parts are copied");
        assert!(d.ok.iter().all(|ok| ok.load(Relaxed)));
        for _ in 0..2 {
            let mut dst = vec![0u8; idx.len() * 100];
            parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
            assert_eq!(dst, want, "capacity {capacity}");
        }
    }
    // A record's bytes damaged after the dataset opened: still checked.
    let parts = Parts::open(root).unwrap();
    let chunk = root.join("p2").join(crate::format::names::chunk_name(
        crate::format::table::Format::Native,
        crate::format::record::ChunkId(0),
    ));
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[5 * 100 + 3] ^= 0x10;
    std::fs::write(&chunk, &bytes).unwrap();
    let err = parts.gather(&Gather::fixed(&[45], 100), &mut [0u8; 100]).unwrap_err();
    assert!(matches!(&err, Error::ChecksumMismatch { record: 5, .. }), "{err}");
    assert!(err.to_string().contains("p2"), "{err}");
    let mut dst = vec![0u8; 100];
    parts.gather(&Gather::fixed(&[46], 100), &mut dst).unwrap();
    assert_eq!(dst, record(46));
    bytes[5 * 100 + 3] ^= 0x10;
    std::fs::write(&chunk, &bytes).unwrap();
    // A table entry damaged before the dataset opens: the part is not
    // copied, and reading the entry is an error naming its table.
    let table = std::fs::read_dir(root.join("p4"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("table-"))
        .unwrap();
    let mut t = std::fs::read(&table).unwrap();
    let n = t.len();
    t[n - 32 * 3 + 9] ^= 0x01;
    std::fs::write(&table, &t).unwrap();
    match Parts::open(root) {
        Ok(parts) => {
            assert!(!parts.dense.as_ref().unwrap().ok[4].load(Relaxed));
            assert!(parts.dense.as_ref().unwrap().ok[3].load(Relaxed));
            let err = parts.gather(&Gather::fixed(&[97], 100), &mut [0u8; 100]).unwrap_err();
            assert!(matches!(&err, Error::Corrupted { .. }), "{err}");
            assert!(err.to_string().contains("p4"), "{err}");
        }
        Err(err) => assert!(err.to_string().contains("p4"), "{err}"),
    }
}

/// A hot gather reads each part's mapping from the open set's array
/// (`Open::maps`): a part closed for room leaves it (its mapping unmapped,
/// not kept by the array), a part opened again is put back with its new
/// mapping, and every gather after reads the right records through it.
#[test]
fn a_hot_gather_follows_parts_closed_and_opened_again_in_the_open_sets_mappings() {
    if !crate::env::parts_dense() || !crate::io::mmap::allowed() || crate::env::direct().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let record = |i: u32| -> Vec<u8> { (0..100u32).map(|b| (i * 7 + b * 3) as u8).collect() };
    six_parts(root, record);
    // The chunk files of part `k` mapped in this process now.
    let mapped = |k: usize| {
        let needle = format!("{}/", root.join(format!("p{k}")).display());
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("chunk-"))
            .count()
    };
    let served = || crate::read::gather::MAPPED_GATHERS.with(std::cell::Cell::get);
    for capacity in [1, 2, 64] {
        let parts = Parts::open_with_capacity(root, capacity).unwrap();
        for (round, &k) in [0usize, 1, 0, 2, 3, 0, 5, 4, 0, 1].iter().enumerate() {
            let idx: Vec<u64> = (0..40u64).map(|j| k as u64 * 20 + (j * 7 + round as u64) % 20).collect();
            let want: Vec<u8> = idx.iter().flat_map(|&i| record(i as u32)).collect();
            for _ in 0..2 {
                let before = served();
                let mut dst = vec![0u8; idx.len() * 100];
                parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
                assert_eq!(dst, want, "capacity {capacity}, part {k}, round {round}");
                let open = parts.read();
                assert!(open.slots[k].is_some());
                assert_eq!(open.maps.shape(k).map(|(_, len)| len), Some(20 * 100), "part {k} is in the array");
                let in_array: Vec<usize> = (0..6).filter(|&j| open.maps.shape(j).is_some()).collect();
                assert!(in_array.iter().all(|&j| open.slots[j].is_some()), "a closed part left the array");
                assert!(in_array.len() <= capacity);
                drop(open);
                // Part k open and in the array: this gather or the one
                // before it took the hot path (the first may have opened it).
                if served() == before {
                    let mut dst = vec![0u8; idx.len() * 100];
                    parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
                    assert_eq!(dst, want);
                    assert_eq!(served(), before + 1, "a hot gather of an open part takes the array's mapping");
                }
            }
            if capacity == 1 {
                // The other parts closed: their mappings are gone too.
                assert!((0..6).filter(|&j| j != k).all(|j| mapped(j) == 0), "a closed part stays mapped");
                assert_eq!(mapped(k), 1);
            }
        }
    }
}

/// A cold record of a small part read buffered brings its whole part into
/// the page cache (as the kernel's readahead does in one large file);
/// a part nothing was read from stays out.
#[test]
fn a_cold_record_of_a_small_part_reads_the_part_ahead_whole() {
    if crate::env::direct().is_some() {
        return; // ZRING_DIRECT forces a mode: nothing is read ahead.
    }
    let dir = tempfile::tempdir_in(crate::io::disk_scratch_dir()).unwrap();
    let root = dir.path();
    let record = |i: u32| -> Vec<u8> { (0..1024).map(|b| (i as usize * 7 + b) as u8).collect() };
    let entries: Vec<PartEntry> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let store = Store::builder(root.join(name)).codec(crate::format::codec::Codec::Raw).create().unwrap();
            let data: Vec<Vec<u8>> = (k as u32 * 64..k as u32 * 64 + 64).map(record).collect();
            store.append(&data.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
            store.sync().unwrap();
            PartEntry::new(*name, store.fingerprint().unwrap())
        })
        .collect();
    commit_manifest(root, Value::Null, entries, false).unwrap();
    let chunk = |name: &str| {
        let path = root.join(name).join(crate::format::names::chunk_name(
            crate::format::table::Format::Native,
            crate::format::record::ChunkId(0),
        ));
        let f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        (f, len)
    };
    let parts = Parts::open(root).unwrap();
    for name in ["a", "b"] {
        let (f, len) = chunk(name);
        assert!(len >= 64 * 1024);
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        assert!(!crate::io::mmap::file_resident(&f, len), "posix_fadvise(DONTNEED) dropped nothing");
    }
    let mut dst = vec![0u8; 1024];
    parts.gather(&Gather::fixed(&[5], 1024), &mut dst).unwrap();
    assert_eq!(dst, record(5));
    let (a, a_len) = chunk("a");
    // The readahead runs without the gather waiting for it.
    let t = std::time::Instant::now();
    while !crate::io::mmap::file_resident(&a, a_len) {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "part a was not read ahead whole");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (b, b_len) = chunk("b");
    assert!(!crate::io::mmap::file_resident(&b, b_len), "part b was read ahead though nothing was read of it");
}

#[test]
fn ranks_get_balanced_prefix_stable_parts_and_need_only_theirs() {
    assert_eq!(assign_ranks(&[10, 3, 3, 3, 3, 1], 2), vec![0, 1, 1, 1, 1, 0]);
    let before = assign_ranks(&[5, 9, 2, 7], 3);
    assert_eq!(assign_ranks(&[5, 9, 2, 7, 4, 4, 8], 3)[..4], before[..]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let entries: Vec<PartEntry> = (0..5u32).map(|k| part(root, &format!("p{k}"), k * 10..k * 10 + 10 - k)).collect();
    commit_manifest(root, Value::Null, entries, false).unwrap();
    // Records 10, 9, 8, 7, 6: loads 10/0, 10/9, 10/17, 17/17, then the tie goes to rank 0.
    let owner = assign_ranks(&[10, 9, 8, 7, 6], 2);
    assert_eq!(owner, vec![0, 1, 1, 0, 0]);
    // Rank 1 reads with rank 0's parts gone.
    for k in [0, 3, 4] {
        std::fs::remove_dir_all(root.join(format!("p{k}"))).unwrap();
    }
    let r1 = Parts::open_rank(root, 1, 2).unwrap();
    assert_eq!((r1.part_count(), r1.len(), r1.number(1)), (2, 17, 2));
    assert!(r1.store(1).unwrap().path().ends_with("p2"));
    let err = Parts::open_rank(root, 0, 2).unwrap_err();
    assert!(matches!(&err, Error::NotAStore { path, .. } if path.ends_with("p0")), "{err}");
    assert!(err.to_string().contains("part 0 "), "{err}");
    assert!(Parts::open_rank(root, 2, 2).is_err());
}

#[test]
fn a_missing_changed_or_other_schema_part_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let a = part(root, "a", 0..10);
    let b = part(root, "b", 10..13);
    commit_manifest(root, Value::Null, vec![a.clone(), b.clone()], false).unwrap();
    // Changed after its commit.
    let w = Store::builder(root.join("b")).open_writable().unwrap();
    w.append(&[&b"x"[..]], None).unwrap();
    w.sync().unwrap();
    drop(w);
    let err = Parts::open(root).unwrap_err();
    assert!(matches!(&err, Error::Corrupted { what, .. } if what.ends_with("b")), "{err}");
    assert!(err.to_string().contains("part 1 holds 4 records"), "{err}");
    // Missing.
    std::fs::remove_dir_all(root.join("b")).unwrap();
    let err = Parts::open(root).unwrap_err();
    assert!(matches!(&err, Error::NotAStore { path, .. } if path.ends_with("b")), "{err}");
    // Another schema.
    let c = part(root, "c", 0..2);
    Store::builder(root.join("c")).open_writable().unwrap().set_schema("{\"dtype\": \"<f4\"}").unwrap();
    let err = commit_manifest(root, Value::Null, vec![a, c], true).unwrap_err();
    assert!(err.to_string().contains("part 1 has schema"), "{err}");
    // A damaged manifest.
    let p = root.join(MANIFEST_FILE);
    let mut bytes = std::fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 4;
    std::fs::write(&p, &bytes).unwrap();
    assert!(matches!(read_manifest(root), Err(Error::Corrupted { .. })));
}

/// A dataset whose last part holds no records (an empty input file's)
/// extends itself, and grown by an append it extends what it was: the
/// fingerprint taken after the empty part is found among the parts that
/// end where it ends.
#[test]
fn a_trailing_part_of_no_records_still_extends() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let a = part(root, "a", 0..10);
    let store = Store::builder(root.join("e")).create().unwrap();
    store.sync().unwrap();
    let e = PartEntry::new("e", store.fingerprint().unwrap());
    drop(store);
    assert_eq!(e.records, 0);
    commit_manifest(root, Value::Null, vec![a.clone(), e.clone()], false).unwrap();
    let before = Parts::open(root).unwrap().fingerprint();
    let b = part(root, "b", 10..13);
    commit_manifest(root, Value::Null, vec![a, e, b], false).unwrap();
    let grown = Parts::open(root).unwrap();
    assert!(grown.extends(before), "a state saved before the append resumes over the grown dataset");
    assert!(grown.extends(grown.fingerprint()));
}

#[test]
fn ranks_are_balanced_by_bytes_when_every_part_records_them_else_by_records() {
    let entry = |records: u64, bytes: Option<u64>| PartEntry {
        dir: format!("parts/p{records}"),
        records,
        content: "00000000".into(),
        bytes,
    };
    // Many short documents, then few long ones: by records the long ones
    // pile on one rank; by bytes each rank gets about half the tokens.
    let m = Manifest::new(1, Value::Null, vec![entry(1000, Some(2000)), entry(10, Some(2000)), entry(12, Some(2400))]);
    assert_eq!(super::placement_weights(&m), vec![2000, 2000, 2400]);
    assert_eq!(assign_ranks(&super::placement_weights(&m), 2), vec![0, 1, 0]);
    // One part without bytes (an older manifest, appended to): records, for every part.
    let old = Manifest::new(1, Value::Null, vec![entry(1000, None), entry(10, Some(2000)), entry(12, Some(2400))]);
    assert_eq!(super::placement_weights(&old), vec![1000, 10, 12]);
    // The entry is written without `bytes` when unknown, and read back either way.
    let text = serde_json::to_string(&entry(3, None)).unwrap();
    assert!(!text.contains("bytes"), "{text}");
    let back: PartEntry = serde_json::from_str(&serde_json::to_string(&entry(3, Some(9))).unwrap()).unwrap();
    assert_eq!(back.bytes, Some(9));
}
