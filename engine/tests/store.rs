//! Behaviour of a store through its public API: round trips of every codec
//! across record sizes, ragged gathers, delete and compact, reopen, the writer
//! lock, loaderx-layout stores, and the errors bad arguments get.

use zring_engine::{BackendKind, Codec, Error, Format, Store};

/// Deterministic record `id` of `len` bytes: compressible but not trivially.
fn record(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            // Smooth ramp plus a little noise: zstd shrinks it, not to nothing.
            ((i / 64) as u8).wrapping_add((x >> (i % 8 * 8)) as u8 & 3)
        })
        .collect()
}

/// The model of `delete`: each index, largest first and once, is filled by
/// the last record.
fn swap_last(model: &mut Vec<u64>, del: &[u64]) {
    let mut del = del.to_vec();
    del.sort_unstable_by(|a, b| b.cmp(a));
    del.dedup();
    for i in del {
        let last = model.len() - 1;
        model.swap(i as usize, last);
        model.pop();
    }
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

#[test]
fn every_codec_round_trips_from_one_byte_to_eight_mib() {
    let sizes = [1usize, 7, 100, 4096, 12 << 10, 1 << 20, 8 << 20];
    for backend in backends() {
        for codec in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::builder(dir.path()).backend(backend).codec(codec).create().unwrap();
            if codec == Codec::ZstdDict {
                let samples: Vec<Vec<u8>> = (0..64).map(|i| record(1000 + i, 2048)).collect();
                let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
                assert!(store.train_dict(&refs, 16 << 10).unwrap() > 0);
            }
            let recs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| record(i as u64, n)).collect();
            let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
            assert_eq!(store.append(&refs, None).unwrap(), 0);
            store.sync().unwrap();
            let stats = store.stats().unwrap();
            if codec != Codec::Raw {
                assert!(stats.live_bytes < stats.logical_bytes, "{codec:?} did not compress: {stats:?}");
            }
            drop(store);
            let store = Store::builder(dir.path()).backend(backend).open().unwrap();
            assert_eq!(store.len(), sizes.len() as u64);
            for (i, r) in recs.iter().enumerate() {
                let mut out = vec![0u8; r.len()];
                store.gather(&zring_engine::Gather::fixed(&[i as u64], r.len()), &mut out).unwrap();
                assert_eq!(&out, r, "{backend:?} {codec:?} record {i} of {} bytes", r.len());
            }
            // All at once, ragged, in a scrambled order.
            let order: Vec<u64> = vec![6, 0, 5, 1, 4, 2, 3, 6];
            let mut lens = vec![0u64; order.len()];
            store.lengths(&order, &mut lens).unwrap();
            let mut offsets = vec![0u64; order.len()];
            for k in 1..order.len() {
                offsets[k] = offsets[k - 1] + lens[k - 1];
            }
            let total = (offsets[order.len() - 1] + lens[order.len() - 1]) as usize;
            let mut dst = vec![0u8; total];
            store.gather(&zring_engine::Gather::ragged(&order, &offsets), &mut dst).unwrap();
            for (k, &i) in order.iter().enumerate() {
                let at = offsets[k] as usize;
                assert_eq!(&dst[at..at + lens[k] as usize], &recs[i as usize][..]);
            }
            assert_eq!(store.verify().unwrap().records, sizes.len() as u64);
        }
    }
}

#[test]
fn a_batch_of_fixed_records_gathers_into_strided_slots() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder(dir.path()).chunk_bytes(64 << 10).create().unwrap();
    let n = 2000u64;
    let src: Vec<u8> = (0..n).flat_map(|i| record(i, 300)).collect();
    store.append_fixed(&src, 300, Some(Codec::Zstd)).unwrap();
    let stats = store.stats().unwrap();
    assert!(stats.chunks > 1, "small chunk size should roll over: {stats:?}");
    let idx: Vec<u64> = (0..1000).map(|k| (k * 7919) % n).collect();
    // A stride wider than the record leaves zeros after it.
    let mut dst = vec![0xffu8; idx.len() * 304];
    store.gather(&zring_engine::Gather::fixed(&idx, 304), &mut dst).unwrap();
    for (k, &i) in idx.iter().enumerate() {
        assert_eq!(&dst[k * 304..k * 304 + 300], &record(i, 300)[..]);
        assert_eq!(&dst[k * 304 + 300..k * 304 + 304], &[0, 0, 0, 0]);
    }
}

