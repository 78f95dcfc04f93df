//! io_uring failure modes, injected: a thread that cannot make a ring, an
//! `io_uring_enter` that keeps failing, and a panic in a completion callback.
//! None may hang a gather or break the next one.
//!
//! Each scenario runs on a fresh thread (rings are per thread) under a
//! deadline, one at a time (the fault hooks are process-wide), with gathers
//! small enough to run on the calling thread alone.
//!
//! Run with `cargo test -p zring-engine --features fault-injection --test uring_faults`.

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use zring_engine::fault::{self, Kind};
use zring_engine::{BackendKind, Codec, Error, Store};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
const N: u64 = 64;

fn rec(i: u64) -> Vec<u8> {
    (0..512).map(|k| (i * 7 + k) as u8).collect()
}

/// A zstd store of `N` records, or `None` where io_uring is unavailable.
fn store() -> Option<(tempfile::TempDir, Store)> {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::builder(dir.path()).codec(Codec::Zstd).create().unwrap();
        let recs: Vec<Vec<u8>> = (0..N).map(rec).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        s.append(&refs, None).unwrap();
        s.sync().unwrap();
    }
    match Store::builder(dir.path()).backend(BackendKind::Uring).mmap(false).open() {
        Ok(s) => Some((dir, s)),
        Err(e) => {
            assert!(std::env::var_os("ZRING_REQUIRE_URING").is_none(), "io_uring is required here: {e}");
            eprintln!("io_uring unavailable: {e}");
            None
        }
    }
}

fn gather(s: &Store) -> Result<(), Error> {
    let idx: Vec<u64> = (0..N).rev().collect();
    let mut dst = vec![0u8; idx.len() * 512];
    // This thread alone: the faults armed here are this thread's.
    s.gather(&zring_engine::Gather::fixed(&idx, 512).fan_out(false), &mut dst)?;
    for (k, &i) in idx.iter().enumerate() {
        assert_eq!(dst[k * 512..(k + 1) * 512], rec(i), "record {i}");
    }
    Ok(())
}

/// Runs `f` on a new thread; fails the test if it has not returned in 30 s.
/// Whatever `f` armed is disarmed when it ends, even by a panic.
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    struct Disarm;
    impl Drop for Disarm {
        fn drop(&mut self) {
            fault::disarm();
        }
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _disarm = Disarm;
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("the scenario hung (or its thread panicked)")
}

#[test]
fn a_thread_without_a_ring_reads_with_pread() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, s)) = store() else { return };
    let s = std::sync::Arc::new(s);
    let enters = within_deadline(move || {
        fault::arm_from(Kind::RingSetup, 1, libc::ENOMEM);
        let before = fault::seen(Kind::Enter);
        let r = gather(&s).and_then(|()| gather(&s));
        fault::disarm();
        r.unwrap();
        fault::seen(Kind::Enter) - before
    });
    assert_eq!(enters, 0, "with no ring, the thread's gathers ran on pread");
}

/// An `io_uring_enter` that fails (EAGAIN, ENOMEM, EBUSY are what a host
/// short of memory returns) used to fail the user's gather, naming an
/// arbitrary chunk. The ring is at fault, not the files: the batch finishes
/// with pread on the same thread and returns the right bytes, and the next
/// gather gets a new ring.
#[test]
fn a_failing_enter_finishes_the_batch_with_pread_and_the_next_gather_gets_a_new_ring() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, s)) = store() else { return };
    let s = std::sync::Arc::new(s);
    // The first enter fails (nothing reaches the kernel), or the second (the
    // reads were submitted and complete while the ring is watched).
    for nth in [1, 2] {
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EBUSY, libc::EBADF] {
            let s = s.clone();
            let (failed_enters, rings) = within_deadline(move || {
                let enters = fault::seen(Kind::Enter);
                gather(&s).unwrap(); // this thread's ring exists
                assert_eq!(fault::seen(Kind::Enter) - enters, 2, "a gather submits, then waits");
                let rings = fault::seen(Kind::RingSetup);
                let before = fault::seen(Kind::Enter);
                fault::arm_from(Kind::Enter, nth, errno);
                gather(&s).expect("the batch finishes with pread, byte-exact");
                let failed_enters = fault::seen(Kind::Enter) - before;
                fault::disarm();
                gather(&s).unwrap();
                (failed_enters, fault::seen(Kind::RingSetup) - rings)
            });
            assert!(failed_enters >= nth, "enter {nth}, errno {errno}: the fault was hit");
            assert_eq!(rings, 1, "enter {nth}, errno {errno}: the failed ring was replaced");
        }
    }
}

#[test]
fn a_panic_in_a_completion_callback_unwinds_and_the_next_gather_works() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, s)) = store() else { return };
    let s = std::sync::Arc::new(s);
    let (panicked, after) = within_deadline(move || {
        fault::arm(Kind::Complete, 5, 0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gather(&s)));
        fault::disarm();
        (r.is_err(), gather(&s))
    });
    assert!(panicked, "the injected panic reached the caller");
    after.unwrap();
}
