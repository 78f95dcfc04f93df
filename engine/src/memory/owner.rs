//! The one owner of the memory store data may take in this process.
//!
//! Every open store handle joins ([`join`]) with what it knows: its store's
//! identity and stored bytes, a budget stated for it (the builder's
//! `cache_bytes`), and whether its mode is forced. From the members the owner
//! answers the three questions the read policy ([`crate::memory::budget`]) asks, and
//! nothing else answers them:
//!
//! * **Which budget?** ([`stated`]) The process has one budget, stated once:
//!   by [`set_cache_bytes`] (the explicit process-level call, which holds
//!   until it is called again), else by the first store handle opened with
//!   `cache_bytes` that is still open (the builder's value is a statement for
//!   the process's store data, not for that handle; later handles' values do
//!   not count while it is open). Without one, `ZRING_CACHE_BYTES`, else the
//!   measured budget (which counts the memory of every process in the
//!   cgroup, [`crate::memory::budget`]).
//! * **How much data must that budget serve?** ([`demand`]) The stored bytes
//!   of every distinct store open with an unforced mode, summed: the page
//!   cache and the record cache hold the data of all of them from one budget,
//!   so two stores of 0.7× the budget each do not fit, though each alone would.
//! * **How big is each store's record cache?** ([`rebalance`]) Each store has
//!   a record cache of its own (its handles share it), and the owner alone sets
//!   the capacities. The budget's cache bytes go to the stores read with
//!   O_DIRECT in proportion to the records asked of each recently, each up to
//!   all of its data, what a store cannot use going to the others
//!   ([`share_out`]). Every record asked is a miss a cached record may save,
//!   so a store asked twice as often gets twice the bytes; a label column (a
//!   few bytes a record, asked with every image) is thus cached whole, and two
//!   alike sources of a mixture get alike shares. Request counts decay by
//!   half at every rebalance, so the shares follow what the program reads now;
//!   a share that moved by less than an eighth keeps its capacity, since each
//!   move evicts records. (Ordering the stores strictly by requests per byte
//!   would have two alike stores hand the whole cache back and forth as their
//!   counts wobble, emptying one cache to fill the other.) A store read
//!   buffered (or forced) gets no record cache: its records are freed when
//!   it switches.
//!
//! The owner is also the process's entry in the host's rank registry
//! ([`crate::memory::ranks`]), which the budget uses to split a cgroup among ranks.
//!
//! Members leave when their handle drops; the last handle of a store takes its
//! record cache with it. After `fork()` a child starts with an empty owner
//! (tagged with the pid), and the owner's lock is one of those
//! [`crate::fork`] holds across `fork()`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::io::process::{PerProcess, Write};
use crate::memory::budget::Ratio;
use crate::memory::cache::{Cache, StoreId};

/// A handle's membership; leaving the owner when dropped.
pub(crate) struct Member {
    id: u64,
    /// The store's record cache (shared by the store's handles), or `None`
    /// for a store whose directory could not be identified (read uncached).
    pub cache: Option<Arc<Cache>>,
    /// Records asked of the store by all its handles (what the owner shares
    /// the cache bytes by).
    asked: Option<Arc<AtomicU64>>,
    /// Set for members of an owner other than the process's (tests).
    local: bool,
}

impl Member {
    /// Counts `records` asked of the store.
    pub fn asked(&self, records: u64) {
        if let Some(a) = &self.asked {
            a.fetch_add(records, Relaxed);
        }
    }

    /// Tells the owner the store's size and mode now; `cap` bounds its record
    /// cache (a cache sized from a thrashing page cache never grows).
    pub fn update(&self, data: u64, direct: bool, cap: Option<u64>) {
        if !self.local {
            lock().update(self.id, data, direct, cap);
        }
    }

    /// The capacity the owner gave the store's record cache.
    pub fn capacity(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.capacity())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if !self.local {
            lock().leave(self.id);
        }
    }
}

#[derive(Debug)]
struct Joined {
    store: Option<StoreId>,
    stated: Option<u64>,
    forced: bool,
    data: u64,
    direct: bool,
    cap: Option<u64>,
}

