//! Model-based: a sequence of appends, deletes, compactions, seals, syncs, reopens,
//! simulated crashes and verifies from the input, applied to a store and to an
//! in-memory model (a `Vec` of records in index order, with the engine's
//! documented delete semantics). After every operation the store must hold
//! exactly the model's records.
//!
//! A crash is simulated by copying the directory's files as they are (data
//! written but not synced included, head as last committed) and reopening the
//! copy writable: recovery must bring back exactly the last synced state.
//!
//! A `Fault` operation arms an I/O fault (read, write, fsync or open; the Nth
//! of that kind, N in 1..=8; EIO or ENOSPC) for the operation after it. When
//! it fires, that operation must fail with `Error::Io` carrying the errno
//! (Reopen and Crash may also succeed: dropping a store syncs it and ignores
//! errors); after a failed write or fsync the writer must refuse writes with
//! `Error::Poisoned`. The store is then dropped and reopened writable (which
//! recovers), must verify, and must hold one of the states the operation may
//! leave: the last synced state, the state the operation would have produced
//! and, for delete, compact and seal, which sync pending appends before their own
//! commit, the state just before the operation. That state becomes the model.
//! A fault that never fires is disarmed after the operation.
//!
//! Stores are opened with `mmap(false)`, so record reads go through the I/O
//! backend, where read faults are injected.
#![no_main]

use std::path::Path;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zring_engine::fault::{self, Kind};
use zring_engine::{Codec, Error, Store, StoreBuilder};

const MAX_OPS: usize = 48;
const MAX_LEN: usize = 3000;
const CHUNK_BYTES: u64 = 2048;

#[derive(Debug, Arbitrary)]
enum Op {
    Append {
        lens: Vec<u16>,
        fill: u8,
        codec: bool,
    },
    AppendFixed {
        count: u8,
        len: u8,
        fill: u8,
    },
    Delete(Vec<u16>),
    Compact,
    /// Compaction that rewrites the table in format 1 (false) or 2 (true).
    CompactTo(bool),
    /// `Store::seal`: the table alone in format 2, where the records allow.
    Seal,
    Sync,
    Reopen,
    Crash,
    /// `Store::verify`: reads every record through the backend.
    Verify,
    /// Arms a fault for the next operation.
    Fault(Fault),
}

#[derive(Clone, Copy, Debug, Arbitrary)]
enum FaultKind {
    Read,
    Write,
    Fsync,
    Open,
}

#[derive(Clone, Copy, Debug, Arbitrary)]
struct Fault {
    kind: FaultKind,
    /// Which operation of `kind` fails: `nth % 8 + 1`.
    nth: u8,
    enospc: bool,
}

impl Fault {
    fn kind(self) -> Kind {
        match self.kind {
            FaultKind::Read => Kind::Read,
            FaultKind::Write => Kind::Write,
            FaultKind::Fsync => Kind::Fsync,
            FaultKind::Open => Kind::Open,
        }
    }

    fn nth(self) -> u64 {
        u64::from(self.nth % 8) + 1
    }

    fn errno(self) -> i32 {
        if self.enospc {
            libc::ENOSPC
        } else {
            libc::EIO
        }
    }
}

type Records = Vec<Vec<u8>>;

/// What an operation does to the model.
struct Expect {
    /// The records after the operation succeeds.
    after: Records,
    /// Whether success makes `after` the synced state.
    syncs: bool,
    /// The states a reopened store may hold after the operation failed.
    on_failure: Vec<Records>,
}

fn builder(dir: &Path) -> StoreBuilder {
    Store::builder(dir).chunk_bytes(CHUNK_BYTES).mmap(false).direct(false)
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
        store.gather(&zring_engine::Gather::ragged(&[k as u64], &[0]), &mut dst[o..o + m.len()]).expect("gather");
        assert_eq!(&dst[o..o + m.len()], &m[..], "record {k} after {after}");
    }
}

/// Every record of `store`, read one by one.
fn contents(store: &Store) -> Records {
    (0..store.len())
        .map(|i| {
            let n = store.record_len(i).expect("record length") as usize;
            let mut b = vec![0u8; n];
            store.gather(&zring_engine::Gather::fixed(&[i], n), &mut b).expect("gather");
            b
        })
        .collect()
}

/// A short description of a state for assertion messages.
fn summary(state: &[Vec<u8>]) -> String {
    let lens: Vec<usize> = state.iter().map(Vec::len).collect();
    format!("{} records of lengths {lens:?}", state.len())
}

fn is_errno(e: &Error, errno: i32) -> bool {
    matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(errno))
}

