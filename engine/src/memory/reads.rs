//! A store's reads as they run: the policy in force ([`crate::memory::budget`]), the
//! record cache in front of its O_DIRECT reads ([`crate::memory::cache`]), the
//! counters [`ReadStats`] reports, and the switch to another policy when the
//! counters say the first choice was wrong.
//!
//! The gather path asks three things of this module per gather: whether reads
//! are direct (a chunk's O_DIRECT descriptor says so already), a cache lookup
//! per record that is not resident (direct mode only, so buffered stores pay
//! nothing), and one [`Reads::observe`] call with the gather's counts. The
//! counts are relaxed atomics: a handful of adds per gather.
//!
//! Why the numbers are what they are: the policy's thresholds and the window
//! it is judged over ([`crate::memory::policy::MIN_WINDOW_RECORDS`]) are argued in
//! `policy.rs`, the budget in `budget/`, the cache's admission and overhead
//! in `cache.rs`, how caches are shared among stores in `owner.rs`. This module
//! adds one rule of its own: a setting that forces the mode (the builder's
//! `direct`, or `ZRING_DIRECT=0|1`) also turns off the record cache and the
//! switching, so forced modes measure exactly the machinery they name.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::error::Result;
use crate::format::record::Entry;
use crate::io::slab::Slab;
use crate::memory::budget::{self, Budget};
use crate::memory::cache::{Cache, Key, NextUse, StoreId};
use crate::memory::owner;
use crate::memory::policy::{self, Observed, Policy, ReadMode};
use crate::memory::window::{Loaded, Window, Windows};
use bytes::Bytes;

/// How a store reads now and what its reads have done since it opened.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReadStats {
    /// "buffered" (page cache) or "direct" (O_DIRECT with the record cache).
    pub policy: &'static str,
    /// Why that policy, with the numbers it was chosen for.
    pub policy_reason: String,
    /// Whether the mode was forced (builder or `ZRING_DIRECT`): no cache, no switching.
    pub forced: bool,
    /// The memory budget in bytes, and where it came from.
    pub budget_bytes: u64,
    /// Where the budget came from, in words.
    pub budget_source: String,
    /// Times the policy was changed by what the reads observed.
    pub switches: u64,
    /// Records gathered.
    pub records: u64,
    /// Records served by the record cache.
    pub cache_hits: u64,
    /// Records looked up in the record cache and read from disk.
    pub cache_misses: u64,
    /// Records copied from the page cache through the chunk mappings.
    pub page_cache_hits: u64,
    /// `(cache_hits + page_cache_hits) / records`: the records that needed no I/O.
    pub hit_rate: f64,
    /// Stored bytes read through the I/O backend (from disk, or from the page
    /// cache by a buffered system call), by gathers and by block reads ahead
    /// of them (`View::prefetch`).
    pub bytes_read: u64,
    /// Of `bytes_read`, those read with O_DIRECT straight into the caller's
    /// slots (records of whole pages bound for page-aligned slots, such as a
    /// `DataLoader`'s rows of 4 KiB multiples): no copy through a buffer.
    pub bytes_into_place: u64,
    /// Stored bytes served by the record cache.
    pub bytes_from_cache: u64,
    /// Stored bytes copied from the page cache through the mappings.
    pub bytes_from_page_cache: u64,
    /// This store's record cache (shared by its handles): the capacity the
    /// process's memory owner gives it now.
    pub cache_capacity: u64,
    /// Stored bytes this store's record cache holds.
    pub cache_held: u64,
    /// Records this store's record cache holds.
    pub cache_entries: u64,
    /// Bytes of mode-3 windows' slabs held against this store's record cache
    /// (charged to its capacity beside its records, `memory::window`), the
    /// slabs kept for the next window's reads included.
    pub window_bytes: u64,
}

#[derive(Default)]
struct Counters {
    records: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    page_cache_hits: AtomicU64,
    bytes_read: AtomicU64,
    bytes_into_place: AtomicU64,
    bytes_from_cache: AtomicU64,
    bytes_from_page_cache: AtomicU64,
    switches: AtomicU64,
    /// Since the policy took effect: stored bytes gathered.
    policy_bytes: AtomicU64,
    /// The window [`policy::reconsider`] judges: records, and of them those
    /// that were in memory.
    window_records: AtomicU64,
    window_resident: AtomicU64,
    /// Records and stored bytes since the budget was last detected
    /// ([`policy::cache_total`]).
    check_records: AtomicU64,
    check_bytes: AtomicU64,
    /// When the budget was last detected ([`millis`]).
    check_at: AtomicU64,
}