struct PerStore {
    cache: Arc<Cache>,
    asked: Arc<AtomicU64>,
    /// Records asked, decayed by half per rebalance.
    recent: f64,
}

pub(crate) struct Owner {
    pid: u32,
    next: u64,
    members: HashMap<u64, Joined>,
    stores: HashMap<StoreId, PerStore>,
}

/// The process's owner; a parent's in a forked child is leaked, not
/// dropped: its caches may be locked by threads that do not exist there.
static OWNER: PerProcess<Owner> = PerProcess::new(1, false);

/// Bumped whenever a member joins, leaves, or changes size or mode: a store
/// whose policy was chosen under another generation chooses again.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(0);

fn lock() -> Write<Owner> {
    OWNER.write(Owner::new)
}

/// Joins a handle on `store` (module docs).
pub(crate) fn join(store: Option<StoreId>, stated: Option<u64>, forced: bool, data: u64) -> Member {
    lock().join(store, stated, forced, data)
}

/// The budget stated by [`set_cache_bytes`]; `0` none, else the bytes plus
/// one. A plain atomic, so a forked child keeps the parent's statement.
static PROCESS_BUDGET: AtomicU64 = AtomicU64::new(0);

/// States the memory budget of this process's store data (page cache and
/// record caches together), in bytes, for every store handle open now and
/// later; `None` withdraws the statement. Returns the statement it replaces.
///
/// The process has one budget. This call states it and holds until it is
/// called again; without it, the first store handle opened with
/// [`StoreBuilder::cache_bytes`](crate::StoreBuilder::cache_bytes) that is
/// still open states it, and the values of handles opened after that one do
/// not count. With neither, `ZRING_CACHE_BYTES`, else the budget measured
/// from the cgroup or `MemAvailable`.
pub fn set_cache_bytes(bytes: Option<u64>) -> Option<u64> {
    let new = bytes.map_or(0, |b| b.saturating_add(1));
    let old = PROCESS_BUDGET.swap(new, Relaxed);
    GENERATION.fetch_add(1, Relaxed);
    old.checked_sub(1)
}

/// The process's budget as stated (module docs).
pub(crate) fn stated() -> Option<u64> {
    lock().stated()
}

/// Stored bytes of every distinct store open with an unforced mode (module
/// docs); a store open through several handles counts once, at its largest.
pub(crate) fn demand() -> u64 {
    lock().demand()
}

/// Bytes the record caches of the process charge now.
pub(crate) fn held() -> u64 {
    lock().stores.values().map(|s| s.cache.stats().charged).sum()
}

/// Shares `total` bytes among the stores read with O_DIRECT, in proportion to
/// the records asked of each, and sets every store's record-cache capacity
/// (module docs). The only caller of [`Cache::set_capacity`].
pub(crate) fn rebalance(total: u64) {
    lock().rebalance(total)
}

impl Owner {
    fn new(pid: u32) -> Owner {
        Owner { pid, next: 0, members: HashMap::new(), stores: HashMap::new() }
    }

    fn join(&mut self, store: Option<StoreId>, stated: Option<u64>, forced: bool, data: u64) -> Member {
        let id = self.next;
        self.next += 1;
        self.members.insert(id, Joined { store, stated, forced, data, direct: false, cap: None });
        let shared = store.map(|s| {
            let e = self.stores.entry(s).or_insert_with(|| PerStore {
                cache: Arc::new(Cache::new(0)),
                asked: Arc::default(),
                recent: 0.0,
            });
            (e.cache.clone(), e.asked.clone())
        });
        GENERATION.fetch_add(1, Relaxed);
        let (cache, asked) = shared.unzip();
        Member { id, cache, asked, local: self.pid == 0 }
    }

    /// The statement of [`set_cache_bytes`], else that of the first open
    /// handle that made one (ids grow with joining).
    fn stated(&self) -> Option<u64> {
        PROCESS_BUDGET.load(Relaxed).checked_sub(1).or_else(|| {
            self.members.iter().filter_map(|(id, m)| Some((*id, m.stated?))).min_by_key(|(id, _)| *id).map(|(_, b)| b)
        })
    }

