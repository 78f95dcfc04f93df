//! The read policy: how a store is read given the memory budget
//! ([`crate::memory::budget`]) and what the reads observe.
//!
//! # The policy ([`choose`], [`cache_total`], [`reconsider`])
//!
//! [`choose`] compares the store's stored bytes with the budget. A budget the
//! engine measured (cgroup, `MemAvailable`) is discounted; one a person stated
//! (explicit, env) is taken at face value, since whoever wrote it has already
//! left room for the rest of the program.
//!
//! * Buffered while `data <= budget * FIT` with `FIT = 4/5` for measured
//!   budgets. The fifth left over is for what the process allocates after the
//!   budget was measured (the loader's batch buffers, `depth + 4` sets of
//!   them; decoded tensors; the interpreter), the record table's pages (32
//!   bytes a record, about 1 % of the data for 3 KiB records), and the kernel
//!   starting reclaim before the limit is reached.
//! * Otherwise O_DIRECT reads and a record cache of the budget less a
//!   reserve, `max(RESERVE_MIN, budget * RESERVE_SHARE)` = `max(32 MiB,
//!   budget / 16)` for measured budgets. On a whole epoch of a permutation
//!   the cache serves exactly its share of the data and nothing serves more
//!   (see [`crate::memory::cache`]), so every byte kept out of it is a hit lost: the
//!   reserve is what the kernel needs outside the process's resident memory
//!   (page tables, about 2 MiB per GiB mapped; socket and file-system
//!   buffers; the page cache of files the process reads without mapping them)
//!   and the time between two looks at the budget. It does not cover the
//!   process's own growth: that is watched instead ([`cache_total`]).
//!   (A fixed share of 3/4 of the budget, the first rule here, held 0.7 of
//!   limit / data in the README's cgroup benchmark; this one holds 0.84 to
//!   0.88 at dataset/limit 1.5 and 3.) The cache charges its
//!   own per-entry overhead ([`crate::memory::cache::ENTRY_OVERHEAD`]).
//!
//! [`cache_total`] keeps the cache within the budget as the process changes: the
//! budget is detected again every [`CHECK_RECORDS`] records or
//! [`CHECK_BYTES`] stored bytes gathered (whichever comes first; tens of
//! microseconds each), and a cache above its size for the budget now shrinks
//! at once (evicting the farthest-needed records) while one below it grows
//! once the gap exceeds [`GROW_BAND`]. The process's later allocations (the
//! loader's batch buffers, `depth + 4` sets of them; decoded tensors; the
//! interpreter) thus come out of the cache within one check, instead of a
//! fixed quarter of the budget being kept idle for them. The cache is
//! anonymous memory, which the kernel cannot reclaim: memory the process
//! takes faster than one check, or takes while it gathers nothing, can still
//! meet the limit; a program that knows better states its budget. A cache
//! sized from a thrashing page cache (below) never grows: its budget proved
//! wrong.
//!
//! [`reconsider`] corrects the choice from what the reads saw over a window
//! ([`Observed`]). It judges nothing before the policy has been in effect for
//! a full pass over the data (a cold page cache or an empty record cache
//! says nothing about the steady state) and a window of at least
//! [`MIN_WINDOW_RECORDS`] records. So a policy lasts at least one pass, and the
//! rules below leave wide bands between switching one way and back.
//!
//! * Buffered → Direct when the page cache thrashes. On a random permutation
//!   an LRU cache holding a fraction `c` of the data hits `c + (1 - c) ln(1 -
//!   c)` of the reads (a record is found again when the records touched since
//!   its last read, `1 - x(1 - y)` of the data for uniform positions `x` and
//!   `y` in consecutive epochs, are fewer than the cache holds), while the
//!   record cache of this module hits exactly `c`. Given the budget, the page
//!   cache should hold `min(1, budget / data)` of the data; when the resident
//!   fraction is below half of that ([`THRASH`]), the page cache is keeping
//!   less than about 72 % of what it should (or the budget is wrong, as when
//!   other processes share the cgroup). The new record cache takes what the
//!   page cache evidently held (the `c` whose LRU hit rate is the measured one)
//!   but no more than the budget less its reserve, so it uses no more memory than
//!   the page cache was given, and hits `c` instead of the page cache's rate.
//!   (The two rates cross near `c = 0.9`; the rule waits for a clear loss.)
//! * Direct → Buffered when the data has come to fit with room to spare
//!   (`data <= budget * RETURN_FIT`, `RETURN_FIT = 3/5`, below `FIT` so a store
//!   near the line does not flip) and the record cache serves at least
//!   [`FULL_HITS`] of the reads (it holds nearly everything, confirming the
//!   budget). Memory in the page cache is reclaimable and shared with other
//!   processes reading the same files; the cost is one cold pass.
//!
//! Read latency is not an input: it depends on the device, on other tenants
//! of the device and on the batch size, while residency and hit counts are
//! exact counts of what memory did.

