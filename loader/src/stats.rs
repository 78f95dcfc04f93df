//! Pipeline statistics: where the time of a step went.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The longest duration the histograms resolve (one hour, in microseconds);
/// longer ones are recorded as this value.
const MAX_MICROS: u64 = 3_600_000_000;

/// A distribution of durations in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// How many durations were recorded.
    pub count: u64,
    /// The mean.
    pub mean_us: f64,
    /// The median.
    pub p50_us: u64,
    /// The 90th percentile.
    pub p90_us: u64,
    /// The 99th percentile.
    pub p99_us: u64,
    /// The 99.9th percentile.
    pub p999_us: u64,
    /// The longest.
    pub max_us: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// A snapshot of a loader's statistics, from [`Loader::stats`](crate::Loader::stats).
///
/// `wait` is what the training loop feels: the time each `next()` call spent
/// blocked. Near-zero waits mean the pipeline keeps ahead; waits close to
/// `gather` mean it does not, and more depth or threads (or a faster store)
/// would help.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoaderStats {
    /// Batches returned by `next()`.
    pub steps_delivered: u64,
    /// Steps gathered by the workers (including ones not yet delivered).
    pub steps_gathered: u64,
    /// Records gathered, counted once per stream.
    pub records_gathered: u64,
    /// Bytes gathered over all streams.
    pub bytes_gathered: u64,
    /// Buffers the workers allocated (or grew) because no pooled one fitted,
    /// not counting those pre-allocated when the loader was built. It stops growing
    /// once the pipeline is in a steady state; steady growth means the caller
    /// holds on to many batches (see the crate docs).
    pub buffers_allocated: u64,
    /// Time each `next()` call blocked waiting for its step.
    pub wait: Percentiles,
    /// Time a worker took to gather one step (all streams).
    pub gather: Percentiles,
    /// Gather threads waiting with the window full (no step to claim): when
    /// it equals the thread count, nothing more is gathered until `next()`.
    pub workers_idle: u64,
    /// What the run consumed of each source before the next step to
    /// deliver (all ranks' rows; [`Consumed`](crate::Consumed)), one per
    /// source.
    #[serde(default)]
    pub consumed: Vec<crate::Consumed>,
    /// CPU-seconds (user plus system) the loader's threads have used since it
    /// was built: the gather threads (with the decode pool's time on their
    /// gathers) and the mode-3 window thread. Divided by the bytes gathered,
    /// the read path's CPU cost per byte.
    pub cpu_s: f64,
    /// The part of `cpu_s` used by the mode-3 window thread and its helpers
    /// (one per mixture source; 0 otherwise).
    pub window_cpu_s: f64,
}

/// CPU time of a loader's threads ([`LoaderStats::cpu_s`]): each gather
/// thread publishes its own after every step, the window thread its id
/// while it runs (read from the kernel) and its total when it ends.
#[derive(Debug, Default)]
pub(crate) struct ThreadsCpu {
    workers: Vec<AtomicU64>,
    window_tid: AtomicU32,
    window_ns: AtomicU64,
    /// The window thread's helpers (a mixture's sources each load their
    /// windows on a thread of their own): the ids of those running, and the
    /// CPU time of those that ended.
    helpers: std::sync::Mutex<Vec<u32>>,
    helpers_ns: AtomicU64,
}

impl ThreadsCpu {
    pub(crate) fn new(workers: usize) -> Self {
        ThreadsCpu { workers: (0..workers).map(|_| AtomicU64::new(0)).collect(), ..ThreadsCpu::default() }
    }

    /// Called on gather thread `i`: its CPU time so far, its gathers' share of
    /// the decode pool's included.
    pub(crate) fn publish(&self, i: usize) {
        let ns = zring_engine::cpu::thread_cpu_ns() + zring_engine::cpu::helped_ns();
        if let Some(slot) = self.workers.get(i) {
            slot.store(ns, Ordering::Relaxed);
        }
    }

    /// Called on the window thread as it starts.
    pub(crate) fn window_started(&self) {
        self.window_tid.store(zring_engine::cpu::thread_id(), Ordering::Relaxed);
    }

