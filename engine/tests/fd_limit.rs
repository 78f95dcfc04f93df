//! A store of 100,000 chunk files opens and gathers in a process limited to
//! 256 descriptors (`ulimit -n 256`): chunk files are opened when read, through
//! a cache bounded by the limit.
//!
//! The limited part runs in a child process (this test binary again), since
//! the limit must be in place before the engine first looks at it, and the
//! writer that builds the store keeps the chunks it seals in one append open.

use std::path::Path;
use std::process::Command;

use zring_engine::{BackendKind, Codec, Store};

const CHILD_ENV: &str = "ZRING_FD_LIMIT_CHILD";
const LIMIT: u64 = 256;

fn chunks() -> u64 {
    std::env::var("ZRING_FD_LIMIT_CHUNKS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

fn record(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()
}

/// Builds the store: one 8-byte record per chunk file.
fn build(dir: &Path, n: u64) {
    let store = Store::builder(dir).codec(Codec::Raw).chunk_bytes(8).create().unwrap();
    let per_append = 500;
    for start in (0..n).step_by(per_append) {
        let recs: Vec<[u8; 8]> = (start..n.min(start + per_append as u64)).map(record).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        store.append(&refs, None).unwrap();
    }
    store.sync().unwrap();
    assert_eq!(store.stats().unwrap().chunks, n, "one chunk file per record");
}

/// In the child: the limit, then open and gather under both backends and
/// both read modes, every record checked.
fn limited(dir: &Path, n: u64) {
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: setrlimit reads `lim`, a valid rlimit; lowering limits needs no
    // privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "{}", std::io::Error::last_os_error());
    let mut backends = vec![BackendKind::Pread];
    if Store::builder(dir).backend(BackendKind::Uring).open().is_ok() {
        backends.push(BackendKind::Uring);
    } else {
        assert!(std::env::var_os("ZRING_REQUIRE_URING").is_none(), "io_uring is required here");
    }
    for backend in backends {
        for direct in [false, true] {
            let store = Store::builder(dir).backend(backend).direct(direct).open().unwrap();
            assert_eq!(store.len(), n);
            // Batches of 256 records scattered over the chunks, then every
            // record once in order.
            let mut x = 12345u64;
            for _ in 0..20 {
                let idx: Vec<u64> = (0..256)
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (x >> 33) % n
                    })
                    .collect();
                let mut dst = vec![0u8; idx.len() * 8];
                store.gather(&zring_engine::Gather::fixed(&idx, 8), &mut dst).unwrap();
                for (k, &i) in idx.iter().enumerate() {
                    assert_eq!(dst[k * 8..k * 8 + 8], record(i), "record {i} ({backend:?}, direct {direct})");
                }
            }
            if (backend, direct) != (BackendKind::Pread, false) {
                continue;
            }
            for start in (0..n).step_by(4096) {
                let idx: Vec<u64> = (start..n.min(start + 4096)).collect();
                let mut dst = vec![0u8; idx.len() * 8];
                store.gather(&zring_engine::Gather::fixed(&idx, 8), &mut dst).unwrap();
                for (k, &i) in idx.iter().enumerate() {
                    assert_eq!(dst[k * 8..k * 8 + 8], record(i), "record {i} ({backend:?}, direct {direct})");
                }
            }
        }
    }
}

#[test]
fn a_store_of_many_chunks_gathers_under_ulimit_256() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        limited(Path::new(&dir), chunks());
        return;
    }
    // 100,000 files each synced: on tmpfs where there is one (fsync is free
    // there), else on the temporary directory's disk.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let n = chunks();
    build(dir.path(), n);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_store_of_many_chunks_gathers_under_ulimit_256", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the child under ulimit -n {LIMIT} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
