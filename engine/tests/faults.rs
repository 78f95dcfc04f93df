//! I/O fault injection: every read, write, fsync and open of a small workload
//! is failed in turn (EIO or ENOSPC), one run per fault point.
//!
//! Guarantees checked at each point: the failure reaches the caller as a typed
//! error (never a panic); a failed write or fsync poisons the writer, which
//! then refuses further writes instead of retrying; and after reopening, the
//! store verifies and holds exactly the state of the last acknowledged
//! operation or, when the failure struck after the commit point, of the
//! interrupted one. Nothing acknowledged is lost.
//!
//! Run with `cargo test -p zring-engine --features fault-injection --test faults`.

use zring_engine::fault::{self, Kind};
use zring_engine::{Error, Store};

#[path = "common/workload.rs"]
mod workload;
use workload::{append, ids};

/// One step of the workload and the ids the store holds after it.
type Step = fn(&Store) -> Result<(), Error>;

fn steps() -> Vec<(&'static str, Step)> {
    vec![
        ("append 0..40", |s| append(s, 0..40)),
        ("append 40..80", |s| append(s, 40..80)),
        ("delete", |s| s.delete(&[0, 5, 79, 12])),
        ("compact", |s| s.compact().map(drop)),
        ("append 80..100", |s| append(s, 80..100)),
        ("verify", |s| s.verify().map(drop)),
    ]
}

/// Runs the workload on a fresh store; returns the first error with the index
/// of the step that failed and, with `record`, the id lists the store holds
/// before the first step and after each one (the model of a clean run).
fn run(dir: &std::path::Path, record: bool) -> (Vec<Vec<u64>>, Option<(usize, Error)>) {
    let mut states = vec![Vec::new()];
    let store = match Store::builder(dir).chunk_bytes(4096).mmap(false).create() {
        Ok(s) => s,
        Err(e) => return (states, Some((0, e))),
    };
    for (k, (_, step)) in steps().into_iter().enumerate() {
        if let Err(e) = step(&store) {
            if matches!(e, Error::Io { op: "fsync" | "write", .. }) && k != 5 {
                assert!(
                    matches!(store.append(&[b"x"], None), Err(Error::Poisoned(_))),
                    "a failed {e} must poison the writer"
                );
            }
            return (states, Some((k, e)));
        }
        if record {
            states.push(ids(&store));
        }
    }
    (states, None)
}

const KINDS: [Kind; 4] = [Kind::Write, Kind::Fsync, Kind::Open, Kind::Read];

#[test]
fn every_fault_point_becomes_a_typed_error_and_loses_nothing_acknowledged() {
    let root = tempfile::tempdir().unwrap();
    let (clean, err) = run(&root.path().join("model"), true);
    assert!(err.is_none(), "the workload fails without faults: {err:?}");
    let before: Vec<u64> = KINDS.iter().map(|&k| fault::seen(k)).collect();
    let (_, err) = run(&root.path().join("clean"), false);
    assert!(err.is_none());
    let totals: Vec<u64> = KINDS.iter().zip(&before).map(|(&k, b)| fault::seen(k) - b).collect();
    let mut points = 0;
    let mut fired = 0;
    for (kind, &total) in KINDS.iter().zip(&totals) {
        for n in 1..=total {
            for errno in [libc::EIO, libc::ENOSPC] {
                if errno == libc::ENOSPC && *kind != Kind::Write {
                    continue;
                }
                points += 1;
                let dir = root.path().join(format!("{kind:?}-{n}-{errno}"));
                fault::arm(*kind, n, errno);
                let (_, err) = run(&dir, false);
                let unreached = fault::pending();
                fault::disarm();
                let Some((k, e)) = err else {
                    assert!(unreached, "{kind:?} fault #{n} fired but no operation reported it");
                    continue;
                };
                fired += 1;
                let typed = match &e {
                    Error::Io { source, .. } => source.raw_os_error() == Some(errno),
                    _ => false,
                };
                assert!(typed, "{kind:?} fault #{n}: expected an I/O error with errno {errno}, got {e}");
                // Reopen (a writer recovers the files to the committed head).
                let store = Store::builder(&dir)
                    .open_writable()
                    .unwrap_or_else(|e| panic!("{kind:?} #{n}: reopen failed: {e}"));
                store.verify().unwrap_or_else(|e| panic!("{kind:?} #{n}: verify failed: {e}"));
                let got = ids(&store);
                let acked = &clean[k];
                let after = &clean[k + 1];
                assert!(
                    &got == acked || &got == after,
                    "{kind:?} fault #{n} in step {:?}: store holds {got:?}, expected the acknowledged state {acked:?} or the completed step {after:?}",
                    steps()[k].0
                );
            }
        }
    }
    assert!(fired > 0);
    println!(
        "faults: {points} fault points ({} fired; per run: write {}, fsync {}, open {}, read {}), 0 failures",
        fired, totals[0], totals[1], totals[2], totals[3]
    );
}
