//! Guarantee: a writer killed with SIGKILL at any moment leaves a store that
//! reopens (writable, which runs recovery, and read-only), passes `verify()`,
//! and holds exactly the state before or after the operation that was
//! interrupted: every record acknowledged as synced is intact, and nothing
//! half-applied is visible.
//!
//! The test binary re-executes itself as a child (`ZRING_CRASH_CHILD` names the
//! store directory). The child appends (then syncs), deletes and compacts in a
//! loop, keeping an in-memory model of the store's ids in index order (delete
//! moves the last record into each hole, exactly as the engine documents). It
//! prints, before each operation, the state the operation will produce, and
//! after it returns, the state it produced. Each record's bytes are a pure
//! function of an id embedded in them, so the parent can read the recovered
//! store back into a list of ids. The parent kills the child after a seeded
//! random delay of 1-30 ms and accepts exactly two states: the last
//! acknowledged one and, if an operation had begun, its announced result.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use zring_engine::{Codec, Store};
use zring_tests::{ids_hash, read_all, record_for, record_id, test_dir, Rng};

const KILLS: usize = 200;
const SEED: u64 = 0x00C0_FFEE_2026;
const CHILD_ENV: &str = "ZRING_CRASH_CHILD";
const CHILD_SEED_ENV: &str = "ZRING_CRASH_CHILD_SEED";
const CHILD_FOCUS_ENV: &str = "ZRING_CRASH_CHILD_FOCUS";
/// Lines of the child's protocol start with this; the test harness prints others.
const TAG: &str = "zr:";
/// The store stays around this size, so each iteration's check is cheap.
const TARGET_LEN: usize = 120;

/// Operations the child runs; the parent counts kills by the one in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Append,
    Delete,
    Compact,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Append => "append",
            Op::Delete => "delete",
            Op::Compact => "compact",
        }
    }
    fn parse(s: &str) -> Option<Op> {
        match s {
            "append" => Some(Op::Append),
            "delete" => Some(Op::Delete),
            "compact" => Some(Op::Compact),
            _ => None,
        }
    }
}

/// The engine's delete semantics, on the model: descending distinct indices,
/// each hole filled by the current last element.
fn model_delete(ids: &mut Vec<u64>, indices: &[u64]) {
    let mut order = indices.to_vec();
    order.sort_unstable_by(|a, b| b.cmp(a));
    order.dedup();
    for i in order {
        ids.swap_remove(i as usize);
    }
}

fn say(line: &str) {
    // stdout is line-buffered and a pipe: once written, the line survives the kill.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG} {line}").expect("write to parent");
    out.flush().expect("flush to parent");
}

fn state_line(ids: &[u64]) -> String {
    format!("len={} hash={:016x}", ids.len(), ids_hash(ids))
}

