//! fork() while other threads gather ≥ 256 records on the decode pool: the
//! child reads the store (on its own pool and ring) and exits; nothing hangs.
//!
//! Without the fork gate a child could inherit a lock held by a gathering
//! thread (a snapshot, the read policy, the pool's or the descriptor cache's
//! slot) and block forever on its first gather. The parent waits for each
//! child with a deadline, so a hang fails the test instead of freezing it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zring_engine::{BackendKind, Codec, Store};

const N: u64 = 4000;
const LEN: usize = 2048;

fn rec(i: u64) -> Vec<u8> {
    (0..LEN).map(|k| ((i * 131 + k as u64 / 16) % 251) as u8).collect()
}

fn check(store: &Store, idx: &[u64]) -> bool {
    let mut dst = vec![0u8; idx.len() * LEN];
    store.gather(&zring_engine::Gather::fixed(idx, LEN), &mut dst).is_ok()
        && idx.iter().enumerate().all(|(k, &i)| dst[k * LEN..(k + 1) * LEN] == rec(i))
}

fn batch(seed: u64) -> Vec<u64> {
    (0..256u64).map(|k| (seed.wrapping_mul(0x9E37_79B9) + k * 7919) % N).collect()
}

/// Waits for `pid` until the deadline; kills it and returns None on a hang.
fn wait(pid: libc::pid_t, deadline: Instant) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into `status`, a valid i32.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if Instant::now() > deadline {
            // SAFETY: kill and waitpid on our own child; `status` is valid.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn forks_while_gathering(backend: BackendKind, direct: bool) {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::builder(dir.path()).codec(Codec::Zstd).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..N).map(rec).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
    }
    let store = Arc::new(Store::builder(dir.path()).backend(backend).direct(direct).open().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let gatherers: Vec<_> = (0..3)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut k = t;
                while !stop.load(Ordering::Relaxed) {
                    assert!(check(&store, &batch(k)), "parent gather {k}");
                    k += 3;
                }
            })
        })
        .collect();
    for round in 0..40u64 {
        std::thread::sleep(Duration::from_millis(3));
        // SAFETY: the child only runs Rust code that tolerates a forked
        // multi-threaded parent (glibc's malloc is fork-safe; zring's fork
        // gate makes its own locks so) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // Child: the inherited handle, a fresh handle, each on the pool.
            let ok = check(&store, &batch(1000 + round))
                && Store::builder(dir.path())
                    .backend(backend)
                    .direct(direct)
                    .open()
                    .is_ok_and(|s| check(&s, &batch(round)));
            // SAFETY: _exit ends the child without running the parent's
            // destructors or atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        match wait(pid, Instant::now() + Duration::from_secs(20)) {
            None => panic!("round {round} ({backend:?}, direct {direct}): the child hung"),
            Some(status) => assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "round {round} ({backend:?}, direct {direct}): child status {status:#x}"
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for g in gatherers {
        g.join().unwrap();
    }
}

/// A child forked while another thread appends never waits on the store's
/// writer (which a fork between two blocks of the append leaves locked by a
/// thread the child does not have): writing through the parent's handle is
/// refused at once, and reading works.
#[test]
fn fork_during_an_append_refuses_the_childs_writes_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::builder(dir.path()).codec(Codec::Zstd).create().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let recs: Vec<Vec<u8>> = (0..2000).map(rec).collect();
            let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
            while !stop.load(Ordering::Relaxed) {
                store.append(&refs, None).unwrap();
            }
        })
    };
    // The child reads records of the first append: wait for it (on a busy
    // machine 2,000 zstd records can take longer than any fixed sleep).
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.len() < 2000 {
        assert!(Instant::now() < deadline, "the first append did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    for round in 0..10u64 {
        std::thread::sleep(Duration::from_millis(7));
        // SAFETY: as in forks_while_gathering.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let refused = matches!(store.sync(), Err(zring_engine::Error::ReadOnly(m)) if m.contains("forked child"));
            let code = if !refused {
                3
            } else if !check(&store, &[0, 1, 1999]) {
                4
            } else {
                0
            };
            // SAFETY: as in forks_while_gathering.
            unsafe { libc::_exit(code) };
        }
        match wait(pid, Instant::now() + Duration::from_secs(20)) {
            None => panic!("round {round}: the child hung on the writer"),
            Some(status) => assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "round {round}: child status {status:#x} (exit 3: the write was not refused; 4: a read failed)"
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    appender.join().unwrap();
}

#[test]
fn fork_while_gathering_on_the_pool() {
    let mut backends = vec![BackendKind::Pread];
    if Store::builder(tempfile::tempdir().unwrap().path()).backend(BackendKind::Uring).create().is_ok() {
        backends.push(BackendKind::Uring);
    } else {
        assert!(std::env::var_os("ZRING_REQUIRE_URING").is_none(), "io_uring is required here");
    }
    for backend in backends {
        for direct in [false, true] {
            forks_while_gathering(backend, direct);
        }
    }
}