/// One gather's counts, for [`Reads::observe`].
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub records: u64,
    pub stored_bytes: u64,
    pub cache_hits: u64,
    pub cache_hit_bytes: u64,
    pub cache_misses: u64,
    pub mapped: u64,
    pub mapped_bytes: u64,
    pub read_bytes: u64,
    /// Whether residency in the page cache was observed (chunk mappings on):
    /// without it a buffered store's hits cannot be counted.
    pub residency: bool,
}

/// A store's read policy and counters (one per open [`crate::Store`]).
pub(crate) struct Reads {
    id: Option<StoreId>,
    /// This handle's membership of the process's memory owner, which sizes
    /// the store's record cache ([`crate::memory::owner`]).
    member: owner::Member,
    /// The owner's generation the policy was last chosen under.
    generation: AtomicU64,
    /// The record caches' total this handle last gave the owner.
    total: AtomicU64,
    /// `Some(direct)` when the mode is forced.
    forced: Option<bool>,
    policy: Mutex<Policy>,
    /// The store's stored bytes when the policy was last chosen: a store that
    /// has since doubled or halved (appends, compaction) is judged afresh.
    chosen_for: AtomicU64,
    /// Whether the record cache is consulted (direct mode, not forced).
    caching: AtomicBool,
    /// Windows of blocks loaded ahead of mode-3 gathers, their slabs
    /// charged to the record cache ([`crate::memory::window`]).
    windows: Windows,
    c: Counters,
}

impl Reads {
    /// The policy for a store at `dir` of `data_bytes` stored bytes, given an
    /// explicit budget and a forced mode (the builder's; `ZRING_DIRECT` when
    /// the builder says nothing).
    pub fn open(dir: &Path, explicit: Option<u64>, forced: Option<bool>, data_bytes: u64) -> Result<Reads> {
        let forced = forced.or_else(crate::env::direct);
        // A store whose directory cannot be identified is read uncached.
        let id = StoreId::of(dir).ok();
        let member = owner::join(id, explicit, forced.is_some(), data_bytes);
        let generation = owner::GENERATION.load(Relaxed);
        // Measured at most once per `CHECK_MILLIS` for the process: a
        // dataset of a thousand parts opens a thousand stores at once, and
        // reading the cgroup's files for each was a third of its open.
        let budget = budget::detect_recent(owner::stated(), owner::held())?;
        let policy = match forced {
            None => policy::choose(&budget, owner::demand()),
            Some(direct) => Policy {
                mode: if direct { ReadMode::Direct } else { ReadMode::Buffered },
                capacity: 0,
                reason: format!(
                    "forced {} reads (builder or ZRING_DIRECT): no record cache, no switching",
                    if direct { "O_DIRECT" } else { "buffered" }
                ),
                budget,
                data_bytes,
                grows: false,
            },
        };
        let reads = Reads {
            id,
            member,
            generation: AtomicU64::new(generation),
            total: AtomicU64::new(0),
            forced,
            policy: Mutex::new(policy),
            chosen_for: AtomicU64::new(data_bytes),
            caching: AtomicBool::new(false),
            windows: Windows::default(),
            c: Counters::default(),
        };
        {
            let mut p = reads.policy.lock().unwrap_or_else(|p| p.into_inner());
            let total = p.budget.for_caches();
            reads.total.store(total, Relaxed);
            reads.share(&mut p, data_bytes, total);
        }
        Ok(reads)
    }

    /// Tells the owner this store's size and mode under `policy`, has it
    /// share the record caches again, and puts this store's share in the
    /// policy (its `capacity`). Lookups are made while the share is not 0.
    fn share(&self, policy: &mut Policy, data_bytes: u64, total: u64) {
        // The pool of freed slabs and the reads in flight take their part of
        // the budget, which the record caches leave them.
        crate::io::slab::set_limits(policy.budget.io());
        let direct = self.report(policy, data_bytes);
        owner::rebalance(total);
        if direct {
            policy.capacity = self.member.capacity();
        }
        let caching = direct && self.id.is_some() && policy.capacity > 0;
        self.caching.store(caching, Relaxed);
        if !caching {
            self.windows.clear();
        }
    }