use crate::memory::budget::{human, Budget, Ratio, RESERVE_MIN};

/// Smallest window [`reconsider`] judges: with 4096 records the standard error
/// of a measured hit rate is at most 0.8 %, far below the margins of the rules,
/// and at a few hundred records a batch the window is a few dozen gathers.
pub(crate) const MIN_WINDOW_RECORDS: u64 = 4096;

/// The budget is detected again after this many records gathered...
pub(crate) const CHECK_RECORDS: u64 = 4096;

/// ... or this many stored bytes, whichever comes first: half the least
/// reserve, so the cache cannot outgrow a budget by more than that between
/// two looks.
pub(crate) const CHECK_BYTES: u64 = RESERVE_MIN / 2;
pub(crate) use crate::memory::budget::CHECK_MILLIS;

/// A cache below its size for the budget grows only when the gap exceeds
/// this share of it (growing costs nothing but a change of a number; the band
/// keeps a budget that wobbles with the interpreter's allocations from
/// re-sizing the cache on every check).
pub(crate) const GROW_BAND: Ratio = Ratio(1, 32);

/// Direct mode goes back to buffered only for data within this share of the
/// budget: below [`FIT`], so data near the line does not flip the mode.
pub(crate) const RETURN_FIT: Ratio = Ratio(3, 5);

/// Buffered mode is thrashing when the resident fraction falls below this
/// share of what the budget promises.
pub(crate) const THRASH: Ratio = Ratio(1, 2);

/// Direct mode counts the record cache as holding (nearly) everything above
/// this hit rate.
pub(crate) const FULL_HITS: Ratio = Ratio(9, 10);

/// How a store's records are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// Through the page cache (and the chunk mappings for resident pages).
    Buffered,
    /// O_DIRECT, with the record cache in front.
    Direct,
}

/// A decision on how to read a store, with the numbers it was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Buffered or direct reads.
    pub mode: ReadMode,
    /// Capacity of the record cache (0 in buffered mode: the page cache caches).
    pub capacity: u64,
    /// Why, in a sentence for logs and `stats()`.
    pub reason: String,
    /// The budget the decision was made for.
    pub budget: Budget,
    /// The store's stored bytes the decision was made for.
    pub data_bytes: u64,
    /// Whether [`cache_total`] may grow the cache with the budget (not for a cache
    /// sized from what a thrashing page cache held).
    pub grows: bool,
}

/// How to read a store of `data_bytes` stored bytes within `budget`: buffered
/// while the data fits the budget's [`FIT`] share, else direct with a record
/// cache of the budget less its reserve (module docs).
pub(crate) fn choose(budget: &Budget, data_bytes: u64) -> Policy {
    let fit = budget.fit();
    if data_bytes <= fit.of(budget.bytes) {
        buffered(
            budget,
            data_bytes,
            format!(
                "the store's {} fit in {} % of the budget of {}: buffered reads, the page cache keeps the data",
                human(data_bytes),
                fit.percent(),
                budget.describe()
            ),
        )
    } else {
        let cache = budget.for_caches();
        let reason = format!(
            "the store's {} exceed {} % of the budget of {}: O_DIRECT reads and a record cache of {}{}, \
             which serves about {} % of a random epoch from memory",
            human(data_bytes),
            fit.percent(),
            budget.describe(),
            human(cache),
            kept(budget),
            hit_percent(cache, data_bytes)
        );
        direct(budget, data_bytes, cache, reason, true)
    }
}

/// ", keeping 40 MiB of the budget for the rest of the process and 80 MiB
/// for the reads beside it": the reserve of a measured budget and what the
/// slab pool and reads in flight may hold ([`Budget::io`]).
pub(crate) fn kept(budget: &Budget) -> String {
    match (budget.reserve(), budget.io()) {
        (0, 0) => String::new(),
        (0, io) => format!(", keeping {} of the budget for the reads beside it", human(io)),
        (r, 0) => format!(", keeping {} of the budget for the rest of the process", human(r)),
        (r, io) => format!(
            ", keeping {} of the budget for the rest of the process and {} for the reads beside it",
            human(r),
            human(io)
        ),
    }
}

