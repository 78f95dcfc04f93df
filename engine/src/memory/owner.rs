//! The one owner of the memory store data may take in this process.
//!
//! Every open store handle joins ([`join`]) with what it knows: its store's
//! identity and stored bytes, a budget stated for it (the builder's
//! `cache_bytes`), and whether its mode is forced. From the members the owner
//! answers the three questions the read policy ([`crate::memory::budget`]) asks, and
//! nothing else answers them:
//!
//! * **Which budget?** ([`stated`]) The process has one budget: the latest
//!   statement still live ([`statements`]). A statement is made by
//!   [`set_cache_bytes`] (the process-level call; it lives until the call is
//!   made again), by each store handle opened with `cache_bytes` (it lives
//!   until the handle closes) and by each [`state_cache_bytes`] (a DataLoader's
//!   `cache_bytes`; it lives until its [`Statement`] is released). Statements
//!   are released in any order, and the budget is then the latest of those
//!   still live: two loaders of different budgets closed in the order they
//!   were opened leave none of theirs stated. Without a live statement,
//!   `ZRING_CACHE_BYTES`, else the measured budget (which counts the memory
//!   of every process in the cgroup, [`crate::memory::budget`]).
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
//!   alike sources of a mixture get alike shares. Request counts halve with
//!   every [`HALF_LIFE_RECORDS`] records asked of all the stores together,
//!   so the shares follow what the program reads now, and each store starts
//!   with a count of [`PRIOR_RECORDS`]; a share that moved by less than an
//!   eighth keeps its capacity, since each move evicts records. The
//!   shares must hold still while a loader reads ahead: a window of blocks
//!   is loaded into a store's cache before its steps are gathered, and a
//!   share cut meanwhile evicts the records loaded for them. Counts halved
//!   at every rebalance (every store looks at the budget several times a
//!   second) followed the last few steps in flight, and a 0.5/0.3/0.2
//!   mixture's shares swung between a half and twice their mean; a store
//!   starting from nothing lost its share to the first source gathered,
//!   with its first window loaded (bench-results/mix-mode3.md). (Ordering
//!   the stores strictly by requests per byte would have two alike stores
//!   hand the whole cache back and forth as their counts wobble, emptying
//!   one cache to fill the other.) A store read buffered (or forced) gets
//!   no record cache: its records are freed when it switches.
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
    /// The handle's `cache_bytes` statement, released when it closes.
    _stated: Option<Statement>,
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
    forced: bool,
    data: u64,
    direct: bool,
    cap: Option<u64>,
}

struct PerStore {
    cache: Arc<Cache>,
    asked: Arc<AtomicU64>,
    /// Records asked, decayed by half per [`HALF_LIFE_RECORDS`] asked of
    /// every store.
    recent: f64,
    /// The [`Owner::clock`] `recent` was last brought up to.
    at: f64,
    /// The members on this store.
    members: Vec<u64>,
}

/// The owner's members and what it keeps of them so that a join, a leave
/// and [`demand`] cost O(the store's handles), not O(every handle): a
/// dataset of a thousand parts opens a thousand stores, each asking.
pub(crate) struct Owner {
    pid: u32,
    next: u64,
    members: HashMap<u64, Joined>,
    stores: HashMap<StoreId, PerStore>,
    /// [`Owner::demand`], kept up to date at each join, leave and update.
    demand: u64,
    /// Members read with O_DIRECT and unforced.
    direct: usize,
    /// Half-lives of the request counts so far: records asked of every
    /// store, counted at each rebalance, over [`HALF_LIFE_RECORDS`]. While
    /// no member reads direct a rebalance does nothing (every capacity is 0
    /// then), and the records asked meanwhile are counted at the next.
    clock: f64,
    /// Whether every record cache's capacity is 0 (none set since a
    /// rebalance with no member read direct).
    all_zero: bool,
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
    // Stated before joining: a handle's first policy already sees it.
    let statement = stated.map(state_cache_bytes);
    let mut m = lock().join(store, forced, data);
    m._stated = statement;
    m
}