    fn demand(&self) -> u64 {
        let mut per: HashMap<StoreId, u64> = HashMap::new();
        let mut unknown = 0u64;
        for m in self.members.values().filter(|m| !m.forced) {
            match m.store {
                Some(s) => {
                    let e = per.entry(s).or_default();
                    *e = (*e).max(m.data);
                }
                None => unknown = unknown.saturating_add(m.data),
            }
        }
        per.values().fold(unknown, |a, &b| a.saturating_add(b))
    }

    fn update(&mut self, id: u64, data: u64, direct: bool, cap: Option<u64>) {
        let Some(m) = self.members.get_mut(&id) else { return };
        if (m.data, m.direct, m.cap) != (data, direct, cap) {
            (m.data, m.direct, m.cap) = (data, direct, cap);
            GENERATION.fetch_add(1, Relaxed);
        }
    }

    fn leave(&mut self, id: u64) {
        if let Some(m) = self.members.remove(&id) {
            if let Some(s) = m.store {
                if !self.members.values().any(|o| o.store == Some(s)) {
                    // Nothing reads these records any more (module docs).
                    self.stores.remove(&s);
                }
            }
        }
        GENERATION.fetch_add(1, Relaxed);
    }

    fn rebalance(&mut self, total: u64) {
        // Each store's size (its largest), whether an unforced handle reads
        // it direct, and the smallest cap.
        let mut want: HashMap<StoreId, (u64, bool, Option<u64>)> = HashMap::new();
        for m in self.members.values() {
            let Some(s) = m.store else { continue };
            let e = want.entry(s).or_insert((0, false, None));
            e.0 = e.0.max(m.data);
            e.1 |= m.direct && !m.forced;
            if let Some(c) = m.cap {
                e.2 = Some(e.2.map_or(c, |x: u64| x.min(c)));
            }
        }
        // (store, records asked recently, most it can use, capacity now)
        let mut direct: Vec<(StoreId, f64, u64, u64)> = Vec::new();
        for (s, per) in self.stores.iter_mut() {
            let asked = per.asked.swap(0, Relaxed) as f64;
            per.recent = per.recent / 2.0 + asked;
            let Some(&(data, is_direct, cap)) = want.get(s) else { continue };
            if !is_direct {
                continue;
            }
            // What the whole store would charge: its bytes and about an
            // entry's overhead per KiB (records of a few KiB and up).
            let whole = data.saturating_add(data / 1024);
            let limit = cap.map_or(whole, |c| c.min(whole));
            direct.push((*s, per.recent.max(1.0), limit, per.cache.capacity()));
        }
        let mut shares = share_out(total, &direct.iter().map(|d| (d.1, d.2)).collect::<Vec<_>>());
        // A share that moved by less than the band keeps its capacity (each
        // change evicts or admits records), as long as the kept ones fit.
        let banded: Vec<u64> = direct
            .iter()
            .zip(&shares)
            .map(|(d, &t)| if d.3.abs_diff(t) <= SHARE_BAND.of(t) { d.3 } else { t })
            .collect();
        if banded.iter().sum::<u64>() <= total {
            shares = banded;
        }
        let targets: HashMap<StoreId, u64> = direct.iter().zip(shares).map(|(d, t)| (d.0, t)).collect();
        for (s, per) in self.stores.iter() {
            let target = targets.get(s).copied().unwrap_or(0);
            if per.cache.capacity() != target {
                per.cache.set_capacity(target);
            }
        }
    }
}

/// A store's capacity moves only when its share moved by more than this part
/// of it: the requests counted between two looks are a sample, and every move
/// evicts records or admits new ones.
const SHARE_BAND: Ratio = Ratio(1, 8);