fn buffered(budget: &Budget, data_bytes: u64, reason: String) -> Policy {
    Policy { mode: ReadMode::Buffered, capacity: 0, reason, budget: budget.clone(), data_bytes, grows: false }
}

fn direct(budget: &Budget, data_bytes: u64, cache_bytes: u64, reason: String, grows: bool) -> Policy {
    Policy { mode: ReadMode::Direct, capacity: cache_bytes, reason, budget: budget.clone(), data_bytes, grows }
}

/// The record caches' total for `budget` (the budget detected now), given
/// the total `now`, or `None` to keep it: shrunk once it is more than
/// [`SHRINK_SLACK`] above what the budget allows, grown (when the policy
/// [`Policy::grows`]) once it is short by more than [`GROW_BAND`] (module
/// docs). [`crate::memory::owner`] shares the total out among the stores.
pub(crate) fn cache_total(now: u64, grows: bool, budget: &Budget) -> Option<u64> {
    let target = budget.for_caches();
    // A stated budget keeps no reserve to absorb the slack.
    let slack = if budget.source.is_stated() { 0 } else { SHRINK_SLACK };
    (target.saturating_add(slack) < now || grows && target > now && target - now > GROW_BAND.of(now)).then_some(target)
}

/// A cache shrinks only when the budget fell by more than this: with looks
/// every [`CHECK_MILLIS`], the other processes' memory wobbling by a few
/// megabytes (an interpreter's allocations, batch buffers) would otherwise
/// evict and re-admit records all the time. A quarter of the least reserve of a measured
/// budget, which covers it; a stated budget (no reserve) has no slack.
pub(crate) const SHRINK_SLACK: u64 = RESERVE_MIN / 4;

pub(crate) fn hit_percent(cache: u64, data: u64) -> u64 {
    if data == 0 {
        100
    } else {
        (u128::from(cache) * 100 / u128::from(data)).min(100) as u64
    }
}

/// What reads saw while a policy was in effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Records gathered in the window (the counters since the last call of
    /// [`reconsider`], say).
    pub records: u64,
    /// Of those, records whose stored bytes were already in memory: in
    /// buffered mode, found resident in the page cache; in direct mode, served
    /// by the record cache.
    pub resident: u64,
    /// Stored bytes gathered since the current policy took effect (not just
    /// in the window): nothing is judged before a full pass.
    pub read_bytes: u64,
    /// The store's stored bytes now.
    pub data_bytes: u64,
    /// The budget now: detected again (cheap), or the policy's own.
    pub budget: Budget,
}

/// A better policy than `current` given what reads saw, or `None` to keep it
/// (module docs: the rules and their margins).
pub(crate) fn reconsider(current: &Policy, seen: &Observed) -> Option<Policy> {
    if seen.records < MIN_WINDOW_RECORDS || seen.read_bytes < seen.data_bytes {
        return None;
    }
    let budget = &seen.budget;
    let data = seen.data_bytes;
    let rate = seen.resident.min(seen.records) as f64 / seen.records as f64;
    match current.mode {
        ReadMode::Buffered => {
            let promised = if data == 0 { 1.0 } else { (budget.bytes as f64 / data as f64).min(1.0) };
            if rate >= promised * THRASH.0 as f64 / THRASH.1 as f64 {
                return None;
            }
            // The fraction of the data an LRU page cache must have held to hit
            // `rate` on random permutations: what it evidently had.
            let held = lru_fraction_for(rate);
            let cache = budget.for_caches().min((held * data as f64) as u64);
            if cache == 0 {
                // Nothing evidently held and nothing to hold it in: O_DIRECT
                // reads with no cache would serve nothing from memory.
                return None;
            }
            let reason = format!(
                "the page cache is thrashing: {:.0} % of the last {} records were resident where the budget \
                 of {} promised {:.0} % for {} of data; it held about {:.0} % of the data, so O_DIRECT reads \
                 and a record cache of {} serve about {} % instead",
                rate * 100.0,
                seen.records,
                budget.describe(),
                promised * 100.0,
                human(data),
                held * 100.0,
                human(cache),
                hit_percent(cache, data)
            );
            Some(direct(budget, data, cache, reason, false))
        }
        ReadMode::Direct => {
            let full = rate * FULL_HITS.1 as f64 >= FULL_HITS.0 as f64;
            if full && data <= RETURN_FIT.of(budget.bytes) {
                let reason = format!(
                    "the store's {} now fit in {} % of the budget of {} and the record cache served {:.0} % \
                     of the last {} records: buffered reads, the page cache keeps the data",
                    human(data),
                    RETURN_FIT.percent(),
                    budget.describe(),
                    rate * 100.0,
                    seen.records
                );
                return Some(buffered(budget, data, reason));
            }
            None
        }
    }
}