#[test]
fn bad_arguments_are_errors_and_leave_the_destination_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder(dir.path()).create().unwrap();
    store.append(&[&record(0, 10), &record(1, 10)], None).unwrap();
    let mut dst = vec![7u8; 30];
    let e = store.gather(&zring_engine::Gather::fixed(&[0, 1, 2], 10), &mut dst).unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { index: 2, len: 2 }), "{e}");
    assert!(dst.iter().all(|&b| b == 7), "nothing may be written on bad input");
    let e = store.gather(&zring_engine::Gather::fixed(&[0], 10), &mut dst).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let mut small = vec![0u8; 8];
    let e = store.gather(&zring_engine::Gather::fixed(&[0], 8), &mut small).unwrap_err();
    assert!(matches!(e, Error::RecordSize { record: 0, len: 10, slot: 8 }), "{e}");
    let mut d = vec![0u8; 15];
    let e = store.gather(&zring_engine::Gather::ragged(&[0, 1], &[0, 5]), &mut d).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "overlapping slots: {e}");
    let e = store.gather(&zring_engine::Gather::ragged(&[0, 1], &[0, 10]), &mut d).unwrap_err();
    assert!(matches!(e, Error::RecordSize { .. }), "slot past the end: {e}");
    assert!(matches!(store.delete(&[5]), Err(Error::IndexOutOfRange { index: 5, len: 2 })));
    assert_eq!(store.len(), 2);
    assert!(matches!(store.append(&[b"x"], Some(Codec::ZstdDict)), Err(Error::NoDictionary)));
    assert!(matches!(Codec::from_name("lz4"), Err(Error::InvalidArgument(_))));
}

#[test]
fn delete_moves_the_tail_into_holes_and_compact_reclaims_space() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder(dir.path()).backend(backend).chunk_bytes(4096).codec(Codec::Raw).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..100).map(|i| record(i, 200 + i as usize)).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
        // Model of swap-last delete in descending order.
        let mut model: Vec<u64> = (0..100).collect();
        let del = [3u64, 99, 50, 3, 0, 98, 97];
        store.delete(&del).unwrap();
        swap_last(&mut model, &del);
        let check = |s: &Store, model: &[u64]| {
            assert_eq!(s.len(), model.len() as u64);
            for (k, &id) in model.iter().enumerate() {
                let r = &recs[id as usize];
                let mut out = vec![0u8; r.len()];
                s.gather(&zring_engine::Gather::fixed(&[k as u64], r.len()), &mut out).unwrap();
                assert_eq!(&out, r, "index {k} should hold record {id}");
            }
        };
        check(&store, &model);
        let before = store.stats().unwrap();
        assert!(before.reclaimable > 0);
        let rep = store.compact().unwrap();
        assert!(rep.bytes_after < rep.bytes_before);
        let after = store.stats().unwrap();
        assert_eq!(after.reclaimable, 0, "{after:?}");
        assert_eq!(after.chunk_bytes, after.live_bytes);
        check(&store, &model);
        // Appends after compaction continue in the new chunks.
        store.append(&[&recs[0]], None).unwrap();
        model.push(0);
        store.sync().unwrap();
        drop(store);
        let reopened = Store::builder(dir.path()).backend(backend).open_writable().unwrap();
        check(&reopened, &model);
        reopened.verify().unwrap();
        // Only the committed files remain.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("table-")).count(), 1, "{names:?}");
        assert_eq!(names.iter().filter(|n| n.starts_with("chunk-")).count() as u64, after.chunks, "{names:?}");
    }
}