/// `total` shared in proportion to the weights, none above its limit; what a
/// limited one leaves goes to the others in the same proportions.
fn share_out(total: u64, stores: &[(f64, u64)]) -> Vec<u64> {
    let mut out = vec![0u64; stores.len()];
    let mut open: Vec<usize> = (0..stores.len()).collect();
    let mut left = total;
    while !open.is_empty() && left > 0 {
        let weight: f64 = open.iter().map(|&i| stores[i].0).sum();
        let full: Vec<usize> =
            open.iter().copied().filter(|&i| (left as f64 * stores[i].0 / weight) as u64 >= stores[i].1).collect();
        if full.is_empty() {
            for &i in &open {
                out[i] = (left as f64 * stores[i].0 / weight) as u64;
            }
            break;
        }
        for &i in &full {
            out[i] = stores[i].1;
            left -= stores[i].1;
        }
        open.retain(|i| !full.contains(i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(dir: &tempfile::TempDir) -> Option<StoreId> {
        StoreId::of(dir.path()).ok()
    }

    /// An owner of its own (pid 0), apart from the process's.
    fn owner() -> Owner {
        Owner::new(0)
    }

    #[test]
    fn the_first_stated_budget_holds_and_demand_counts_each_store_once() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut o = owner();
        let m1 = o.join(id(&a), None, false, 700);
        let m2 = o.join(id(&a), Some(5_000), false, 900);
        let m3 = o.join(id(&b), Some(3_000), false, 700);
        o.join(None, Some(9_000), true, 1 << 40);
        assert_eq!(o.demand(), 1_600);
        assert_eq!(o.stated(), Some(5_000), "the first statement, not the smallest");
        o.leave(m3.id);
        assert_eq!((o.demand(), o.stated()), (900, Some(5_000)));
        o.leave(m2.id);
        assert_eq!((o.demand(), o.stated()), (700, Some(9_000)), "the next handle's, once the first left");
        o.leave(m1.id);
        assert!(o.stores.is_empty(), "the last handle of a store takes its cache");
    }

    #[test]
    fn cache_bytes_follow_the_records_asked_and_none_go_to_buffered_stores() {
        let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut o = owner();
        let small = o.join(id(&a), None, false, 1 << 20);
        let big = o.join(id(&b), None, false, 1 << 30);
        let buffered = o.join(id(&c), None, false, 1 << 20);
        o.update(small.id, 1 << 20, true, None);
        o.update(big.id, 1 << 30, true, None);
        for m in [&small, &big, &buffered] {
            m.asked(1000);
        }
        // Asked alike: half each, but the small store can use only its whole.
        o.rebalance(100 << 20);
        let whole_small = (1 << 20) + (1 << 10);
        assert_eq!(small.capacity(), whole_small);
        assert_eq!(big.capacity(), (100 << 20) - whole_small);
        assert_eq!(buffered.capacity(), 0);
        // Asked more often (counts decay by half per rebalance: 3500 against
        // 1500 recent requests): 70 % of the bytes.
        o.update(small.id, 64 << 20, true, None);
        small.asked(3000);
        big.asked(1000);
        o.rebalance(64 << 20);
        let (s, g) = (small.capacity(), big.capacity());
        assert!(
            s.abs_diff(Ratio(7, 10).of(64 << 20)) < 1024 && g.abs_diff(Ratio(3, 10).of(64 << 20)) < 1024,
            "{s} {g}"
        );
        // A small wobble of the counts (4250 against 1750) moves nothing.
        small.asked(2500);
        big.asked(1000);
        o.rebalance(64 << 20);
        assert_eq!((small.capacity(), big.capacity()), (s, g));
        // A cap bounds a store; the rest goes to the other.
        o.update(big.id, 1 << 30, true, Some(4 << 20));
        o.rebalance(64 << 20);
        assert_eq!((big.capacity(), small.capacity()), (4 << 20, 60 << 20));
        // A store switched to buffered gives its records back.
        o.update(big.id, 1 << 30, false, None);
        o.rebalance(64 << 20);
        assert_eq!(big.capacity(), 0);
    }

    #[test]
    fn shares_are_proportional_capped_and_redistributed() {
        assert_eq!(share_out(100, &[(1.0, 1000), (1.0, 1000)]), vec![50, 50]);
        assert_eq!(share_out(100, &[(3.0, 1000), (1.0, 1000)]), vec![75, 25]);
        assert_eq!(share_out(100, &[(1.0, 10), (1.0, 1000), (2.0, 1000)]), vec![10, 30, 60]);
        assert_eq!(share_out(100, &[(1.0, 10), (1.0, 20)]), vec![10, 20]);
        assert_eq!(share_out(0, &[(1.0, 10)]), vec![0]);
    }
}