/// Hit rate of an LRU cache holding fraction `c` of the data, on epochs of
/// independent random permutations: `c + (1 - c) ln(1 - c)`.
pub(crate) fn lru_hit_rate(c: f64) -> f64 {
    let c = c.clamp(0.0, 1.0);
    if c >= 1.0 {
        1.0
    } else {
        c + (1.0 - c) * (1.0 - c).ln()
    }
}

/// The `c` with `lru_hit_rate(c) == rate` (the function increases on [0, 1]).
fn lru_fraction_for(rate: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..50 {
        let mid = (lo + hi) / 2.0;
        if lru_hit_rate(mid) < rate {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::budget::BudgetSource;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    /// What the slab pool and the reads in flight may hold ([`Budget::io`]).
    const IO: u64 = 80 * MIB;

    fn measured(bytes: u64) -> Budget {
        Budget::new(bytes, BudgetSource::MemAvailable { available: bytes, cached: 0 })
    }

    #[test]
    fn choose_buffered_while_data_fits() {
        let b = measured(10 * GIB);
        let p = choose(&b, 8 * GIB);
        assert_eq!((p.mode, p.capacity), (ReadMode::Buffered, 0));
        let p = choose(&b, 8 * GIB + 1);
        // The budget less its reserve, a sixteenth of it, and less what the
        // reads hold beside the cache.
        assert_eq!((p.mode, p.capacity), (ReadMode::Direct, 10 * GIB - 640 * MIB - IO));
        assert!(p.reason.contains("serves about 100 %"), "{}", p.reason);
        assert!(
            p.reason.contains("keeping 640 MiB of the budget for the rest of the process and 80 MiB for the reads"),
            "{}",
            p.reason
        );
        // A small budget keeps at least RESERVE_MIN, and an eighth for the reads.
        assert_eq!(choose(&measured(100 * MIB), GIB).capacity, 100 * MIB - RESERVE_MIN - 100 * MIB / 8);
        assert_eq!(choose(&measured(20 * MIB), GIB).capacity, 0);
        // A stated budget is taken at face value.
        let s = Budget::new(10 * GIB, BudgetSource::Env { value: "10G".into() });
        assert_eq!(choose(&s, 10 * GIB).mode, ReadMode::Buffered);
        let p = choose(&s, 20 * GIB);
        assert_eq!((p.mode, p.capacity), (ReadMode::Direct, 10 * GIB - IO));
        // A zero budget caches nothing.
        let z = Budget::new(0, BudgetSource::Explicit);
        assert_eq!(choose(&z, 1).capacity, 0);
        assert_eq!(choose(&z, 0).mode, ReadMode::Buffered);
    }

    fn seen(p: &Policy, records: u64, resident: u64, data: u64, budget: u64) -> Observed {
        Observed {
            records,
            resident,
            read_bytes: data,
            data_bytes: data,
            budget: Budget { bytes: budget, ..p.budget.clone() },
        }
    }

    #[test]
    fn buffered_switches_to_direct_when_the_page_cache_thrashes() {
        let p = choose(&measured(10 * GIB), 6 * GIB);
        assert_eq!(p.mode, ReadMode::Buffered);
        // Healthy, too few records, or before a full pass: keep.
        assert_eq!(reconsider(&p, &seen(&p, 10_000, 9_900, 6 * GIB, 10 * GIB)), None);
        assert_eq!(reconsider(&p, &seen(&p, 4_000, 0, 6 * GIB, 10 * GIB)), None);
        let cold = Observed { read_bytes: 5 * GIB, ..seen(&p, 10_000, 0, 6 * GIB, 10 * GIB) };
        assert_eq!(reconsider(&p, &cold), None);
        // 15 % resident: an LRU cache holding half the data.
        let q = reconsider(&p, &seen(&p, 10_000, 1_534, 6 * GIB, 10 * GIB)).expect("thrashing");
        assert_eq!(q.mode, ReadMode::Direct);
        let want = 3 * GIB;
        assert!(q.capacity.abs_diff(want) < want / 100, "{} vs {want}", q.capacity);
        assert!(q.reason.contains("thrashing"), "{}", q.reason);
        // Data grown to ten times the budget: an LRU page cache then hits
        // 0.5 % where the record cache would hit 7.5 %; the cache is capped
        // by the budget.
        let r = (lru_hit_rate(0.1) * 10_000.0) as u64;
        let q = reconsider(&p, &seen(&p, 10_000, r, 100 * GIB, 10 * GIB)).expect("thrashing");
        assert_eq!(q.capacity, 10 * GIB - 640 * MIB - IO);
        assert!(!q.grows);
        // Half of what that budget promises (10 %) is no thrash.
        assert_eq!(reconsider(&p, &seen(&p, 10_000, 500, 100 * GIB, 10 * GIB)), None);
    }

    #[test]
    fn direct_returns_to_buffered_only_well_inside_the_budget() {
        let p = choose(&measured(10 * GIB), 9 * GIB);
        assert_eq!(p.mode, ReadMode::Direct);
        // The data shrank to 7 GiB: fits FIT but not RETURN_FIT, keep.
        assert_eq!(reconsider(&p, &seen(&p, 10_000, 10_000, 7 * GIB, 10 * GIB)), None);
        // 6 GiB with a full cache: back to buffered.
        let q = reconsider(&p, &seen(&p, 10_000, 9_950, 6 * GIB, 10 * GIB)).expect("fits");
        assert_eq!((q.mode, q.capacity), (ReadMode::Buffered, 0));
        // 6 GiB but the cache misses: keep.
        assert_eq!(reconsider(&p, &seen(&p, 10_000, 8_000, 6 * GIB, 10 * GIB)), None);
    }

    #[test]
    fn the_cache_follows_the_budget_down_at_once_and_up_past_a_band() {
        let now = 10 * GIB - 640 * MIB - IO;
        assert_eq!(choose(&measured(10 * GIB), 20 * GIB).capacity, now);
        // The same budget, or one a little larger: keep.
        assert_eq!(cache_total(now, true, &measured(10 * GIB)), None);
        assert_eq!(cache_total(now, true, &measured(10 * GIB + 128 * MIB)), None);
        // A fall past the slack shrinks, to the new budget less its reserve;
        // a wobble within it keeps the cache.
        assert_eq!(cache_total(now, true, &measured(10 * GIB - 4 * MIB)), None);
        assert_eq!(cache_total(now, true, &measured(10 * GIB - 16 * MIB)), Some((10 * GIB - 16 * MIB) * 15 / 16 - IO));
        assert_eq!(cache_total(now, true, &measured(5 * GIB)), Some(5 * GIB - 320 * MIB - IO));
        // A budget grown back by more than the band grows it again.
        assert_eq!(cache_total(5 * GIB - 320 * MIB, true, &measured(8 * GIB)), Some(8 * GIB - 512 * MIB - IO));
        // A cache sized from a thrashing page cache only shrinks.
        assert_eq!(cache_total(GIB, false, &measured(40 * GIB)), None);
        assert!(cache_total(GIB, false, &measured(GIB / 2)).is_some());
        // A stated budget keeps no reserve.
        let s = Budget::new(GIB, BudgetSource::Explicit);
        assert_eq!(cache_total(now, true, &s), Some(GIB - IO));
    }

    #[test]
    fn steady_observations_change_the_policy_at_most_once() {
        // Simulate a store whose page cache really holds `held` of the data:
        // buffered reads hit the LRU rate, direct ones the cache's share.
        for held in [0.3, 0.5, 0.7, 0.9, 1.0] {
            for data_gib in [4u64, 8, 9, 12, 30] {
                let data = data_gib * GIB;
                let budget = measured(10 * GIB);
                let mut p = choose(&budget, data);
                let mut changes = 0;
                for _ in 0..20 {
                    let c = held * (budget.bytes as f64 / data as f64).min(1.0);
                    let rate = match p.mode {
                        ReadMode::Buffered => lru_hit_rate(c),
                        ReadMode::Direct => (p.capacity as f64 / data as f64).min(1.0),
                    };
                    let o = Observed {
                        records: 100_000,
                        resident: (rate * 100_000.0) as u64,
                        read_bytes: data,
                        data_bytes: data,
                        budget: budget.clone(),
                    };
                    if let Some(q) = reconsider(&p, &o) {
                        p = q;
                        changes += 1;
                    }
                }
                assert!(changes <= 1, "held {held}, data {data_gib} GiB: {changes} changes, ends {p:?}");
            }
        }
    }

    #[test]
    fn lru_inverse() {
        for c in [0.05, 0.3, 0.5, 0.72, 0.9, 0.99] {
            assert!((lru_fraction_for(lru_hit_rate(c)) - c).abs() < 1e-6, "{c}");
        }
        assert!((lru_hit_rate(0.5) - 0.1534).abs() < 1e-3);
    }
}
