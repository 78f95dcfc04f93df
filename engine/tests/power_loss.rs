//! Simulated power loss: what the disk holds when the machine dies, not just
//! the process.
//!
//! A workload (create, appends with sync, a seal of the table alone, delete,
//! compact, appends, then upgrades to table format 2, appends to it, a delete
//! on it and more upgrades; with zstd records of many lengths, and with raw records of one
//! length, which format 2 keeps without entries) runs with
//! every file mutation recorded at the engine's storage seam. The trace is then
//! replayed into a model of a file system that keeps "live" bytes (what the
//! page cache holds) apart from "durable" bytes (what an fsync made
//! persistent) and live directory entries apart from durable ones (made
//! persistent by fsyncing the directory). At every point of the trace the image
//! a power loss would leave is built — every unsynced write dropped, or the
//! last unsynced write torn after its first 512 bytes, or (a kind crash) every
//! live byte kept — written to a directory, and opened.
//!
//! Guarantee: every image opens (recovering), verifies, and holds exactly the
//! state of the last acknowledged operation or of the one in progress; no
//! record whose append returned after a sync is lost or torn.
//!
//! Run with `cargo test -p zring-engine --features fault-injection --test power_loss`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use zring_engine::fault::{self, Event};
use zring_engine::{Codec, Error, Store};

fn rec(id: u64, len: usize) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| ((i as u64).wrapping_mul(2654435761) ^ id) as u8 % 23));
    v
}

fn ids(s: &Store) -> Result<Vec<u64>, Error> {
    let mut out = Vec::new();
    for i in 0..s.len() {
        let n = s.record_len(i)? as usize;
        let mut b = vec![0u8; n];
        s.gather(&zring_engine::Gather::fixed(&[i], n), &mut b)?;
        let id = u64::from_le_bytes(b[..8].try_into().unwrap());
        assert_eq!(b, rec(id, n - 8), "record {i} is torn");
        out.push(id);
    }
    Ok(out)
}

#[derive(Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
}

/// The file-system model the trace is replayed into.
#[derive(Default)]
struct Model {
    inodes: Vec<Inode>,
    live: HashMap<PathBuf, usize>,
    durable: HashMap<PathBuf, usize>,
    /// The last write not yet covered by an fsync of its file: (inode, offset, bytes).
    last_unsynced: Option<(usize, u64, Vec<u8>)>,
}

impl Model {
    fn apply(&mut self, e: &Event) {
        match e {
            Event::Create(p) => {
                self.inodes.push(Inode::default());
                self.live.insert(p.clone(), self.inodes.len() - 1);
            }
            Event::Write(p, off, bytes) => {
                let Some(&i) = self.live.get(p) else { panic!("write to unknown file {p:?}") };
                let ino = &mut self.inodes[i];
                let end = *off as usize + bytes.len();
                if ino.live.len() < end {
                    ino.live.resize(end, 0);
                }
                ino.live[*off as usize..end].copy_from_slice(bytes);
                self.last_unsynced = Some((i, *off, bytes.clone()));
            }
            Event::SetLen(p, len) => {
                let i = self.live[p];
                self.inodes[i].live.resize(*len as usize, 0);
            }
            Event::Fsync(p) => {
                let i = self.live[p];
                self.inodes[i].durable = self.inodes[i].live.clone();
                if matches!(self.last_unsynced, Some((j, ..)) if j == i) {
                    self.last_unsynced = None;
                }
            }
            Event::FsyncDir(_) => self.durable = self.live.clone(),
            Event::Rename(from, to) => {
                let i = self.live.remove(from).expect("rename of a live file");
                self.live.insert(to.clone(), i);
            }
            Event::Remove(p) => {
                self.live.remove(p);
            }
        }
    }

