//! The decode pool: a rayon pool per process (`ZRING_THREADS` threads, by
//! default one fewer than the cores: the calling thread works too).
//!
//! A forked child inherits the parent's pool object but none of its threads,
//! so using it would hang. The pool is tagged with the pid that built it, and a
//! child builds its own on first use. The parent's pool object is leaked in the
//! child rather than dropped, since dropping it would signal threads that do
//! not exist there.

use std::sync::Arc;

use crate::io::process::PerProcess;

use rayon::{ThreadPool, ThreadPoolBuilder};

/// Leaked, not dropped, in a child (module docs).
static POOL: PerProcess<Arc<ThreadPool>> = PerProcess::new(0, false);

/// The current process's pool.
pub(crate) fn get() -> Arc<ThreadPool> {
    if let Some(pool) = POOL.read() {
        return Arc::clone(&pool);
    }
    let pool = POOL.write(|_| {
        let threads = crate::env::threads()
            // The thread calling gather reads a share itself, so the pool
            // needs one thread fewer than there are cores.
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)));
        Arc::new(
            ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("zring-{i}"))
                .build()
                .expect("spawning the decode threads"),
        )
    });
    Arc::clone(&pool)
}

#[cfg(test)]
thread_local! {
    /// Groups of reads this thread handed to the pool (tests only).
    pub(crate) static HANDED_OFF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::HANDED_OFF;
    use crate::{Codec, Gather, Store};

    #[test]
    fn a_gather_without_fan_out_gathers_alone_and_gets_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // Raw records, so the batch's stored bytes (1 MiB) are well past the
        // size from which a gather splits.
        let store = Store::builder(dir.path()).codec(Codec::Raw).create().unwrap();
        let records: Vec<Vec<u8>> =
            (0..64u32).map(|i| (0..16_384u32).map(|j| (i * 7 + j / 9) as u8).collect()).collect();
        store.append(&records.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
        store.sync().unwrap();
        let indices: Vec<u64> = (0..64).rev().collect();
        let expected: Vec<u8> = indices.iter().flat_map(|&i| records[i as usize].clone()).collect();
        let handed_off = || HANDED_OFF.with(std::cell::Cell::get);

        let mut shared = vec![0u8; expected.len()];
        let before = handed_off();
        store.gather(&Gather::fixed(&indices, 16_384), &mut shared).unwrap();
        assert!(handed_off() > before, "a 1 MiB gather hands work to the pool by default");
        assert_eq!(shared, expected);

        let mut alone = vec![0u8; expected.len()];
        let before = handed_off();
        store.gather(&Gather::fixed(&indices, 16_384).fan_out(false), &mut alone).unwrap();
        assert_eq!(handed_off(), before, "no work handed to the pool with fan-out off");
        assert_eq!(alone, expected);
    }
}