    /// Tells the owner this store's size and whether `policy` wants a record
    /// cache (direct, unforced; capped when it was sized from a thrashing
    /// page cache); returns that.
    fn report(&self, policy: &Policy, data_bytes: u64) -> bool {
        let direct = policy.mode == ReadMode::Direct && self.forced.is_none();
        self.member.update(data_bytes, direct, (!policy.grows && direct).then_some(policy.capacity));
        direct
    }

    /// Whether the policy in force reads with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.policy.lock().unwrap_or_else(|p| p.into_inner()).mode == ReadMode::Direct
    }

    fn cache(&self) -> Option<&Cache> {
        self.member.cache.as_deref()
    }

    fn key(&self, e: &Entry) -> Option<Key> {
        self.caching.load(Relaxed).then_some(self.id).flatten().map(|id| Key::new(id, e))
    }

    /// The record's stored bytes if the record cache holds them; a hit with a
    /// known next use re-ranks the entry (a step already served must not keep
    /// it cached as "needed soon").
    pub fn lookup(&self, e: &Entry, next: NextUse) -> Option<bytes::Bytes> {
        let key = self.key(e)?;
        let cache = self.cache()?;
        let got = cache.get(&key)?;
        if next != NextUse::Unknown {
            cache.touch(&key, next);
        }
        Some(got)
    }

    /// The windows loaded now, for one gather to search before the cache.
    pub fn windows(&self) -> Loaded {
        self.windows.loaded()
    }

    /// Charges `slab` to the record cache for a window being loaded
    /// ([`crate::memory::window::hold`]), releasing this store's oldest
    /// windows when there is no room otherwise; `None` when there still is
    /// none (the slab is then dropped and its records read by the gathers).
    pub fn hold(&self, slab: Slab) -> Option<Bytes> {
        let cache = self.member.cache.as_ref().filter(|_| self.caching())?;
        let bytes = slab.as_ref().len() as u64;
        while !cache.hold(bytes) {
            if !self.windows.release_oldest() {
                return None;
            }
        }
        // Charged above: wrap without charging again.
        Some(crate::memory::window::held(cache, slab))
    }

    /// A released window's slab for a read of `len` bytes, already charged
    /// ([`Cache::take_spare`]; frozen with [`Reads::held`] once read).
    pub fn spare(&self, len: usize) -> Option<Slab> {
        let cache = self.member.cache.as_ref().filter(|_| self.caching())?;
        cache.take_spare(crate::io::slab::aligned_capacity(len))
    }

    /// A slab from [`Reads::spare`], read, frozen: its charge is released
    /// with its last reference.
    pub fn held(&self, slab: Slab) -> Bytes {
        let cache = self.member.cache.as_ref().expect("a spare slab came from this store's cache");
        crate::memory::window::held(cache, slab)
    }

    /// Releases the charge of a slab from [`Reads::spare`] that was dropped
    /// unread (its read failed).
    pub fn unhold(&self, bytes: u64) {
        if let Some(cache) = self.member.cache.as_ref() {
            cache.unhold(bytes);
        }
    }

    /// Makes a loaded window visible to the gathers.
    pub fn publish(&self, w: Window) {
        self.windows.publish(w);
    }

    /// Releases the windows beyond the newest
    /// [`crate::memory::window::KEEP`], as a load begins.
    pub fn trim_windows(&self) {
        self.windows.trim();
    }

    /// Offers a verified record's stored bytes, just read, to the cache.
    pub fn offer(&self, e: &Entry, stored: &[u8], next: NextUse) {
        if let (Some(key), Some(cache)) = (self.key(e), self.cache()) {
            cache.insert(key, stored, next);
        }
    }

    /// Counts stored bytes a gather read from disk straight into their slot.
    pub fn count_into_place(&self, bytes: u64) {
        self.c.bytes_into_place.fetch_add(bytes, Relaxed);
    }

    /// Counts stored bytes read ahead into the record cache
    /// ([`crate::read::blocks`]): read from disk, gathered later as hits.
    pub fn count_prefetched(&self, bytes: u64) {
        self.c.bytes_read.fetch_add(bytes, Relaxed);
    }

    /// Whether the read mode was forced (builder or `ZRING_DIRECT`).
    pub fn forced(&self) -> bool {
        self.forced.is_some()
    }

    /// Whether lookups are worth making (direct mode with a cache; never for
    /// a store whose directory could not be identified, [`Reads::share`]).
    pub fn caching(&self) -> bool {
        self.caching.load(Relaxed)
    }

    /// Counts a gather; returns a new policy when the counters show the one in
    /// force chose wrong, or the data the budget must serve changed (the
    /// caller reopens the chunks and calls [`Reads::adopt`]).
    pub fn observe(&self, s: Seen, data_bytes: u64) -> Option<Policy> {
        let c = &self.c;
        // A counter's locked add only when it moves: a hot gather over many
        // stores (a dataset of parts) counts into each, mostly mapped reads.
        let add = |counter: &AtomicU64, n: u64| {
            if n != 0 {
                counter.fetch_add(n, Relaxed);
            }
        };
        add(&c.records, s.records);
        add(&c.cache_hits, s.cache_hits);
        add(&c.cache_misses, s.cache_misses);
        add(&c.page_cache_hits, s.mapped);
        add(&c.bytes_read, s.read_bytes);
        add(&c.bytes_from_cache, s.cache_hit_bytes);
        add(&c.bytes_from_page_cache, s.mapped_bytes);
        add(&c.policy_bytes, s.stored_bytes);
        self.member.asked(s.records);
        let records = c.window_records.fetch_add(s.records, Relaxed) + s.records;
        add(&c.window_resident, s.cache_hits + s.mapped);
        if self.forced.is_some() {
            return None;
        }
        // The owner's view changed (a store opened or closed, or one changed
        // size or mode), or this store doubled or halved: choose again
        // against the data every open store must be served from.
        let generation = owner::GENERATION.load(Relaxed);
        let chosen = self.chosen_for.load(Relaxed);
        let resized = data_bytes > chosen.saturating_mul(2) || data_bytes < chosen / 2;
        if resized || generation != self.generation.load(Relaxed) {
            let mut policy = self.policy.try_lock().ok()?;
            self.generation.store(generation, Relaxed);
            if resized {
                self.chosen_for.store(data_bytes, Relaxed);
                self.report(&policy, data_bytes);
            }
            let budget = self.budget_now(&policy);
            let demand = owner::demand();
            let fresh = policy::choose(&budget, demand);
            let switch = match (policy.mode, fresh.mode) {
                (ReadMode::Buffered, ReadMode::Direct) => true,
                // Back to buffered only well inside the budget (a band
                // against flip-flopping), and not from a mode the reads chose.
                (ReadMode::Direct, ReadMode::Buffered) => {
                    policy.grows && (budget.source.is_stated() || demand <= policy::RETURN_FIT.of(budget.bytes))
                }
                _ => false,
            };
            if switch {
                return Some(fresh);
            }
            if policy.mode == ReadMode::Direct {
                self.resize(&mut policy, budget, data_bytes);
            } else {
                // Still buffered: the budget in force now is the one reported.
                policy.budget = budget;
            }
        }
        // By bytes too while a record cache fills (it must not outgrow the
        // budget between looks); by records alone while the page cache
        // serves, at hot-read rates.
        let by_records = c.check_records.fetch_add(s.records, Relaxed) + s.records >= policy::CHECK_RECORDS;
        let by_bytes = c.check_bytes.fetch_add(s.stored_bytes, Relaxed) + s.stored_bytes >= policy::CHECK_BYTES;
        // The clock is read only when it decides: a hot gather over many
        // stores (a dataset of parts) counts into each of them.
        let caching = !by_records && self.caching.load(Relaxed);
        if !by_records && !caching {
            return None;
        }
        let now = millis();
        let by_time = now.saturating_sub(c.check_at.load(Relaxed)) >= policy::CHECK_MILLIS;
        if !(by_records || by_bytes || by_time) {
            return None;
        }
        // One gather judges; the others carry on counting.
        let mut policy = self.policy.try_lock().ok()?;
        c.check_records.store(0, Relaxed);
        c.check_bytes.store(0, Relaxed);
        c.check_at.store(now, Relaxed);
        // Only a record cache is sized from the budget now; buffered reads
        // need it only for a judgement below.
        let mut budget = None;
        if policy.mode == ReadMode::Direct {
            let now = self.budget_now(&policy);
            self.resize(&mut policy, now.clone(), data_bytes);
            budget = Some(now);
        }
        if records < policy::MIN_WINDOW_RECORDS {
            return None;
        }
        if policy.mode == ReadMode::Buffered && !s.residency {
            // Nothing tells what the page cache holds (no mappings): no
            // judgement, so no switch made blind.
            return None;
        }
        let records = c.window_records.swap(0, Relaxed);
        let resident = c.window_resident.swap(0, Relaxed);
        let read_bytes = c.policy_bytes.load(Relaxed);
        if read_bytes < data_bytes {
            // Not a full pass yet: keep the window growing.
            c.window_records.fetch_add(records, Relaxed);
            c.window_resident.fetch_add(resident, Relaxed);
            return None;
        }
        let budget = budget.unwrap_or_else(|| self.budget_now(&policy));
        // The page cache holds every open store's data: judged against all of it.
        let demand = owner::demand().max(data_bytes);
        policy::reconsider(&policy, &Observed { records, resident, read_bytes, data_bytes: demand, budget })
    }

    /// Sizes the record caches again for `budget` (the owner shares them
    /// out) and puts this store's share in the direct-mode `policy`.
    fn resize(&self, policy: &mut Policy, budget: Budget, data_bytes: u64) {
        let last = self.total.load(Relaxed);
        let total = policy::cache_total(last, policy.grows, &budget).unwrap_or(last);
        self.total.store(total, Relaxed);
        let before = policy.capacity;
        let mut fresh = Policy { budget, ..policy.clone() };
        self.share(&mut fresh, data_bytes, total);
        if fresh.capacity != before {
            let change = if fresh.capacity < before { "shrinks" } else { "grows" };
            fresh.reason = format!(
                "the budget is now {}: this store's record cache {change} from {} to {} (its share of {} for every \
                 store read with O_DIRECT){}, which serves about {} % of a random epoch from memory (O_DIRECT reads)",
                fresh.budget.describe(),
                budget::human(before),
                budget::human(fresh.capacity),
                budget::human(total),
                policy::kept(&fresh.budget),
                policy::hit_percent(fresh.capacity, data_bytes)
            );
            *policy = fresh;
        }
    }

    /// The budget detected now; the policy's own if detection fails.
    fn budget_now(&self, policy: &Policy) -> Budget {
        budget::detect_recent(owner::stated(), owner::held()).unwrap_or_else(|_| policy.budget.clone())
    }

    /// Puts `policy` in force (after the chunks were reopened to match it).
    /// A switch to buffered reads gives the store's cached records back.
    pub fn adopt(&self, mut policy: Policy, data_bytes: u64) {
        let total = policy.budget.for_caches();
        self.total.store(total, Relaxed);
        self.share(&mut policy, data_bytes, total);
        self.c.policy_bytes.store(0, Relaxed);
        self.c.switches.fetch_add(1, Relaxed);
        self.generation.store(owner::GENERATION.load(Relaxed), Relaxed);
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    /// Drops this store's records from the cache (its chunks were replaced).
    pub fn forget(&self) {
        self.windows.clear();
        if let (Some(id), Some(cache)) = (self.id, self.cache()) {
            cache.clear_store(id);
        }
    }

    /// The counters and the policy now.
    pub fn stats(&self) -> ReadStats {
        let p = self.policy.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let c = &self.c;
        let cs = self.cache().map(Cache::stats).unwrap_or_default();
        let records = c.records.load(Relaxed);
        let hits = c.cache_hits.load(Relaxed);
        let mapped = c.page_cache_hits.load(Relaxed);
        ReadStats {
            policy: match p.mode {
                ReadMode::Buffered => "buffered",
                ReadMode::Direct => "direct",
            },
            policy_reason: p.reason,
            forced: self.forced.is_some(),
            budget_bytes: p.budget.bytes,
            budget_source: p.budget.source.describe(),
            switches: c.switches.load(Relaxed),
            records,
            cache_hits: hits,
            cache_misses: c.cache_misses.load(Relaxed),
            page_cache_hits: mapped,
            hit_rate: if records == 0 { 0.0 } else { (hits + mapped) as f64 / records as f64 },
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_into_place: c.bytes_into_place.load(Relaxed),
            bytes_from_cache: c.bytes_from_cache.load(Relaxed),
            bytes_from_page_cache: c.bytes_from_page_cache.load(Relaxed),
            cache_capacity: cs.capacity,
            cache_held: cs.bytes,
            cache_entries: cs.entries,
            window_bytes: cs.held,
        }
    }
}

/// Milliseconds since the first call in this process (a monotonic clock).
fn millis() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}