/// The child: loops on the store until killed.
fn child(dir: &Path) {
    let seed: u64 = std::env::var(CHILD_SEED_ENV).expect("seed").parse().expect("seed number");
    let focus = Op::parse(&std::env::var(CHILD_FOCUS_ENV).expect("focus")).expect("focus op");
    let mut rng = Rng::new(seed);
    // The parent closed its handle before spawning this child, but the
    // other test of this binary spawns children at the same time, and a
    // child forked before that close holds a copy of the lock's descriptor
    // until its exec closes it: `Locked` for that instant only.
    let deadline = Instant::now() + Duration::from_secs(5);
    let store = loop {
        match Store::builder(dir).chunk_bytes(16 << 10).open_writable() {
            Err(zring_engine::Error::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            r => break r.expect("child open"),
        }
    };
    let mut ids: Vec<u64> = read_all(&store)
        .expect("child read")
        .iter()
        .map(|r| record_id(r).expect("child sees a damaged record"))
        .collect();
    // Fresh ids: the seed's high bits keep them distinct across children.
    let mut next_id = seed << 20;
    say(&format!("ready {}", state_line(&ids)));
    loop {
        let op = match (focus, rng.below(4)) {
            _ if ids.len() < TARGET_LEN / 4 => Op::Append,
            (f, 0..=1) => f,
            (_, 2) if ids.len() < TARGET_LEN => Op::Append,
            (_, 2) => Op::Delete,
            _ => [Op::Append, Op::Delete, Op::Compact][rng.below(3) as usize],
        };
        let op = if op == Op::Delete && ids.is_empty() { Op::Append } else { op };
        let mut after = ids.clone();
        match op {
            Op::Append => {
                let n = rng.range(1, 12);
                let new: Vec<u64> = (0..n).map(|k| next_id + k).collect();
                next_id += n;
                let recs: Vec<Vec<u8>> = new.iter().map(|&id| record_for(id)).collect();
                let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
                let codec = [Codec::Raw, Codec::Zstd][rng.below(2) as usize];
                after.extend_from_slice(&new);
                say(&format!("begin append {}", state_line(&after)));
                store.append(&refs, Some(codec)).expect("append");
                store.sync().expect("sync");
            }
            Op::Delete => {
                let n = rng.range(1, 6);
                let idx: Vec<u64> = (0..n).map(|_| rng.below(ids.len() as u64)).collect();
                model_delete(&mut after, &idx);
                say(&format!("begin delete {}", state_line(&after)));
                store.delete(&idx).expect("delete");
            }
            Op::Compact => {
                say(&format!("begin compact {}", state_line(&after)));
                store.compact().expect("compact");
            }
        }
        ids = after;
        assert_eq!(store.len(), ids.len() as u64, "child: store length diverged from the model after {}", op.name());
        say(&format!("ok {} {}", op.name(), state_line(&ids)));
    }
}

/// What the parent learned from one child's output.
struct Transcript {
    ready: Option<String>,
    acked: Option<String>,
    pending: Option<(Op, String)>,
    ops_done: usize,
}

fn parse_line(t: &mut Transcript, line: &str) {
    // The harness may print "test name ... " on the same line before ours.
    let Some(at) = line.find(TAG) else { return };
    let rest = &line[at + TAG.len()..];
    let mut words = rest.trim().splitn(2, ' ');
    let kind = words.next().unwrap_or("");
    let rest = words.next().unwrap_or("");
    match kind {
        "ready" => {
            t.ready = Some(rest.to_string());
            t.acked = Some(rest.to_string());
        }
        "begin" => {
            let (op, state) = rest.split_once(' ').expect("begin line");
            t.pending = Some((Op::parse(op).expect("op name"), state.to_string()));
        }
        "ok" => {
            let (_, state) = rest.split_once(' ').expect("ok line");
            t.acked = Some(state.to_string());
            t.pending = None;
            t.ops_done += 1;
        }
        other => panic!("unknown child line kind {other:?}"),
    }
}

/// Reopens the store as recovery would and returns its state line, or why not.
fn check_store(dir: &Path) -> Result<String, String> {
    {
        let w = Store::builder(dir).open_writable().map_err(|e| format!("writable reopen failed: {e}"))?;
        w.verify().map_err(|e| format!("verify after recovery failed: {e}"))?;
    }
    let r = Store::open(dir).map_err(|e| format!("read-only reopen failed: {e}"))?;
    r.verify().map_err(|e| format!("read-only verify failed: {e}"))?;
    let recs = read_all(&r).map_err(|e| format!("gather of every record failed: {e}"))?;
    let mut ids = Vec::with_capacity(recs.len());
    for (i, rec) in recs.iter().enumerate() {
        ids.push(
            record_id(rec)
                .ok_or_else(|| format!("record {i} ({} bytes) is not any record that was written", rec.len()))?,
        );
    }
    Ok(state_line(&ids))
}

#[test]
fn kill_nine_recovery() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir));
        return;
    }
    let tmp = test_dir();
    let dir = tmp.path().join("store");
    Store::builder(&dir).chunk_bytes(16 << 10).create().expect("create store");
    let exe = std::env::current_exe().expect("current exe");
    let mut rng = Rng::new(SEED);
    let (mut by_op, mut idle, mut ops_total) = ([0usize; 3], 0usize, 0usize);
    let mut failures: Vec<String> = Vec::new();
    let started = Instant::now();
    for kill in 0..KILLS {
        let focus = [Op::Append, Op::Delete, Op::Compact][kill % 3];
        let delay = Duration::from_millis(rng.range(1, 30));
        let mut child = Command::new(&exe)
            .args(["--exact", "kill_nine_recovery", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .env(CHILD_SEED_ENV, (kill as u64 + 1).to_string())
            .env(CHILD_FOCUS_ENV, focus.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Transcript { ready: None, acked: None, pending: None, ops_done: 0 };
        // Wait for the child to open the store; the delay counts from there.
        let deadline = Instant::now() + Duration::from_secs(20);
        while t.ready.is_none() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => parse_line(&mut t, &line),
                Err(_) => break,
            }
        }
        if t.ready.is_none() {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait child");
            panic!("kill {kill}: child never became ready; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(delay);
        // SIGKILL: no destructor, no final sync.
        child.kill().expect("SIGKILL child");
        let out = child.wait_with_output().expect("wait child");
        reader.join().expect("reader thread");
        for line in rx.try_iter() {
            parse_line(&mut t, &line);
        }
        if out.status.code().is_some() {
            failures.push(format!(
                "kill {kill}: child exited by itself ({}) before the kill; stderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        ops_total += t.ops_done;
        match &t.pending {
            Some((op, _)) => by_op[*op as usize] += 1,
            None => idle += 1,
        }
        let acked = t.acked.clone().expect("ready implies a state");
        match check_store(&dir) {
            Ok(state) => {
                let ok = state == acked || t.pending.as_ref().is_some_and(|(_, after)| *after == state);
                if !ok {
                    failures.push(format!(
                        "kill {kill} (delay {delay:?}, during {}): store holds {state}, expected {acked}{}",
                        t.pending.as_ref().map_or("no operation", |(op, _)| op.name()),
                        t.pending.as_ref().map_or(String::new(), |(_, after)| format!(" or {after}")),
                    ));
                }
            }
            Err(e) => failures.push(format!("kill {kill} (delay {delay:?}): {e}")),
        }
        if failures.len() >= 5 {
            break;
        }
    }
    println!(
        "crash_kill: {} kills (append {}, delete {}, compact {}, between operations {}), {} operations acknowledged, {} failures, {:.1} s",
        by_op.iter().sum::<usize>() + idle,
        by_op[Op::Append as usize],
        by_op[Op::Delete as usize],
        by_op[Op::Compact as usize],
        idle,
        ops_total,
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    for (op, n) in [Op::Append, Op::Delete, Op::Compact].iter().zip(by_op) {
        assert!(n > 0, "no kill landed inside {}: the test did not exercise it", op.name());
    }
}

/// Named crash points: the same child, but instead of a timed SIGKILL it
/// aborts itself at the k-th time it reaches a named point of the write path
/// (`zring_engine::fault::CRASH_POINTS`, armed with `ZRING_CRASH_AT=name:k`),
/// for k = 1..=4 at every point. Same guarantee as above: the store reopens,
/// verifies, and holds the acknowledged state or the announced result of the
/// operation in progress.
#[test]
fn named_crash_points() {
    let tmp = test_dir();
    let exe = std::env::current_exe().expect("current exe");
    let (mut aborts, mut unreached) = (0usize, 0usize);
    let mut failures: Vec<String> = Vec::new();
    for (p, point) in zring_engine::fault::CRASH_POINTS.iter().enumerate() {
        for k in 1..=4u64 {
            let dir = tmp.path().join(format!("{point}-{k}"));
            Store::builder(&dir).chunk_bytes(16 << 10).create().expect("create store");
            let focus = match *point {
                "compact.copied" | "table.committed" => Op::Compact,
                "table.written" => [Op::Delete, Op::Compact][k as usize % 2],
                _ => [Op::Append, Op::Delete, Op::Compact][(p + k as usize) % 3],
            };
            let mut child = Command::new(&exe)
                .args(["--exact", "kill_nine_recovery", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, &dir)
                .env(CHILD_SEED_ENV, (1000 + p as u64 * 10 + k).to_string())
                .env(CHILD_FOCUS_ENV, focus.name())
                .env("ZRING_CRASH_AT", format!("{point}:{k}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child");
            let stdout = child.stdout.take().expect("child stdout");
            let reader = std::thread::spawn(move || {
                BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<String>>()
            });
            // What a child that ends otherwise than aborting said (a panic's
            // message), for the failure report.
            let stderr = child.stderr.take().expect("child stderr");
            let err_reader = std::thread::spawn(move || {
                BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<String>>()
            });
            // The child runs until it aborts at the point; one that never gets
            // there k times within the deadline is killed (and checked all the same).
            let deadline = Instant::now() + Duration::from_secs(20);
            let status = loop {
                if let Some(s) = child.try_wait().expect("wait child") {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    child.kill().expect("kill child");
                    child.wait().expect("wait child");
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            let lines = reader.join().expect("reader thread");
            let err_lines = err_reader.join().expect("stderr reader thread");
            let mut t = Transcript { ready: None, acked: None, pending: None, ops_done: 0 };
            for line in &lines {
                parse_line(&mut t, line);
            }
            match status {
                Some(s) if std::os::unix::process::ExitStatusExt::signal(&s) == Some(libc::SIGABRT) => aborts += 1,
                Some(s) => {
                    let from = err_lines.iter().position(|l| l.contains("panicked")).unwrap_or(0);
                    let said: Vec<&str> = err_lines.iter().skip(from).take(3).map(String::as_str).collect();
                    failures.push(format!(
                        "{point}:{k}: child ended with {s} instead of aborting (last operation: {}); it said: {}",
                        t.pending.as_ref().map_or("none", |(op, _)| op.name()),
                        said.join(" | ")
                    ));
                    continue;
                }
                None => unreached += 1,
            }
            let Some(acked) = t.acked.clone() else {
                failures.push(format!("{point}:{k}: child never became ready"));
                continue;
            };
            match check_store(&dir) {
                Ok(state) => {
                    let ok = state == acked || t.pending.as_ref().is_some_and(|(_, after)| *after == state);
                    if !ok {
                        failures.push(format!(
                            "{point}:{k} (during {}): store holds {state}, expected {acked}{}",
                            t.pending.as_ref().map_or("no operation", |(op, _)| op.name()),
                            t.pending.as_ref().map_or(String::new(), |(_, after)| format!(" or {after}")),
                        ));
                    }
                }
                Err(e) => failures.push(format!("{point}:{k}: {e}")),
            }
        }
    }
    println!(
        "crash_points: {aborts} aborts at {} named points (k = 1..=4), {unreached} not reached, {} failures",
        zring_engine::fault::CRASH_POINTS.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(aborts >= zring_engine::fault::CRASH_POINTS.len() * 3, "too few crash points were reached: {aborts}");
}