    /// Called on the window thread as it ends.
    pub(crate) fn window_ended(&self) {
        let ns = zring_engine::cpu::thread_cpu_ns() + zring_engine::cpu::helped_ns();
        self.window_ns.store(ns, Ordering::Relaxed);
        self.window_tid.store(0, Ordering::Relaxed);
    }

    /// Called on a helper of the window thread as it starts.
    pub(crate) fn helper_started(&self) {
        self.helpers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(zring_engine::cpu::thread_id());
    }

    /// Called on a helper of the window thread as it ends.
    pub(crate) fn helper_ended(&self) {
        let ns = zring_engine::cpu::thread_cpu_ns() + zring_engine::cpu::helped_ns();
        let tid = zring_engine::cpu::thread_id();
        let mut helpers = self.helpers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        helpers.retain(|&t| t != tid);
        self.helpers_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// (all threads, the window thread and its helpers) in seconds.
    fn seconds(&self) -> (f64, f64) {
        let workers: u64 = self.workers.iter().map(|w| w.load(Ordering::Relaxed)).sum();
        let tid = self.window_tid.load(Ordering::Relaxed);
        let live = if tid != 0 { zring_engine::cpu::task_cpu_ns(tid) } else { None };
        let mut window = live.unwrap_or_else(|| self.window_ns.load(Ordering::Relaxed));
        let helpers = self.helpers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        window += helpers.iter().filter_map(|&t| zring_engine::cpu::task_cpu_ns(t)).sum::<u64>();
        window += self.helpers_ns.load(Ordering::Relaxed);
        ((workers + window) as f64 / 1e9, window as f64 / 1e9)
    }
}

/// A histogram of microseconds with its bounds preset, so recording never
/// allocates. Two significant digits (1% resolution) is plenty for latency
/// percentiles and keeps each histogram near 30 KiB instead of the ~200 KiB
/// three digits would take.
pub(crate) fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts; failure would be a
    // programming error caught by every test that builds a loader.
    Histogram::new_with_bounds(1, MAX_MICROS, 2).expect("valid histogram bounds")
}

/// Records a duration in microseconds, clamping to the histogram's range.
pub(crate) fn record(h: &mut Histogram<u64>, d: std::time::Duration) {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    h.saturating_record(micros);
}

/// The worker side of the counters, kept under the pipeline's lock.
#[derive(Debug)]
pub(crate) struct GatherStats {
    pub(crate) steps: u64,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) time: Histogram<u64>,
}

impl GatherStats {
    pub(crate) fn new() -> Self {
        GatherStats { steps: 0, records: 0, bytes: 0, time: histogram() }
    }
}

pub(crate) fn snapshot(
    delivered: u64,
    allocated: u64,
    wait: &Histogram<u64>,
    gather: &GatherStats,
    idle: u64,
    cpu: &ThreadsCpu,
) -> LoaderStats {
    let (cpu_s, window_cpu_s) = cpu.seconds();
    LoaderStats {
        cpu_s,
        window_cpu_s,
        workers_idle: idle,
        buffers_allocated: allocated,
        steps_delivered: delivered,
        steps_gathered: gather.steps,
        records_gathered: gather.records,
        bytes_gathered: gather.bytes,
        wait: Percentiles::of(wait),
        gather: Percentiles::of(&gather.time),
        consumed: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn percentiles_of_known_durations() {
        let mut h = histogram();
        assert_eq!(Percentiles::of(&h), Percentiles::default());
        for us in 1..=1000u64 {
            record(&mut h, Duration::from_micros(us));
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1000);
        // Two significant digits: each value within 1% of the exact one.
        for (got, exact) in [(p.p50_us, 500), (p.p90_us, 900), (p.p99_us, 990), (p.max_us, 1000)] {
            assert!(got.abs_diff(exact) <= exact / 100, "{got} vs {exact}");
        }
        assert!((p.mean_us - 500.5).abs() < 5.0, "{}", p.mean_us);
        // Durations past the range are clamped, not lost.
        record(&mut h, Duration::from_secs(10 * 3600));
        assert_eq!(Percentiles::of(&h).count, 1001);
    }
}