/// States the memory budget of this process's store data (page cache and
/// record caches together), in bytes, for every store handle open now and
/// later; `None` withdraws the statement. Returns the statement it replaces.
///
/// The process has one budget: the latest statement still live. This call
/// makes the process-level statement, which lives until the call is made
/// again; store handles opened with
/// [`StoreBuilder::cache_bytes`](crate::StoreBuilder::cache_bytes) and
/// [`state_cache_bytes`] make statements that live until they close, in
/// any order. With none live, `ZRING_CACHE_BYTES`, else the budget measured
/// from the cgroup or `MemAvailable`.
pub fn set_cache_bytes(bytes: Option<u64>) -> Option<u64> {
    let old = statements::TABLE.set_process(bytes);
    GENERATION.fetch_add(1, Relaxed);
    old
}

/// States the memory budget of this process's store data until the returned
/// [`Statement`] is released or dropped (a data loader's `cache_bytes`):
/// while it is the latest statement still live it is the process's budget
/// ([`set_cache_bytes`]).
pub fn state_cache_bytes(bytes: u64) -> Statement {
    let slot = statements::TABLE.push(bytes);
    GENERATION.fetch_add(1, Relaxed);
    Statement { slot }
}

/// The process's budget as stated (module docs).
pub(crate) fn stated() -> Option<u64> {
    statements::TABLE.latest()
}

/// One live budget statement ([`state_cache_bytes`]); released when dropped.
#[derive(Debug)]
pub struct Statement {
    slot: Option<usize>,
}

