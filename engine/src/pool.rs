//! The decode pool: a rayon pool per process (`ZRING_THREADS` threads, by
//! default one fewer than the cores: the calling thread works too).
//!
//! A forked child inherits the parent's pool object but none of its threads,
//! so using it would hang. The pool is tagged with the pid that built it, and a
//! child builds its own on first use. The parent's pool object is leaked in the
//! child rather than dropped, since dropping it would signal threads that do
//! not exist there.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

static POOL: Mutex<Option<(u32, Arc<ThreadPool>)>> = Mutex::new(None);

/// The current process's pool.
pub(crate) fn get() -> Arc<ThreadPool> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match slot.as_ref() {
        Some((p, pool)) if *p == pid => pool.clone(),
        _ => {
            if let Some(old) = slot.take() {
                std::mem::forget(old);
            }
            let threads = std::env::var("ZRING_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                // The thread calling gather reads a share itself, so the pool
                // needs one thread fewer than there are cores.
                .unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
                });
            let pool = Arc::new(
                ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("zring-{i}"))
                    .build()
                    .expect("spawning the decode threads"),
            );
            *slot = Some((pid, pool.clone()));
            pool
        }
    }
}
