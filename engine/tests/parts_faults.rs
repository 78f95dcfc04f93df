//! The commit of a dataset of parts under faults (cargo feature
//! `fault-injection`; a binary of its own, as an armed fault is the
//! process's): a commit killed at each of its crash points, or failed by an
//! injected error at each of its operations, leaves a dataset that opens
//! and lists exactly the commits acknowledged, and a retried commit lists a
//! part once.

use std::path::PathBuf;

use zring_engine::parts::{commit, read_manifest, Mode, Options, Staged};
use zring_engine::{Parts, Store};

#[path = "common/parts.rs"]
mod parts;
use parts::{listed, req, stage};

/// An armed fault is the whole process's: the tests that arm one, or that
/// check a dataset's files, run one at a time (the harness runs tests on
/// threads side by side; the crash test's checks failed now and then on
/// the other test's injected EIO).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The child of the crash test: two commits, each acknowledged in a file
/// once it returned; `ZRING_CRASH_AT` aborts it somewhere.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var("PARTS_CRASH_DIR") else { return };
    let root = PathBuf::from(dir);
    for k in 0..2 {
        let s = stage(&root, 2 + k, None);
        std::fs::write(root.join(format!("next-{k}")), &s.name).unwrap();
        commit(&[req(&root, vec![s.clone()], Mode::Append)], &Options::default()).unwrap();
        std::fs::write(root.join(format!("acked-{k}")), &s.name).unwrap();
    }
}

/// A commit killed at each of its crash points (`ZRING_CRASH_AT`, with the
/// `fault-injection` feature): the dataset opens and lists every
/// acknowledged commit, a part is committed at most once, and committing
/// the interrupted part again lands it once.
#[test]
fn a_commit_killed_at_each_crash_point_keeps_every_acknowledged_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut runs = 0;
    for point in ["parts.manifest_written", "parts.moved_one", "parts.moved", "parts.committed", "atomic.renamed"] {
        for k in 1..=3 {
            let t = tempfile::tempdir().unwrap();
            let root = t.path().join("ds");
            std::fs::create_dir_all(&root).unwrap();
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
                .env("PARTS_CRASH_DIR", &root)
                .env("ZRING_CRASH_AT", format!("{point}:{k}"))
                .output()
                .unwrap();
            runs += 1;
            let acked: Vec<String> = (0..2)
                .filter_map(|i| std::fs::read_to_string(root.join(format!("acked-{i}"))).ok())
                .map(|n| format!("parts/{n}"))
                .collect();
            let m = read_manifest(&root);
            let now: Vec<String> = match &m {
                Ok(m) => m.parts.iter().map(|p| p.dir.clone()).collect(),
                Err(_) => Vec::new(),
            };
            if !acked.is_empty() || root.join("manifest.json").exists() {
                let parts = Parts::open(&root).unwrap_or_else(|e| panic!("{point}:{k}: the dataset opens: {e}"));
                assert_eq!(parts.part_count(), now.len());
            }
            for a in &acked {
                assert!(now.contains(a), "{point}:{k}: acknowledged {a} is listed ({now:?}; {out:?})");
            }
            // The interrupted commit, again: listed once.
            for i in 0..2 {
                let Ok(name) = std::fs::read_to_string(root.join(format!("next-{i}"))) else { continue };
                if now.contains(&format!("parts/{name}")) {
                    continue;
                }
                let staged = root.join("parts").join(&name).exists() || root.join("staging").join(&name).exists();
                if !staged {
                    continue; // killed before the part was staged whole
                }
                let store_dir = if root.join("staging").join(&name).exists() { "staging" } else { "parts" };
                let fp = Store::open(root.join(store_dir).join(&name)).unwrap().fingerprint().unwrap();
                let s = Staged { name: name.clone(), records: fp.records, content: format!("{:08x}", fp.content) };
                commit(&[req(&root, vec![s.clone()], Mode::Append)], &Options::default()).unwrap();
                commit(&[req(&root, vec![s], Mode::Append)], &Options::default()).unwrap();
                let after = listed(&root);
                assert_eq!(after.iter().filter(|d| **d == format!("parts/{name}")).count(), 1, "{point}:{k}");
            }
        }
    }
    println!("parts crash points: {runs} killed commits, every acknowledged commit kept");
}

/// A commit failed by an injected error at each of its operations (open,
/// write, fsync): it either stands (and lists its part) or changed
/// nothing; the dataset opens after each, and a retry lands the part once.
#[test]
fn a_commit_failed_at_each_operation_stands_whole_or_changed_nothing() {
    use zring_engine::fault::{arm, disarm, Kind};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut tried = 0;
    for kind in [Kind::Open, Kind::Write, Kind::Fsync, Kind::Read] {
        for nth in 1..=12 {
            let t = tempfile::tempdir().unwrap();
            let root = t.path().join("ds");
            let a = stage(&root, 3, None);
            commit(&[req(&root, vec![a], Mode::Append)], &Options::default()).unwrap();
            let b = stage(&root, 2, None);
            arm(kind, nth, libc::EIO);
            let r = commit(&[req(&root, vec![b.clone()], Mode::Append)], &Options::default());
            disarm();
            tried += 1;
            let now = listed(&root);
            let dir = format!("parts/{}", b.name);
            match &r {
                Ok(_) => assert!(now.contains(&dir), "{kind:?} {nth}: a commit that stands lists its part"),
                Err(_) => assert_eq!(now.len(), 1, "{kind:?} {nth}: a failed commit changed nothing: {r:?}"),
            }
            Parts::open(&root).unwrap_or_else(|e| panic!("{kind:?} {nth}: the dataset opens: {e}"));
            commit(&[req(&root, vec![b], Mode::Append)], &Options::default()).unwrap();
            assert_eq!(listed(&root).iter().filter(|d| **d == dir).count(), 1);
        }
    }
    println!("parts faults: {tried} injected failures, each commit whole or nothing");
}