impl Statement {
    /// Withdraws the statement (as dropping it does): the budget returns to
    /// the latest statement still live.
    pub fn release(&mut self) {
        if let Some(slot) = self.slot.take() {
            statements::TABLE.release(slot);
            GENERATION.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Statement {
    fn drop(&mut self) {
        self.release();
    }
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

/// The live budget statements of the process: slots of two atomics each, so
/// reading the latest takes no lock (a forked child keeps the parent's
/// statements and can never find a lock held), and every statement is
/// released on its own, in any order.
mod statements {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    /// Live statements at once, at most; slot 0 is [`super::set_cache_bytes`]'s.
    pub(super) const SLOTS: usize = 256;
    /// A slot being written.
    const BUSY: u64 = u64::MAX;

    pub(super) struct Table {
        /// Per slot: 0 free, [`BUSY`], else the statement's order (larger is later).
        order: [AtomicU64; SLOTS],
        bytes: [AtomicU64; SLOTS],
        next: AtomicU64,
    }

    /// The process's statements.
    pub(super) static TABLE: Table = Table::new();

    impl Table {
        pub(super) const fn new() -> Table {
            Table {
                order: [const { AtomicU64::new(0) }; SLOTS],
                bytes: [const { AtomicU64::new(0) }; SLOTS],
                next: AtomicU64::new(1),
            }
        }

        /// Makes a statement in a free slot; `None` when all are taken (then
        /// it counts for nothing, and says so once).
        pub(super) fn push(&self, bytes: u64) -> Option<usize> {
            for slot in 1..SLOTS {
                if self.order[slot].compare_exchange(0, BUSY, SeqCst, SeqCst).is_ok() {
                    self.bytes[slot].store(bytes, SeqCst);
                    self.order[slot].store(self.next.fetch_add(1, SeqCst), SeqCst);
                    return Some(slot);
                }
            }
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "zring: more than {} memory budgets stated at once (handles and loaders opened with \
                     cache_bytes); later ones do not count until earlier ones close",
                    SLOTS - 1
                )
            });
            None
        }

        pub(super) fn release(&self, slot: usize) {
            self.order[slot].store(0, SeqCst);
        }

        /// Replaces the process-level statement (slot 0); returns the one replaced.
        pub(super) fn set_process(&self, bytes: Option<u64>) -> Option<u64> {
            // The slot is claimed by swapping its order for BUSY; a claim
            // that never ends (a forked child of a thread caught in the
            // middle) is taken over after a while.
            let mut spins = 0u32;
            let was = loop {
                let o = self.order[0].load(SeqCst);
                if o == BUSY && spins < 1 << 20 {
                    spins += 1;
                    std::hint::spin_loop();
                    continue;
                }
                if self.order[0].compare_exchange(o, BUSY, SeqCst, SeqCst).is_ok() {
                    break o;
                }
            };
            let old = (was != 0 && was != BUSY).then(|| self.bytes[0].load(SeqCst));
            match bytes {
                Some(b) => {
                    self.bytes[0].store(b, SeqCst);
                    self.order[0].store(self.next.fetch_add(1, SeqCst), SeqCst);
                }
                None => self.order[0].store(0, SeqCst),
            }
            old
        }

        /// A slot's (order, bytes) when it holds a statement.
        fn read(&self, slot: usize) -> Option<(u64, u64)> {
            // A slot written while read is read again: its order is stored last.
            for _ in 0..1024 {
                let o = self.order[slot].load(SeqCst);
                if o == 0 {
                    return None;
                }
                if o == BUSY {
                    std::hint::spin_loop();
                    continue;
                }
                let b = self.bytes[slot].load(SeqCst);
                if self.order[slot].load(SeqCst) == o {
                    return Some((o, b));
                }
            }
            None
        }

        /// The bytes of `slot`'s statement, if live (tests).
        #[cfg(test)]
        pub(super) fn bytes_of(&self, slot: usize) -> Option<u64> {
            self.read(slot).map(|(_, b)| b)
        }

        /// The bytes of the latest live statement.
        pub(super) fn latest(&self) -> Option<u64> {
            (0..SLOTS).filter_map(|s| self.read(s)).max_by_key(|&(o, _)| o).map(|(_, b)| b)
        }
    }
}

impl Owner {
    fn new(pid: u32) -> Owner {
        Owner {
            pid,
            next: 0,
            members: HashMap::new(),
            stores: HashMap::new(),
            demand: 0,
            direct: 0,
            clock: 0.0,
            all_zero: true,
        }
    }

    /// What member `m` adds to the demand when it is the only one on its
    /// store: its bytes unless forced.
    fn own_demand(m: &Joined) -> u64 {
        if m.forced {
            0
        } else {
            m.data
        }
    }

    /// What the members of store `s` (or member `id` alone, of no known
    /// store) add to the demand: the largest unforced one's bytes.
    fn part_of_demand(&self, store: Option<StoreId>, id: u64) -> u64 {
        match store {
            Some(s) => self.stores.get(&s).map_or(0, |per| {
                per.members.iter().filter_map(|j| self.members.get(j)).map(Owner::own_demand).max().unwrap_or(0)
            }),
            None => self.members.get(&id).map_or(0, Owner::own_demand),
        }
    }

    /// Runs `f` on the owner and keeps the demand up to date for the store
    /// of member `id` (`store`), which `f` may change.
    fn changing<R>(&mut self, store: Option<StoreId>, id: u64, f: impl FnOnce(&mut Owner) -> R) -> R {
        let before = self.part_of_demand(store, id);
        let r = f(self);
        let after = self.part_of_demand(store, id);
        self.demand = self.demand.saturating_sub(before).saturating_add(after);
        r
    }