    /// Writes the image a crash would leave into `dir`.
    fn image(&self, dir: &Path, root: &Path, how: Crash) {
        std::fs::create_dir_all(dir).unwrap();
        let names = if how == Crash::KeepLive { &self.live } else { &self.durable };
        for (p, &i) in names {
            let mut bytes =
                if how == Crash::KeepLive { self.inodes[i].live.clone() } else { self.inodes[i].durable.clone() };
            if how == Crash::Torn {
                if let Some((j, off, w)) = &self.last_unsynced {
                    if *j == i {
                        let part = &w[..w.len().min(512)];
                        let end = *off as usize + part.len();
                        if bytes.len() < end {
                            bytes.resize(end, 0);
                        }
                        bytes[*off as usize..end].copy_from_slice(part);
                    }
                }
            }
            let rel = p.strip_prefix(root).unwrap();
            std::fs::write(dir.join(rel), bytes).unwrap();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Crash {
    DropUnsynced,
    Torn,
    KeepLive,
}

/// Runs the workload in `dir` with tracing on; returns the trace, the trace
/// length at each step boundary, and the ids held after each step.
fn workload(dir: &Path, size: usize, fixed: bool, sealable: bool) -> (Vec<Event>, Vec<usize>, Vec<Vec<u64>>) {
    fault::start_trace();
    let mut marks = vec![0];
    let mut states = vec![Vec::new()];
    let codec = if fixed { Codec::Raw } else { Codec::Zstd };
    let s = Store::builder(dir).chunk_bytes(3000).codec(codec).sealable(sealable).create().unwrap();
    let mut step = |f: &dyn Fn(&Store)| {
        f(&s);
        marks.push(fault::trace_len());
        states.push(ids(&s).unwrap());
    };
    let append = |s: &Store, r: std::ops::Range<u64>| {
        let recs: Vec<Vec<u8>> = r.map(|i| rec(i, size + if fixed { 0 } else { (i as usize % 7) * 40 })).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|v| v.as_slice()).collect();
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
    };
    step(&|_| {});
    step(&|s| append(s, 0..12));
    step(&|s| append(s, 12..30));
    // A seal rewrites the table alone: raw records of one length always
    // seal, others where the writer was sealable (else a step that
    // changes nothing).
    step(&|s| {
        let sealed = s.seal().unwrap().format_after == 2;
        assert_eq!(sealed, fixed || sealable, "seal of {size}-byte records, fixed {fixed}, sealable {sealable}");
    });
    step(&|s| s.delete(&[1, 29, 7]).unwrap());
    step(&|s| {
        s.compact().unwrap();
    });
    step(&|s| append(s, 30..40));
    step(&|s| append(s, 40..44));
    step(&|s| s.delete(&[0, 2, 4, 6]).unwrap());
    step(&|s| append(s, 44..60));
    step(&|s| {
        s.compact().unwrap();
    });
    step(&|s| assert_eq!(s.compact_to(2).unwrap().format_after, 2));
    step(&|s| append(s, 60..70));
    step(&|s| {
        s.compact_to(2).unwrap();
    });
    step(&|s| s.delete(&[3, 60]).unwrap());
    step(&|s| {
        s.compact_to(2).unwrap();
    });
    drop(s);
    (fault::take_trace(), marks, states)
}

#[test]
fn every_power_loss_image_opens_with_an_acknowledged_state() {
    let mut states_checked = 0;
    // (record size, raw records of one length, a sealable writer)
    let runs = [40usize, 64, 300, 900, 1500].map(|n| (n, false, false)).into_iter().chain([
        (40, true, false),
        (900, true, false),
        (300, false, true),
    ]);
    for (size, fixed, sealable) in runs {
        let root = tempfile::tempdir().unwrap();
        let src = root.path().join("src");
        let (trace, marks, states) = workload(&src, size, fixed, sealable);
        assert!(!trace.is_empty());
        let mut model = Model::default();
        for k in 0..=trace.len() {
            if k > 0 {
                model.apply(&trace[k - 1]);
            }
            // The step in progress at point k: state before it is states[j], after states[j + 1].
            let j = marks.iter().rposition(|&m| m <= k).unwrap().min(states.len() - 2);
            let at_boundary = marks.contains(&k);
            for how in [Crash::DropUnsynced, Crash::Torn, Crash::KeepLive] {
                let img = root.path().join(format!("img-{k}-{how:?}"));
                model.image(&img, &src, how);
                states_checked += 1;
                let opened = Store::builder(&img).open_writable();
                let store = match opened {
                    Ok(s) => s,
                    // Before the first head is durable there is no store yet:
                    // open_writable then creates an empty one, which is also fine.
                    Err(e) => panic!("size {size}, point {k}/{} {how:?}: {e}", trace.len()),
                };
                store.verify().unwrap_or_else(|e| panic!("size {size}, point {k} {how:?}: verify: {e}"));
                let got = ids(&store).unwrap();
                let before = &states[j];
                let after = &states[j + 1];
                let ok = &got == before || &got == after || (at_boundary && j > 0 && got == states[j - 1]);
                assert!(
                    ok,
                    "size {size}, point {k}/{} {how:?} (step {j}): holds {got:?}, expected {before:?} or {after:?}",
                    trace.len()
                );
                drop(store);
                std::fs::remove_dir_all(&img).unwrap();
            }
        }
    }
    assert!(states_checked >= 2000, "only {states_checked} crash states");
    println!("power_loss: {states_checked} crash states (drop unsynced, torn at 512 B, keep live), 0 failures");
}