/// Deletes of runs that reach the end (each hole filled from a record that
/// itself filled a hole a moment before), scattered ones and duplicates, on
/// format-1 and sealed stores of both kinds, agree with the swap-last model
/// round after round.
#[test]
fn delete_agrees_with_swap_last_on_every_table_format() {
    for (codec, fixed) in [(Codec::Raw, true), (Codec::Zstd, false)] {
        for format in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::builder(dir.path()).chunk_bytes(8192).codec(codec).create().unwrap();
            let recs: Vec<Vec<u8>> =
                (0..600).map(|i| record(i, if fixed { 64 } else { 1 + i as usize % 300 })).collect();
            store.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
            store.sync().unwrap();
            let mut model: Vec<u64> = (0..600).collect();
            let mut x = 7u64;
            for round in 0..6 {
                store.compact_to(format).unwrap();
                let n = model.len() as u64;
                let mut del: Vec<u64> = (0..12)
                    .map(|_| {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        (x >> 33) % n
                    })
                    .collect();
                // A run ending at the last record, and one just below it.
                del.extend([n - 1, n - 2, n - 3, n - 5, n - 6]);
                del.push(del[0]);
                store.delete(&del).unwrap();
                swap_last(&mut model, &del);
                assert_eq!(store.len(), model.len() as u64, "round {round}");
                for (k, &id) in model.iter().enumerate() {
                    let r = &recs[id as usize];
                    let mut out = vec![0u8; r.len()];
                    store.gather(&zring_engine::Gather::fixed(&[k as u64], r.len()), &mut out).unwrap();
                    assert_eq!(&out, r, "{codec:?} format {format} round {round}: index {k} should hold record {id}");
                }
            }
            store.verify().unwrap();
        }
    }
}

#[test]
fn one_writer_at_a_time_readers_are_free_and_unsynced_appends_are_visible_to_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let w = Store::builder(dir.path()).create().unwrap();
    assert!(matches!(Store::builder(dir.path()).open_writable(), Err(Error::Locked { .. })));
    w.append(&[b"abc"], None).unwrap();
    assert_eq!(w.len(), 1, "the writer sees its own unsynced append");
    assert_eq!(Store::open(dir.path()).unwrap().len(), 0, "other handles see the last synced head");
    w.sync().unwrap();
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(r.len(), 1);
    assert!(matches!(r.append(&[b"x"], None), Err(Error::ReadOnly(_))));
    assert!(matches!(r.delete(&[0]), Err(Error::ReadOnly(_))));
    drop(w);
    Store::builder(dir.path()).open_writable().unwrap();
    assert!(matches!(Store::builder(dir.path()).create(), Err(Error::AlreadyExists { .. })));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(Store::open(empty.path()), Err(Error::NotAStore { .. })));
}

#[test]
fn schema_and_dictionary_persist() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder(dir.path()).create().unwrap();
    assert_eq!(s.schema().unwrap(), None);
    s.set_schema("{\"dtype\": \"<f4\"}").unwrap();
    let samples: Vec<Vec<u8>> = (0..64).map(|i| record(i, 1024)).collect();
    let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
    s.train_dict(&refs, 8 << 10).unwrap();
    assert!(
        matches!(s.train_dict(&refs, 8 << 10), Err(Error::InvalidArgument(_))),
        "a dictionary is fixed once trained"
    );
    s.append(&refs, Some(Codec::ZstdDict)).unwrap();
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    assert!(s.has_dict());
    assert_eq!(s.schema().unwrap().as_deref(), Some("{\"dtype\": \"<f4\"}"));
    assert!(s.stats().unwrap().zstd_dict_records > 0);
    s.verify().unwrap();
}

/// Writes a store in loaderx 0.7.3's layout by hand (`meta.zr`: "ZREC", version
/// 3, tail chunk u16, tail offset u32, length u32; 16-byte entries; `N.zr`
/// chunks), from the layout its documentation gives.
fn write_loaderx_store(dir: &std::path::Path, recs: &[Vec<u8>]) {
    let mut meta = Vec::new();
    meta.extend_from_slice(b"ZREC");
    meta.extend_from_slice(&3u16.to_le_bytes());
    meta.extend_from_slice(&0u16.to_le_bytes());
    let mut chunk = Vec::new();
    let mut entries = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let (codec, stored) = if i % 2 == 0 { (1u8, zstd::bulk::compress(r, 3).unwrap()) } else { (0u8, r.clone()) };
        entries.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        entries.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        entries.extend_from_slice(&(r.len() as u32).to_le_bytes());
        entries.extend_from_slice(&0u16.to_le_bytes());
        entries.push(codec);
        entries.push(0);
        chunk.extend_from_slice(&stored);
    }
    meta.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
    meta.extend_from_slice(&(recs.len() as u32).to_le_bytes());
    meta.extend_from_slice(&entries);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("meta.zr"), meta).unwrap();
    std::fs::write(dir.join("0.zr"), chunk).unwrap();
    std::fs::write(dir.join("schema.json"), "{\"format\": \"loaderx-zrecord\"}").unwrap();
}