    fn join(&mut self, store: Option<StoreId>, forced: bool, data: u64) -> Member {
        let id = self.next;
        self.next += 1;
        let shared = self.changing(store, id, |o| {
            o.members.insert(id, Joined { store, forced, data, direct: false, cap: None });
            let at = o.clock;
            store.map(|s| {
                let e = o.stores.entry(s).or_insert_with(|| PerStore {
                    cache: Arc::new(Cache::new(0)),
                    asked: Arc::default(),
                    recent: PRIOR_RECORDS,
                    at,
                    members: Vec::new(),
                });
                e.members.push(id);
                (e.cache.clone(), e.asked.clone())
            })
        });
        GENERATION.fetch_add(1, Relaxed);
        let (cache, asked) = shared.unzip();
        Member { id, cache, asked, local: self.pid == 0, _stated: None }
    }

    fn demand(&self) -> u64 {
        self.demand
    }

    fn update(&mut self, id: u64, data: u64, direct: bool, cap: Option<u64>) {
        let Some(m) = self.members.get(&id) else { return };
        if (m.data, m.direct, m.cap) != (data, direct, cap) {
            let (store, was) = (m.store, m.direct && !m.forced);
            self.changing(store, id, |o| {
                let m = o.members.get_mut(&id).expect("member");
                (m.data, m.direct, m.cap) = (data, direct, cap);
                let now = m.direct && !m.forced;
                o.direct = o.direct + usize::from(now) - usize::from(was);
            });
            GENERATION.fetch_add(1, Relaxed);
        }
    }

    fn leave(&mut self, id: u64) {
        if let Some(store) = self.members.get(&id).map(|m| m.store) {
            self.changing(store, id, |o| {
                let m = o.members.remove(&id).expect("member");
                o.direct -= usize::from(m.direct && !m.forced);
                if let Some(s) = m.store {
                    if let Some(per) = o.stores.get_mut(&s) {
                        per.members.retain(|&j| j != id);
                        if per.members.is_empty() {
                            // Nothing reads these records any more (module docs).
                            o.stores.remove(&s);
                        }
                    }
                }
            });
        }
        GENERATION.fetch_add(1, Relaxed);
    }

    fn rebalance(&mut self, total: u64) {
        if self.direct == 0 && self.all_zero {
            // No record cache to size: every capacity is 0 and stays so.
            return;
        }
        // The records asked of each store since the last rebalance; the clock
        // moves by all of them.
        let asked: Vec<f64> = self.stores.values().map(|per| per.asked.swap(0, Relaxed) as f64).collect();
        self.clock += asked.iter().sum::<f64>() / HALF_LIFE_RECORDS;
        let clock = self.clock;
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
        for ((s, per), asked) in self.stores.iter_mut().zip(asked) {
            // Halved per half-life gone by since it was last brought up.
            per.recent = per.recent * 0.5f64.powf(clock - per.at) + asked;
            per.at = clock;
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
        self.all_zero = targets.values().all(|&t| t == 0);
        for (s, per) in self.stores.iter() {
            let target = targets.get(s).copied().unwrap_or(0);
            if per.cache.capacity() != target {
                per.cache.set_capacity(target);
            }
        }
    }
}

/// Records asked of every store together over which a store's request count
/// halves (module docs). A loader's steps in flight (its depth and threads, a
/// few thousand records) are a few percent of it, so the shares of two
/// sources asked in a steady ratio hold that ratio within the band
/// ([`SHARE_BAND`]), however often the stores look at the budget; a program
/// that moves to other stores moves the shares within a few of these.
const HALF_LIFE_RECORDS: f64 = 32_768.0;

/// The request count a store starts with: a store not yet asked anything
/// (a mixture's source before its first step, whose window is already read
/// ahead into its cache) keeps about an equal share until its requests
/// show otherwise, and the first steps' few records move no share by much.
const PRIOR_RECORDS: f64 = 4_096.0;

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
            // Rounding down leaves a few bytes over (one store's share of
            // `left` can come out a byte short of `left`): they go to the
            // open stores in turn, none past its limit, so the shares add up
            // to what was shared.
            let mut rest = left.saturating_sub(open.iter().map(|&i| out[i]).sum::<u64>());
            for &i in &open {
                let add = rest.min(stores[i].1 - out[i]);
                out[i] += add;
                rest -= add;
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

    #[test]
    fn shares_add_up_to_the_total_whatever_the_weights() {
        // A lone store's share is the whole, and several stores' shares sum
        // to it, for weights that do not divide it evenly in floating point.
        for &w in &[1.0, 4096.7, 1_521.758_152_076_235, 0.1, 3.0e-7, 123_456.789] {
            assert_eq!(share_out(1_835_008, &[(w, u64::MAX)]), vec![1_835_008], "weight {w}");
            let three = share_out(1_835_008, &[(w, u64::MAX), (w * 0.3, u64::MAX), (7.0, u64::MAX)]);
            assert_eq!(three.iter().sum::<u64>(), 1_835_008, "weights {w}: {three:?}");
        }
        // Limits still hold: what a limited store cannot take goes to the rest.
        assert_eq!(share_out(100, &[(1.0, 10), (1.0, u64::MAX)]), vec![10, 90]);
    }

    fn id(dir: &tempfile::TempDir) -> Option<StoreId> {
        StoreId::of(dir.path()).ok()
    }

    /// An owner of its own (pid 0), apart from the process's.
    fn owner() -> Owner {
        Owner::new(0)
    }

    #[test]
    fn demand_counts_each_store_once() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut o = owner();
        let m1 = o.join(id(&a), false, 700);
        let m2 = o.join(id(&a), false, 900);
        let m3 = o.join(id(&b), false, 700);
        o.join(None, true, 1 << 40);
        assert_eq!(o.demand(), 1_600);
        o.leave(m3.id);
        assert_eq!(o.demand(), 900);
        o.leave(m2.id);
        assert_eq!(o.demand(), 700);
        o.leave(m1.id);
        assert!(o.stores.is_empty(), "the last handle of a store takes its cache");
    }

