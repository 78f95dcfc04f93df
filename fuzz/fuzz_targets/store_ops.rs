//! Model-based: a sequence of appends, deletes, compactions, syncs, reopens
//! and simulated crashes from the input, applied to a store and to an
//! in-memory model (a `Vec` of records in index order, with the engine's
//! documented delete semantics). After every operation the store must hold
//! exactly the model's records.
//!
//! A crash is simulated by copying the directory's files as they are (data
//! written but not synced included, head as last committed) and reopening the
//! copy writable: recovery must bring back exactly the last synced state.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zring_engine::{Codec, Store};

const MAX_OPS: usize = 48;
const MAX_LEN: usize = 3000;

#[derive(Debug, Arbitrary)]
enum Op {
    Append { lens: Vec<u16>, fill: u8, codec: bool },
    AppendFixed { count: u8, len: u8, fill: u8 },
    Delete(Vec<u16>),
    Compact,
    Sync,
    Reopen,
    Crash,
}

fn record(len: usize, fill: u8, salt: usize) -> Vec<u8> {
    // Alternate compressible and noisy bytes so zstd stores some records raw.
    (0..len)
        .map(|i| if fill.is_multiple_of(2) { fill } else { (i.wrapping_mul(131) ^ salt ^ usize::from(fill)) as u8 })
        .collect()
}

fn check(store: &Store, model: &[Vec<u8>], after: &str) {
    assert_eq!(store.len(), model.len() as u64, "length after {after}");
    let idx: Vec<u64> = (0..model.len() as u64).collect();
    let mut lens = vec![0u64; idx.len()];
    store.lengths(&idx, &mut lens).expect("lengths");
    let mut offsets = Vec::with_capacity(lens.len());
    let mut at = 0u64;
    for l in &lens {
        offsets.push(at);
        at += l;
    }
    let mut dst = vec![0u8; at as usize];
    // One record at a time: a batch with empty records may hit the engine's
    // gather_var slot-order issue, which tests/tests/backends.rs tracks.
    for (k, m) in model.iter().enumerate() {
        assert_eq!(lens[k], m.len() as u64, "length of record {k} after {after}");
        let o = offsets[k] as usize;
        store.gather_var(&[k as u64], &mut dst[o..o + m.len()], &[0]).expect("gather");
        assert_eq!(&dst[o..o + m.len()], &m[..], "record {k} after {after}");
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut generation = 0;
    let mut dir = tmp.path().join("s0");
    let mut store = Store::builder(&dir).chunk_bytes(2048).create().expect("create");
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut synced: Vec<Vec<u8>> = Vec::new();
    for (n, op) in ops.iter().take(MAX_OPS).enumerate() {
        let name = format!("op {n} {op:?}");
        match op {
            Op::Append { lens, fill, codec } => {
                let recs: Vec<Vec<u8>> = lens
                    .iter()
                    .take(16)
                    .enumerate()
                    .map(|(k, &l)| record(usize::from(l) % MAX_LEN, *fill, n * 16 + k))
                    .collect();
                let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
                let codec = if *codec { Codec::Zstd } else { Codec::Raw };
                let first = store.append(&refs, Some(codec)).expect("append");
                assert_eq!(first, model.len() as u64);
                model.extend(recs);
            }
            Op::AppendFixed { count, len, fill } => {
                let (count, len) = (usize::from(*count % 16), usize::from(*len) + 1);
                let src = record(count * len, *fill, n);
                let first = store.append_fixed(&src, len, None).expect("append_fixed");
                assert_eq!(first, model.len() as u64);
                model.extend(src.chunks_exact(len).map(<[u8]>::to_vec));
            }
            Op::Delete(idx) => {
                if model.is_empty() {
                    continue;
                }
                let idx: Vec<u64> = idx.iter().take(8).map(|&i| u64::from(i) % model.len() as u64).collect();
                store.delete(&idx).expect("delete");
                let mut order = idx.clone();
                order.sort_unstable_by(|a, b| b.cmp(a));
                order.dedup();
                for i in order {
                    model.swap_remove(i as usize);
                }
                synced = model.clone();
            }
            Op::Compact => {
                store.compact().expect("compact");
                synced = model.clone();
            }
            Op::Sync => {
                store.sync().expect("sync");
                synced = model.clone();
            }
            Op::Reopen => {
                // Dropping a writable store syncs it.
                drop(store);
                synced = model.clone();
                store = Store::builder(&dir).open_writable().expect("reopen");
                let ro = Store::open(&dir).expect("read-only open");
                check(&ro, &model, &name);
            }
            Op::Crash => {
                generation += 1;
                let copy = tmp.path().join(format!("s{generation}"));
                std::fs::create_dir(&copy).expect("crash image dir");
                for e in std::fs::read_dir(&dir).expect("list") {
                    let e = e.expect("entry");
                    if e.file_name() != "lock" {
                        std::fs::copy(e.path(), copy.join(e.file_name())).expect("copy");
                    }
                }
                drop(store);
                dir = copy;
                model = synced.clone();
                store = Store::builder(&dir).open_writable().expect("reopen crash image");
            }
        }
        check(&store, &model, &name);
    }
    store.verify().expect("verify at the end");
});