#[test]
fn loaderx_layout_stores_are_read_in_place_and_imported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lx");
    let recs: Vec<Vec<u8>> = (0..50).map(|i| record(i, 500 + i as usize)).collect();
    write_loaderx_store(&src, &recs);
    let lx = Store::open(&src).unwrap();
    assert_eq!(lx.format(), Format::Loaderx);
    assert_eq!(lx.len(), 50);
    assert!(matches!(lx.append(&[b"x"], None), Err(Error::ReadOnly(_))));
    assert!(matches!(Store::builder(&src).open_writable(), Err(Error::ReadOnly(_))));
    let dst = dir.path().join("native");
    let native = zring_engine::import_loaderx(&src, &dst).unwrap();
    assert_eq!(native.format(), Format::Native);
    for s in [&lx, &native] {
        for (i, r) in recs.iter().enumerate() {
            let mut out = vec![0u8; r.len()];
            s.gather(&zring_engine::Gather::fixed(&[i as u64], r.len()), &mut out).unwrap();
            assert_eq!(&out, r);
        }
    }
    native.verify().unwrap();
    assert_eq!(native.schema().unwrap(), lx.schema().unwrap());
}

/// Records of whole pages, read with O_DIRECT into page-aligned slots of
/// their length, land straight in the slots (counted in `bytes_into_place`)
/// and are checked there; any other slot gets them through scratch. Both
/// deliver the same bytes, and a damaged record is a checksum error either way.
#[test]
fn direct_reads_of_whole_pages_land_in_aligned_slots_and_are_checked_there() {
    const LEN: usize = 8192;
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::builder(dir.path()).codec(Codec::Raw).backend(backend).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..8).map(|i| record(i, LEN)).collect();
        s.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
        s.sync().unwrap();
        drop(s);
        let s = Store::builder(dir.path()).backend(backend).direct(true).open().unwrap();
        assert!(s.is_direct(), "O_DIRECT refused here");
        let idx = [5u64, 0, 7, 2];
        // A buffer with room to place the batch on a page boundary or just past one.
        let mut buf = vec![0u8; (idx.len() + 2) * LEN];
        let page = (4096 - buf.as_ptr() as usize % 4096) % 4096;
        for (at, into_place) in [(page, true), (page + 64, false)] {
            let before = s.read_stats();
            let dst = &mut buf[at..at + idx.len() * LEN];
            dst.fill(0xEE);
            s.gather(&zring_engine::Gather::fixed(&idx, LEN), dst).unwrap();
            for (k, &i) in idx.iter().enumerate() {
                assert!(dst[k * LEN..][..LEN] == recs[i as usize][..], "{backend:?}, record {i} at offset {at}");
            }
            let after = s.read_stats();
            let placed = after.bytes_into_place - before.bytes_into_place;
            assert_eq!(after.bytes_read - before.bytes_read, (idx.len() * LEN) as u64, "{backend:?}");
            assert_eq!(placed, if into_place { (idx.len() * LEN) as u64 } else { 0 }, "{backend:?}, offset {at}");
        }
        // One byte of record 7 flipped on disk: the gather into place fails
        // naming it, and its neighbours still read.
        drop(s);
        let chunk = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("chunk-"))
            .unwrap();
        let mut bytes = std::fs::read(&chunk).unwrap();
        bytes[7 * LEN + 100] ^= 1;
        std::fs::write(&chunk, &bytes).unwrap();
        let s = Store::builder(dir.path()).backend(backend).direct(true).open().unwrap();
        let dst = &mut buf[page..page + idx.len() * LEN];
        match s.gather(&zring_engine::Gather::fixed(&idx, LEN), dst) {
            Err(Error::ChecksumMismatch { record: 7, .. }) => {}
            other => panic!("{backend:?}: {other:?}"),
        }
        s.gather(&zring_engine::Gather::fixed(&[2, 5], LEN), &mut dst[..2 * LEN]).unwrap();
        assert!(dst[..LEN] == recs[2][..] && dst[LEN..2 * LEN] == recs[5][..]);
        // Every record read into place counts, the damaged one included.
        assert_eq!(s.read_stats().bytes_into_place, 6 * LEN as u64, "{backend:?}");
    }
}