    /// Two loaders of different budgets, closed in the order they were opened
    /// or in the other: each close releases its own statement, and the budget
    /// is the latest statement still live, or none.
    #[test]
    fn statements_are_released_in_any_order() {
        for open_order in [true, false] {
            let t: &'static statements::Table = Box::leak(Box::new(statements::Table::new()));
            assert_eq!(t.latest(), None);
            let small = t.push(1 << 20).unwrap();
            let big = t.push(22 << 30).unwrap();
            assert_eq!(t.latest(), Some(22 << 30), "the latest statement is the budget");
            if open_order {
                t.release(small);
                assert_eq!(t.latest(), Some(22 << 30), "closing the first leaves the second's");
                t.release(big);
            } else {
                t.release(big);
                assert_eq!(t.latest(), Some(1 << 20), "closing the second goes back to the first's");
                t.release(small);
            }
            assert_eq!(t.latest(), None, "nothing stays stated once both closed");
        }
        // The process-level statement is one more, by recency; replacing it
        // returns the one replaced, and withdrawing it uncovers the others.
        let t: &'static statements::Table = Box::leak(Box::new(statements::Table::new()));
        assert_eq!(t.set_process(Some(5_000)), None);
        let loader = t.push(3_000).unwrap();
        assert_eq!(t.latest(), Some(3_000));
        assert_eq!(t.set_process(Some(7_000)), Some(5_000));
        assert_eq!(t.latest(), Some(7_000));
        assert_eq!(t.set_process(None), Some(7_000));
        assert_eq!(t.latest(), Some(3_000));
        t.release(loader);
        assert_eq!(t.latest(), None);
        // Slots are reused once released, and a full table states nothing more.
        let held: Vec<usize> = (0..statements::SLOTS - 1).map(|i| t.push(i as u64).unwrap()).collect();
        assert_eq!(t.push(1), None);
        assert_eq!(t.latest(), Some(statements::SLOTS as u64 - 2));
        t.release(held[3]);
        assert_eq!(t.push(99), Some(held[3]));
        assert_eq!(t.latest(), Some(99));
    }

