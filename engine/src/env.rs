//! The environment variables the engine reads, all of them, here.
//!
//! | variable | values | read | effect |
//! |---|---|---|---|
//! | `ZRING_DIRECT` | `0`, `1` | at each store open | forces buffered (`0`) or O_DIRECT (`1`) reads with no record cache and no switching (benchmarks force modes with it); anything else: the read policy decides |
//! | `ZRING_CACHE_BYTES` | bytes, or a number with a binary unit (`512M`, `8G`, `1.5GiB`) | at every look at the budget | the memory budget when no handle states one ([`crate::memory::budget`]); a malformed value is an error naming the variable |
//! | `ZRING_MMAP` | `0` | at each store open | no chunk mappings: every record is read through the I/O backend |
//! | `ZRING_PARTS_DENSE` | `0` | at each dataset-of-parts open | no copy of the small parts' table entries (`crate::parts`) and no array of the open parts' mappings (`crate::io::mapset`): each gather reads every part's table, snapshot and chunk (benchmarks compare the two) |
//! | `ZRING_BACKEND` | `uring`, `pread` | at each store open | the I/O backend instead of the automatic choice |
//! | `ZRING_REQUIRE_URING` | `1` | by the test suites | an io_uring test fails instead of skipping where io_uring is unavailable (CI) |
//! | `ZRING_QUEUE_DEPTH` | 1 to the ring size | once per process | reads in flight per ring (default 256) |
//! | `ZRING_THREADS` | a count | once per process (when the decode pool starts) | decode pool threads (default: cores - 1) |
//! | `ZRING_REGISTRY_DIR` | a directory | when a process first counts the ranks of its cgroup | where each user's private rank registry directory is made, instead of `/dev/shm` ([`crate::memory::ranks`]): a directory every rank of a job sees, for containers that do not share `/dev/shm` |
//! | `ZRING_CRASH_AT` | `name:k` | once per process, with the `fault-injection` feature only | crash at the k-th pass of a named crash point (tests) |
//!
//! Values are read where the decision they change is made, never on a
//! gather's path. The budget is read at every look because a program (or a
//! test) may move it while it reads, and the cache follows it.

/// `ZRING_DIRECT`: `Some(true)` for `1`, `Some(false)` for `0`.
pub(crate) fn direct() -> Option<bool> {
    match std::env::var("ZRING_DIRECT").ok().as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// `ZRING_CACHE_BYTES` as written (`None` when unset).
pub(crate) fn cache_bytes() -> Option<std::ffi::OsString> {
    std::env::var_os("ZRING_CACHE_BYTES")
}

/// `ZRING_REGISTRY_DIR`, if set and not empty.
pub(crate) fn registry_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("ZRING_REGISTRY_DIR").filter(|v| !v.is_empty()).map(Into::into)
}

/// `ZRING_PARTS_DENSE` is not `0`.
pub(crate) fn parts_dense() -> bool {
    std::env::var("ZRING_PARTS_DENSE").as_deref() != Ok("0")
}

/// `ZRING_MMAP` is not `0`.
pub(crate) fn mmap() -> bool {
    std::env::var("ZRING_MMAP").as_deref() != Ok("0")
}

/// `ZRING_BACKEND`, if set.
pub(crate) fn backend() -> Option<String> {
    std::env::var("ZRING_BACKEND").ok()
}

/// `ZRING_REQUIRE_URING=1`.
#[cfg(test)]
pub(crate) fn require_uring() -> bool {
    std::env::var("ZRING_REQUIRE_URING").as_deref() == Ok("1")
}

/// `ZRING_QUEUE_DEPTH`, if set to a number.
pub(crate) fn queue_depth() -> Option<usize> {
    std::env::var("ZRING_QUEUE_DEPTH").ok()?.parse().ok()
}

/// `ZRING_THREADS`, if set to a number.
pub(crate) fn threads() -> Option<usize> {
    std::env::var("ZRING_THREADS").ok()?.parse().ok()
}

/// `ZRING_CRASH_AT`, if set.
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code, reason = "read by crash points of test builds"))]
pub(crate) fn crash_at() -> Option<String> {
    std::env::var("ZRING_CRASH_AT").ok()
}