fuzz_target!(|ops: Vec<Op>| {
    fault::disarm();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut images = 0;
    let mut dir = tmp.path().join("s0");
    let mut store = Some(builder(&dir).create().expect("create"));
    let mut model: Records = Vec::new();
    let mut synced: Records = Vec::new();
    let mut armed: Option<Fault> = None;
    for (n, op) in ops.iter().take(MAX_OPS).enumerate() {
        if let Op::Fault(f) = op {
            armed = Some(*f);
            continue;
        }
        if matches!(op, Op::Delete(_)) && model.is_empty() {
            continue;
        }
        let name = format!("op {n} {op:?}");
        let fault = armed.take();
        if let Some(f) = fault {
            fault::arm(f.kind(), f.nth(), f.errno());
        }
        let (expect, result) = {
            let s = store.as_ref().expect("the store is open between operations");
            match op {
                Op::Append { lens, fill, codec } => {
                    let recs: Records = lens
                        .iter()
                        .take(16)
                        .enumerate()
                        .map(|(k, &l)| record(usize::from(l) % MAX_LEN, *fill, n * 16 + k))
                        .collect();
                    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
                    let codec = if *codec { Codec::Zstd } else { Codec::Raw };
                    let r = s.append(&refs, Some(codec)).map(|first| assert_eq!(first, model.len() as u64));
                    let after = [model.clone(), recs].concat();
                    (Expect { on_failure: vec![synced.clone(), after.clone()], after, syncs: false }, r)
                }
                Op::AppendFixed { count, len, fill } => {
                    let (count, len) = (usize::from(*count % 16), usize::from(*len) + 1);
                    let src = record(count * len, *fill, n);
                    let r = s.append_fixed(&src, len, None).map(|first| assert_eq!(first, model.len() as u64));
                    let mut after = model.clone();
                    after.extend(src.chunks_exact(len).map(<[u8]>::to_vec));
                    (Expect { on_failure: vec![synced.clone(), after.clone()], after, syncs: false }, r)
                }
                Op::Delete(idx) => {
                    let idx: Vec<u64> = idx.iter().take(8).map(|&i| u64::from(i) % model.len() as u64).collect();
                    let r = s.delete(&idx);
                    let mut order = idx.clone();
                    order.sort_unstable_by(|a, b| b.cmp(a));
                    order.dedup();
                    let mut after = model.clone();
                    for i in order {
                        after.swap_remove(i as usize);
                    }
                    // Delete syncs pending appends before committing its table.
                    (Expect { on_failure: vec![synced.clone(), model.clone(), after.clone()], after, syncs: true }, r)
                }
                Op::Compact | Op::CompactTo(_) | Op::Seal => {
                    let r = match op {
                        Op::CompactTo(two) => s.compact_to(if *two { 2 } else { 1 }).map(drop),
                        Op::Seal => s.seal().map(drop),
                        _ => s.compact().map(drop),
                    };
                    // Compact and seal sync pending appends first.
                    (Expect { on_failure: vec![synced.clone(), model.clone()], after: model.clone(), syncs: true }, r)
                }
                Op::Sync => (
                    Expect { on_failure: vec![synced.clone(), model.clone()], after: model.clone(), syncs: true },
                    s.sync(),
                ),
                Op::Verify => (
                    Expect { on_failure: vec![synced.clone(), model.clone()], after: model.clone(), syncs: false },
                    s.verify().map(drop),
                ),
                Op::Reopen => {
                    // Dropping a writable store syncs it, ignoring errors.
                    drop(store.take());
                    let r = builder(&dir).open_writable().map(|s| store = Some(s));
                    (Expect { on_failure: vec![synced.clone(), model.clone()], after: model.clone(), syncs: true }, r)
                }
                Op::Crash => {
                    images += 1;
                    let copy = tmp.path().join(format!("s{images}"));
                    std::fs::create_dir(&copy).expect("crash image dir");
                    for e in std::fs::read_dir(&dir).expect("list") {
                        let e = e.expect("entry");
                        if e.file_name() != "lock" {
                            std::fs::copy(e.path(), copy.join(e.file_name())).expect("copy");
                        }
                    }
                    drop(store.take());
                    dir = copy;
                    let r = builder(&dir).open_writable().map(|s| store = Some(s));
                    (Expect { on_failure: vec![synced.clone()], after: synced.clone(), syncs: true }, r)
                }
                Op::Fault(_) => unreachable!("handled above"),
            }
        };
        let fired = fault.filter(|_| !fault::pending());
        fault::disarm();
        match (result, fired) {
            (Ok(()), None) => {
                model = expect.after;
                if expect.syncs {
                    synced = model.clone();
                }
            }
            (Ok(()), Some(f)) => {
                // Only a store's drop may swallow a failure (its sync), and
                // then the reopened store holds the synced state or the new one.
                assert!(matches!(op, Op::Reopen | Op::Crash), "{name}: {f:?} fired but the operation succeeded");
                let got = contents(store.as_ref().expect("reopened"));
                assert!(
                    expect.on_failure.contains(&got),
                    "{name}: after {f:?} in a drop the store holds {}; expected one of {:?}",
                    summary(&got),
                    expect.on_failure.iter().map(|s| summary(s)).collect::<Vec<_>>()
                );
                model = got;
                synced = model.clone();
            }
            (Err(e), None) => panic!("{name} failed without a fault: {e}"),
            (Err(e), Some(f)) => {
                assert!(is_errno(&e, f.errno()), "{name}: {f:?} gave {e:?}, not an I/O error with errno {}", f.errno());
                if let (Some(s), Error::Io { op: "write" | "fsync", .. }) = (&store, &e) {
                    let again = s.append(&[b"x".as_slice()], None);
                    assert!(matches!(again, Err(Error::Poisoned(_))), "{name}: after {e} a write gave {again:?}");
                }
                drop(store.take());
                let s = builder(&dir).open_writable().unwrap_or_else(|e| panic!("{name}: reopen after {f:?}: {e}"));
                s.verify().unwrap_or_else(|e| panic!("{name}: verify after {f:?}: {e}"));
                let got = contents(&s);
                assert!(
                    expect.on_failure.contains(&got),
                    "{name}: after {f:?} ({e}) the store holds {}; expected one of {:?}",
                    summary(&got),
                    expect.on_failure.iter().map(|s| summary(s)).collect::<Vec<_>>()
                );
                store = Some(s);
                model = got;
                synced = model.clone();
            }
        }
        let s = store.as_ref().expect("the store is open after every operation");
        if matches!(op, Op::Reopen) {
            let ro = builder(&dir).open().expect("read-only open");
            check(&ro, &model, &name);
        }
        check(s, &model, &name);
    }
    store.expect("open at the end").verify().expect("verify at the end");
});