    #[test]
    fn a_handles_statement_lives_until_it_closes() {
        let s = state_cache_bytes(123_456_789_012);
        let other = join(None, Some(987_654_321), true, 0);
        // Other tests of this process state budgets too: only what these two
        // did is checked, through their slots.
        let (a, b) = (s.slot.unwrap(), other._stated.as_ref().unwrap().slot.unwrap());
        assert_ne!(a, b);
        assert_eq!(statements::TABLE.bytes_of(a), Some(123_456_789_012));
        drop(other);
        assert_eq!(statements::TABLE.bytes_of(b), None, "closing the handle released its statement");
        let mut s = s;
        s.release();
        assert_eq!(statements::TABLE.bytes_of(a), None);
        s.release();
    }

    #[test]
    fn cache_bytes_follow_the_records_asked_and_none_go_to_buffered_stores() {
        let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut o = owner();
        let small = o.join(id(&a), false, 1 << 20);
        let big = o.join(id(&b), false, 1 << 30);
        let buffered = o.join(id(&c), false, 1 << 20);
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
        // Asked more often (counts halve per half-life of records asked of
        // all stores: ten half-lives leave a thousandth of what came
        // before): 70 % of the bytes.
        let half = HALF_LIFE_RECORDS as u64;
        o.update(small.id, 64 << 20, true, None);
        small.asked(7 * half);
        big.asked(3 * half);
        o.rebalance(64 << 20);
        let (s, g) = (small.capacity(), big.capacity());
        assert!(
            s.abs_diff(Ratio(7, 10).of(64 << 20)) < 1024 && g.abs_diff(Ratio(3, 10).of(64 << 20)) < 1024,
            "{s} {g}"
        );
        // A small wobble of the counts (2.875 against 1.375 half-lives'
        // records, 68 % against 32 %) moves nothing.
        small.asked(2 * half);
        big.asked(half);
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

    /// A mode-3 mixture of three sources (0.5/0.3/0.2 of each step's 256
    /// rows): each source's windows, read ahead into its cache, take half of
    /// its share by the weights. Every store looks at the budget after its
    /// gathers, in whatever order the workers finish them; the shares must
    /// never fall below what the windows hold, from the first step on, and
    /// must settle on the weights.
    #[test]
    fn shares_hold_still_while_a_mixture_reads_ahead() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut o = owner();
        let members: Vec<Member> = dirs.iter().map(|d| o.join(id(d), false, 8 << 30)).collect();
        for m in &members {
            o.update(m.id, 8 << 30, true, None);
        }
        let total: u64 = 1200 << 20;
        o.rebalance(total);
        let rows = [128u64, 77, 51];
        let weights = [0.5, 0.3, 0.2];
        // A shuffle of each four steps' gathers (the steps in flight).
        let mut x = 88_172_645_463_325_252u64;
        let mut moves = 0;
        for four in 0..2_000u64 {
            let mut gathers: Vec<usize> = (0..12).map(|g| g % 3).collect();
            for i in (1..gathers.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                gathers.swap(i, (x % (i as u64 + 1)) as usize);
            }
            for k in gathers {
                members[k].asked(rows[k]);
                let before: Vec<u64> = members.iter().map(Member::capacity).collect();
                o.rebalance(total);
                for (k, m) in members.iter().enumerate() {
                    let (cap, share) = (m.capacity(), weights[k] * total as f64);
                    assert!(cap as f64 >= share / 2.0, "step {}: source {k}'s cache {cap} < half its share", four * 4);
                    if four >= 500 {
                        let off = (cap as f64 - share).abs() / share;
                        assert!(off <= 0.2, "step {}: source {k}'s cache {cap} is {off:.2} off its share", four * 4);
                        moves += usize::from(cap != before[k]);
                    }
                }
            }
        }
        assert!(moves <= 30, "the shares moved {moves} times in 6,000 steps of a steady mixture");
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
