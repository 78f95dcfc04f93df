//! The record cache: stored (still compressed) record bytes kept in memory,
//! shared by every handle on the same store in a process.
//!
//! It stands in for the page cache when reads bypass it (O_DIRECT, chosen by
//! [`crate::memory::policy::choose`] for data larger than memory). A hit hands back
//! the stored bytes, which the gather checks against the entry's crc and
//! decodes as it would bytes it had read.
//!
//! # API
//!
//! - [`Cache`]: one per open store, made by the process's memory owner
//!   ([`crate::memory::owner`]), which alone sets its capacity
//!   ([`Cache::set_capacity`]; 0, admitting nothing, until the store is read
//!   with O_DIRECT).
//! - [`Key`] = [`StoreId`] ([`StoreId::of`] the store directory) +
//!   [`RecordKey`] ([`RecordKey::of`] the table entry).
//! - [`Cache::get`], [`Cache::insert`] with a [`NextUse`] hint,
//!   [`Cache::touch`], [`Cache::clear_store`], [`Cache::stats`].
//! - [`Cache::hold`] / [`Cache::unhold`]: bytes held outside the entries (a
//!   mode-3 window's slabs, [`crate::memory::window`]) charged against the
//!   same capacity, entries evicted for them; [`Cache::put_spare`] /
//!   [`Cache::take_spare`]: a released window's slabs, still charged, for the
//!   next window's reads, released before any entry when room is needed.
//!
//! # Why a stale entry is never served
//!
//! The store identity is the device, inode and birth time of the store's
//! directory: handles on one directory share entries, and a store deleted and
//! created again at the same path is another store, even where the file system
//! hands out the freed inode number again (the birth time differs; where the
//! file system keeps none, the record key below still guards).
//!
//! The record key is the entry's chunk id, offset, stored length and crc32c.
//! Committed bytes at a (chunk, offset) never change while the store lives:
//! chunk files only grow past their committed length, deletes rewrite only the
//! table, and compaction writes to chunk ids numbered after every committed
//! chunk (the head's base + count) before removing the old files. So the
//! location alone would do for committed records, and the table generation is
//! not needed (including it would empty the cache on every delete). A location
//! is reused only for bytes that were never committed: appends the writing
//! handle saw, lost to a crash or a poisoned writer, cut off by recovery and
//! written over by later appends. The crc and length in the key make such a
//! reuse a miss unless the new bytes have the same length and crc32c as the
//! lost ones. Callers close even that gap by offering only committed records:
//! a read-only handle sees nothing else, and a writable one must skip records
//! past its last committed head (a chunk after the head's last, or bytes past
//! its `tail_len` in the last). loaderx
//! stores keep no crc and are keyed by location and length: zring never writes
//! them, and a program that rewrites them under a reader is outside the
//! contract, as it already is for their mappings.
//!
//! # Admission and eviction
//!
//! A training epoch reads every record once, in random order. An LRU cache
//! holding a fraction `c` of the data then hits only `c + (1 - c) ln(1 - c)`
//! of the reads (15 % for `c = 0.5`) and evicts on nearly every insert. This
//! cache instead ranks entries by when they are next needed ([`NextUse`]) and
//! an insert may only displace entries needed strictly later:
//!
//! * Without knowledge of the future ([`NextUse::Unknown`], the store's own
//!   gathers) every entry ranks the same, so a full cache admits nothing and
//!   evicts nothing: it keeps the first records that fit, and serves exactly
//!   its share `c` of every later epoch with no churn (the policy of CoorDL's
//!   MinIO cache).
//! * A loader that knows the next epochs' order (or, for iid draws, looks
//!   ahead at them) passes the step at which a record is needed next
//!   ([`NextUse::At`]; `At(u64::MAX)` for "later than every step it can
//!   see"), or [`NextUse::Never`] when it is not needed again this cycle, and
//!   updates cached records it reads ([`Cache::touch`]). A full cache then replaces the records needed
//!   farthest in the future, or never, by ones needed sooner (Belady's
//!   rule). A record inserted as `Never` is not admitted at all, even with
//!   room: it would sit unused until evicted, and copying it in costs the
//!   reader a copy and the cache's memory its first touch (a loader in
//!   cyclic mode marks so the records needed next cycle only after its cache
//!   would have dropped them, `zring_loader`'s store adapter). Steps of different loaders are not comparable; one store should
//!   have one loader giving hints.
//!
//! On whole epochs of permutations no policy beats the fixed subset: a hit
//! needs its record cached since its read in the previous epoch, so across
//! each epoch boundary, and the cache holds at most its capacity across it.
//! Knowing the future pays when records recur within an epoch (sampling with
//! replacement, weighted sampling: 53 % instead of 20 % hits in the test with
//! a fifth of the data cached; a loader's iid draws with a third cached, 72 %
//! instead of 33 %), and it lets a cache filled by one cycle's order follow
//! the next one's.
//!
//! Ranks, from kept longest to evicted first: `At(s)` by `s`, then `Unknown`,
//! then `Never`. A record whose `At` step has passed keeps its rank until it is
//! touched, so a loader must touch every cached record it reads.
//!
//! # Numbers
//!
//! * [`SHARDS`] = 64 mutex-guarded maps. Lookups come from every gather
//!   thread (the decode pool has a thread per core, and a loader runs several
//!   gathers at once); with 64 shards two of 32 threads touch the same shard
//!   at one instant with small probability, and a lock is held only for a map
//!   operation. Copying the bytes into the entry happens outside any lock.
//! * An entry is charged what it holds: the capacity of the slab its bytes
//!   are kept in ([`crate::io::slab::record_capacity`]: its length rounded up
//!   to 64 bytes, or to a page from 64 KiB up; charging the length alone let
//!   records of 64 KiB + 1 byte, kept in 128 KiB slabs then, take 2.27 times
//!   the budget), and [`ENTRY_OVERHEAD`] bytes on top: the hash-map bucket and the ordered index entry (each about 1.5
//!   times its size, for tables between half and seven-eighths full and
//!   B-tree nodes two-thirds full on average) and the shared allocation's
//!   counters and the allocator's rounding (checked against the type sizes by
//!   a test). Tiny records are thus charged honestly; for records of kilobytes
//!   it is noise.
//! * An insert evicts at most [`MAX_EVICTIONS_PER_INSERT`] = 64 entries, so a
//!   single large record cannot empty a cache of small ones; a store's
//!   records are usually of similar size and need one or two.
//!
//! Byte accounting reserves an entry's charge (a compare-and-swap against the
//! capacity) before the entry is added and releases it after the entry is
//! removed, so the charged bytes never exceed the capacity, whatever the
//! threads do. Only shrinking the capacity ([`Cache::set_capacity`]) leaves
//! more charged than allowed, until the evictions it runs finish. Picking an
//! eviction victim reads each shard's farthest rank from an atomic without
//! locking, then locks that one shard to evict; no two shard locks are ever
//! held at once.
//!
//! After `fork()` a child never uses its parent's caches (a parent thread may
//! have held a lock when the process forked): the memory owner is tagged with
//! the pid and a child starts an empty one, leaving the parent's memory alone.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use rustc_hash::FxBuildHasher;

use crate::io::slab::Slab;

use crate::format::record::{ChunkId, Entry};

/// Number of independently locked parts of the cache (module docs).
pub(crate) const SHARDS: usize = 64;
/// Bytes charged per entry on top of its stored bytes (module docs).
pub(crate) const ENTRY_OVERHEAD: u64 = 320;
/// Most entries one insert may evict to make room (module docs).
pub(crate) const MAX_EVICTIONS_PER_INSERT: usize = 64;

pub(crate) use crate::io::fds::StoreId;

/// Which bytes of a store an entry holds: where they are, how long they are
/// and their crc32c (module docs: why no stale bytes can match).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RecordKey {
    /// The chunk file.
    pub chunk: ChunkId,
    /// Offset of the stored bytes in the chunk.
    pub offset: u64,
    /// Length of the stored bytes.
    pub stored_len: u32,
    /// crc32c of the stored bytes (`None` for loaderx stores).
    pub crc: Option<u32>,
}

impl RecordKey {
    /// The key of the stored bytes a table entry names.
    pub fn of(e: &Entry) -> RecordKey {
        RecordKey { chunk: e.chunk, offset: e.offset, stored_len: e.stored_len, crc: e.checksum }
    }
}

/// A cache key: a record of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The store.
    pub store: StoreId,
    /// The record's stored bytes.
    pub record: RecordKey,
}

impl Key {
    /// The key of the record `e` names in `store`.
    pub fn new(store: StoreId, e: &Entry) -> Key {
        Key { store, record: RecordKey::of(e) }
    }
}

/// When a record is needed next, as the caller knows it: a data loader's
/// sampler knows every future index, and the record cache keeps the records
/// needed soonest ([`crate::Gather::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextUse {
    /// Nothing is known: the record may come again, as every other may.
    Unknown,
    /// Needed again at this step (the loader's step count).
    At(u64),
    /// Not needed again this cycle: never copied into the cache.
    Never,
}

/// Returns the allocator's free memory to the system, pooled slabs and the
/// free slots of the record arenas ([`crate::io::slab`]) first. Entries
/// larger than [`crate::io::slab::MAX_CARVED`] (and the few allocated while
/// the arenas were busy) are allocated by whichever thread read them, so
/// with glibc they sit in per-thread arenas,
/// which give memory back only from the top of a heap; `malloc_trim` releases
/// every free page of every arena (`madvise(MADV_DONTNEED)`). Other
/// allocators (musl, a program's own) return large frees themselves or have
/// their own knobs; nothing is done for them.
fn give_back() {
    crate::io::slab::drain();
    crate::io::process::trim_heap();
}

const RANK_UNKNOWN: u64 = u64::MAX - 2;
const RANK_NEVER: u64 = u64::MAX - 1;

impl NextUse {
    /// Larger ranks are evicted first. Ranks stay below `u64::MAX` so a
    /// shard's `farthest` can hold `rank + 1` with 0 for "empty".
    fn rank(self) -> u64 {
        match self {
            NextUse::At(s) => s.min(RANK_UNKNOWN - 1),
            NextUse::Unknown => RANK_UNKNOWN,
            NextUse::Never => RANK_NEVER,
        }
    }
}

/// What [`Cache::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// The record is now cached.
    Inserted,
    /// It was cached already (its rank was updated unless the hint was
    /// [`NextUse::Unknown`]).
    Present,
    /// Not admitted: the cache is full of records needed no later, or the
    /// record is larger than the capacity.
    Rejected,
}

/// Counters of a [`Cache`]. Each is exact once concurrent calls have returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheStats {
    /// Lookups that found the record.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Records admitted.
    pub inserts: u64,
    /// Records not admitted.
    pub rejections: u64,
    /// Records evicted to make room or to shrink the capacity.
    pub evictions: u64,
    /// Stored bytes of the cached records.
    pub bytes: u64,
    /// Cached records.
    pub entries: u64,
    /// Bytes charged against the capacity: each entry's [`charge`], plus the
    /// charges of inserts under way.
    pub charged: u64,
    /// The capacity in charged bytes.
    pub capacity: u64,
    /// Bytes of loaded windows' slabs charged here ([`Cache::hold`]).
    pub held: u64,
}

/// The bytes an entry of `len` stored bytes is charged: its slab's capacity
/// and the entry's overhead (module docs).
pub(crate) fn charge(len: usize) -> u64 {
    crate::io::slab::record_capacity(len) as u64 + ENTRY_OVERHEAD
}

struct Slot {
    bytes: Bytes,
    rank: u64,
    /// Unique per insert or touch: orders entries of equal rank, the latest
    /// evicted first, so the set kept in baseline mode is the oldest.
    seq: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Slot, FxBuildHasher>,
    /// Every entry of `map` by (rank, seq); the last is the eviction victim.
    order: BTreeMap<(u64, u64), Key>,
}

impl Inner {
    fn farthest(&self) -> u64 {
        self.order.last_key_value().map_or(0, |(&(rank, _), _)| rank + 1)
    }
}

struct Shard {
    inner: Mutex<Inner>,
    /// `rank + 1` of the shard's farthest entry, 0 when it is empty. Written
    /// under the lock; read without it to pick a shard to evict from, and
    /// checked again under the lock.
    farthest: AtomicU64,
}

/// A byte-bounded cache of stored record bytes (module docs).
pub(crate) struct Cache {
    shards: Box<[Shard]>,
    /// Keys are a store's own record positions and checksums, not input an
    /// adversary chooses: a multiply-rotate hash (rustc-hash) spreads them,
    /// at a fraction of SipHash's cost per lookup.
    hasher: FxBuildHasher,
    capacity: AtomicU64,
    charged: AtomicU64,
    seq: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    rejections: AtomicU64,
    evictions: AtomicU64,
    bytes: AtomicU64,
    entries: AtomicU64,
    held: AtomicU64,
    /// Slabs of released windows kept for the next window's reads, still
    /// charged as held ([`Cache::put_spare`]).
    spare: Mutex<Vec<Slab>>,
}

impl Cache {
    /// An empty cache of `capacity` charged bytes.
    pub fn new(capacity: u64) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Shard { inner: Mutex::default(), farthest: AtomicU64::new(0) }).collect(),
            hasher: FxBuildHasher,
            capacity: AtomicU64::new(capacity),
            charged: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            rejections: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            held: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// The capacity in charged bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Relaxed)
    }

    /// Sets the capacity; when it shrinks below what is charged, evicts the
    /// farthest-needed entries until the cache fits. An insert that reserved
    /// against the old capacity while this ran can leave the cache over the
    /// new one by that insert's charge until the next shrink or eviction.
    ///
    /// Memory freed by a shrink is handed back to the system at once
    /// ([`give_back`]): the budget is measured from the process's resident
    /// memory, and memory the allocator kept would read as the rest of the
    /// process having grown, shrinking the cache again, in a spiral down to
    /// nothing (bench-results/engine-notes.md).
    pub fn set_capacity(&self, bytes: u64) {
        self.capacity.store(bytes, Relaxed);
        let mut evicted = false;
        while self.charged.load(Relaxed) > self.capacity.load(Relaxed) && (self.drop_spare() || self.evict_one(None)) {
            evicted = true;
        }
        if evicted {
            give_back();
        }
    }

    /// The stored bytes of `key`, if cached.
    pub fn get(&self, key: &Key) -> Option<Bytes> {
        let found = lock(self.shard(key)).map.get(key).map(|s| s.bytes.clone());
        match found {
            Some(_) => self.hits.fetch_add(1, Relaxed),
            None => self.misses.fetch_add(1, Relaxed),
        };
        found
    }

    /// Offers `stored` (bytes the caller has checked against the entry's crc)
    /// for `key`, needed next at `next`: copied in if admitted. Admitted while
    /// there is room; when full, only by evicting entries needed strictly
    /// later; never when `next` is [`NextUse::Never`] (module docs).
    pub fn insert(&self, key: Key, stored: &[u8], next: NextUse) -> Admit {
        self.insert_with(key, stored.len(), next, || Slab::copy_of(stored))
    }

    /// Admits `len` stored bytes for `key`, made by `bytes` only once room is
    /// reserved.
    fn insert_with(&self, key: Key, len: usize, next: NextUse, bytes: impl FnOnce() -> Bytes) -> Admit {
        let rank = next.rank();
        let shard = self.shard(&key);
        {
            let mut g = lock(shard);
            if g.map.contains_key(&key) {
                if next != NextUse::Unknown {
                    self.rerank(shard, &mut g, &key, rank);
                }
                return Admit::Present;
            }
        }
        if next == NextUse::Never {
            // Not needed again this cycle: the copy would only be evicted.
            self.rejections.fetch_add(1, Relaxed);
            return Admit::Rejected;
        }
        let charge = charge(len);
        let mut evicted = 0;
        while !self.try_reserve(charge) {
            if self.drop_spare() {
                continue;
            }
            if charge > self.capacity() || evicted == MAX_EVICTIONS_PER_INSERT || !self.evict_one(Some(rank)) {
                self.rejections.fetch_add(1, Relaxed);
                return Admit::Rejected;
            }
            evicted += 1;
        }
        let bytes = bytes();
        let mut g = lock(shard);
        if g.map.contains_key(&key) {
            drop(g);
            self.charged.fetch_sub(charge, Relaxed);
            return Admit::Present;
        }
        let seq = self.seq.fetch_add(1, Relaxed);
        g.order.insert((rank, seq), key);
        g.map.insert(key, Slot { bytes, rank, seq });
        shard.farthest.store(g.farthest(), Relaxed);
        self.bytes.fetch_add(len as u64, Relaxed);
        self.entries.fetch_add(1, Relaxed);
        self.inserts.fetch_add(1, Relaxed);
        Admit::Inserted
    }

    /// Charges `bytes` held outside the entries (a loaded window's slab,
    /// [`crate::memory::window`]) against the capacity, evicting entries,
    /// farthest-needed first, to make room: a window's records are needed
    /// within its steps, sooner than any cached record. `false`, charging
    /// nothing, when even an empty cache has no room.
    pub fn hold(&self, bytes: u64) -> bool {
        while !self.try_reserve(bytes) {
            if bytes > self.capacity() || !(self.drop_spare() || self.evict_one(None)) {
                return false;
            }
        }
        self.held.fetch_add(bytes, Relaxed);
        true
    }

    /// Releases bytes charged by [`Cache::hold`].
    pub fn unhold(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Relaxed);
        self.charged.fetch_sub(bytes, Relaxed);
    }

    /// Keeps `slab` of a released window, still charged, for the next
    /// window's reads ([`Cache::take_spare`]): its pages are resident, where
    /// a fresh slab costs a page fault, a page clear and a cgroup charge per
    /// page as its read lands. At most a quarter of the capacity (a mode-3
    /// window, `zring-loader`'s block shape) is kept; the rest is released,
    /// and spare slabs go before any record when room is needed.
    pub fn put_spare(&self, slab: Slab) {
        let bytes = slab.as_ref().len() as u64;
        if let Ok(mut spare) = self.spare.try_lock() {
            let kept: u64 = spare.iter().map(|s| s.as_ref().len() as u64).sum();
            if kept + bytes <= self.capacity() / 4 {
                spare.push(slab);
                return;
            }
        }
        self.unhold(bytes);
    }

    /// A spare slab of `cap` bytes, its charge passed to the caller (who
    /// releases it with [`Cache::unhold`] or [`Cache::put_spare`]).
    pub fn take_spare(&self, cap: usize) -> Option<Slab> {
        let mut spare = self.spare.try_lock().ok()?;
        let k = spare.iter().position(|s| s.as_ref().len() == cap)?;
        Some(spare.swap_remove(k))
    }

    /// Releases one spare slab; `false` when there is none.
    fn drop_spare(&self) -> bool {
        let slab = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match slab {
            Some(s) => {
                self.unhold(s.as_ref().len() as u64);
                true
            }
            None => false,
        }
    }

    /// Records when a cached `key` is needed next; `false` if it is not cached.
    pub fn touch(&self, key: &Key, next: NextUse) -> bool {
        let shard = self.shard(key);
        let mut g = lock(shard);
        if !g.map.contains_key(key) {
            return false;
        }
        self.rerank(shard, &mut g, key, next.rank());
        true
    }

    /// Drops every entry of `store`; returns how many there were.
    pub fn clear_store(&self, store: StoreId) -> u64 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut g = lock(shard);
            let keys: Vec<Key> = g.map.keys().filter(|k| k.store == store).copied().collect();
            let mut freed = 0;
            for k in &keys {
                freed += self.remove_locked(shard, &mut g, k).expect("key listed from the map");
            }
            drop(g);
            self.charged.fetch_sub(freed, Relaxed);
            removed += keys.len() as u64;
        }
        removed
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            inserts: self.inserts.load(Relaxed),
            rejections: self.rejections.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            entries: self.entries.load(Relaxed),
            charged: self.charged.load(Relaxed),
            capacity: self.capacity(),
            held: self.held.load(Relaxed),
        }
    }

    fn shard(&self, key: &Key) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }

    fn try_reserve(&self, charge: u64) -> bool {
        let cap = self.capacity();
        self.charged.fetch_update(Relaxed, Relaxed, |c| c.checked_add(charge).filter(|&t| t <= cap)).is_ok()
    }

    /// Gives a cached `key` a new rank (and sequence number).
    fn rerank(&self, shard: &Shard, g: &mut Inner, key: &Key, rank: u64) {
        let seq = self.seq.fetch_add(1, Relaxed);
        let slot = g.map.get_mut(key).expect("caller checked the key is cached");
        let old = (slot.rank, slot.seq);
        (slot.rank, slot.seq) = (rank, seq);
        g.order.remove(&old);
        g.order.insert((rank, seq), *key);
        shard.farthest.store(g.farthest(), Relaxed);
    }

    /// Removes `key` from a shard whose lock the caller holds; returns the
    /// charge to release (after unlocking).
    fn remove_locked(&self, shard: &Shard, g: &mut Inner, key: &Key) -> Option<u64> {
        let slot = g.map.remove(key)?;
        g.order.remove(&(slot.rank, slot.seq));
        shard.farthest.store(g.farthest(), Relaxed);
        self.bytes.fetch_sub(slot.bytes.len() as u64, Relaxed);
        self.entries.fetch_sub(1, Relaxed);
        Some(charge(slot.bytes.len()))
    }

    /// Evicts the entry needed farthest in the future, if its rank is above
    /// `above` (any entry for `None`). `false` when there is none.
    fn evict_one(&self, above: Option<u64>) -> bool {
        // The farthest entries can move while we look; a few retries settle it.
        for _ in 0..SHARDS {
            let Some((i, f)) = self.shards.iter().map(|s| s.farthest.load(Relaxed)).enumerate().max_by_key(|&(_, f)| f)
            else {
                return false;
            };
            if f == 0 || above.is_some_and(|a| f - 1 <= a) {
                return false;
            }
            let shard = &self.shards[i];
            let mut g = lock(shard);
            let victim = g.order.last_key_value().map(|(&(rank, _), &key)| (rank, key));
            match victim {
                Some((rank, key)) if above.is_none_or(|a| rank > a) => {
                    let freed = self.remove_locked(shard, &mut g, &key).expect("ordered keys are in the map");
                    drop(g);
                    self.charged.fetch_sub(freed, Relaxed);
                    self.evictions.fetch_add(1, Relaxed);
                    return true;
                }
                _ => shard.farthest.store(g.farthest(), Relaxed),
            }
        }
        false
    }

    /// Stored bytes and entries actually held, counted shard by shard; checks
    /// that the charge is theirs.
    #[cfg(test)]
    fn audit(&self) -> (u64, u64) {
        let mut bytes = 0;
        let mut entries = 0;
        let mut charged = 0;
        for s in self.shards.iter() {
            let g = lock(s);
            assert_eq!(g.map.len(), g.order.len());
            assert_eq!(s.farthest.load(Relaxed), g.farthest());
            bytes += g.map.values().map(|v| v.bytes.len() as u64).sum::<u64>();
            charged += g.map.values().map(|v| charge(v.bytes.len())).sum::<u64>();
            entries += g.map.len() as u64;
        }
        let held = self.held.load(Relaxed);
        assert_eq!(self.charged.load(Relaxed), charged + held, "the charge is the sum of the entries' and the held");
        (bytes, entries)
    }
}

fn lock(shard: &Shard) -> MutexGuard<'_, Inner> {
    // Nothing panics between the changes a shard's lock guards (map and index
    // are updated together), so a poisoned lock still guards a consistent shard.
    shard.inner.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(n: u64) -> StoreId {
        StoreId { dev: 1, ino: n, born: None }
    }

    fn key(store_n: u64, i: u64, len: u32) -> Key {
        Key {
            store: store(store_n),
            record: RecordKey { chunk: ChunkId(0), offset: i * 1_000_000, stored_len: len, crc: Some(i as u32) },
        }
    }

    /// A deterministic shuffle (splitmix64 driving Fisher-Yates).
    fn permutation(n: u64, seed: u64) -> Vec<u64> {
        let mut s = seed;
        let mut next = move || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut v: Vec<u64> = (0..n).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        v
    }

    fn cached_set(c: &Cache) -> Vec<Key> {
        let mut keys: Vec<Key> =
            c.shards.iter().flat_map(|s| lock(s).map.keys().copied().collect::<Vec<_>>()).collect();
        keys.sort_by_key(|k| (k.store.ino, k.record.offset));
        keys
    }

    #[test]
    fn overhead_covers_the_entry_structures() {
        let bucket = std::mem::size_of::<(Key, Slot)>() + 1;
        let index = std::mem::size_of::<((u64, u64), Key)>();
        // Hash tables run between 7/16 and 7/8 full, B-tree nodes two-thirds
        // full on average: 1.5 times each. The shared allocation adds two
        // counters, and the allocator its header and rounding to 16.
        let estimate = (bucket + index) * 3 / 2 + 16 + 8 + 15;
        assert!(estimate as u64 <= ENTRY_OVERHEAD, "estimate {estimate} > {ENTRY_OVERHEAD}");
        assert!(estimate as u64 * 3 / 2 > ENTRY_OVERHEAD, "the overhead {ENTRY_OVERHEAD} is far above {estimate}");
    }

    #[test]
    fn accounting_is_exact_and_capacity_is_never_exceeded() {
        let cap = 10 * charge(1000) + 500;
        let c = Cache::new(cap);
        for i in 0..50 {
            let len = 500 + (i as usize * 37) % 1000;
            c.insert(key(0, i, len as u32), &vec![i as u8; len], NextUse::Unknown);
            let s = c.stats();
            assert!(s.charged <= cap);
            assert_eq!(c.audit(), (s.bytes, s.entries));
        }
        assert!(c.stats().rejections > 0);
        // Values come back as inserted.
        for k in cached_set(&c) {
            let v = c.get(&k).unwrap();
            assert_eq!(v.len(), k.record.stored_len as usize);
            assert!(v.iter().all(|&b| b == k.record.crc.unwrap() as u8));
        }
        // Too large ever to fit: rejected without evicting anything.
        let before = c.stats();
        assert_eq!(c.insert(key(0, 99, 0), &vec![0; cap as usize], NextUse::At(0)), Admit::Rejected);
        assert_eq!(c.stats().entries, before.entries);
        // Shrinking evicts down to the new capacity.
        c.set_capacity(3 * charge(1000));
        let s = c.stats();
        assert!(s.charged <= 3 * charge(1000), "{s:?}");
        assert_eq!(c.audit(), (s.bytes, s.entries));
        assert_eq!(s.evictions, before.entries - s.entries);
    }

    /// Records of 64 KiB + 1 byte are charged the 68 KiB slab each is kept in:
    /// the cache holds no more memory than its capacity.
    #[test]
    fn an_entry_is_charged_its_slab() {
        const LEN: usize = 65_537;
        let cap = 64 << 20;
        let c = Cache::new(cap);
        for i in 0..2000 {
            c.insert(key(0, i, LEN as u32), &vec![3; LEN], NextUse::Unknown);
        }
        let s = c.stats();
        let held = 69_632 + ENTRY_OVERHEAD;
        assert_eq!(charge(LEN), held);
        assert_eq!(s.entries, cap / held);
        assert_eq!(s.charged, s.entries * held);
        assert_eq!(c.audit(), (s.entries * LEN as u64, s.entries));
    }

    #[test]
    fn no_churn_on_random_permutations() {
        const N: u64 = 1000;
        const LEN: usize = 1000;
        let c = Cache::new(300 * charge(LEN));
        let data = vec![7u8; LEN];
        let mut first = None;
        for epoch in 0..4 {
            let before = c.stats();
            for i in permutation(N, epoch) {
                let k = key(0, i, LEN as u32);
                if c.get(&k).is_none() {
                    c.insert(k, &data, NextUse::Unknown);
                }
            }
            let s = c.stats();
            assert_eq!(s.entries, 300);
            assert_eq!(s.evictions, 0);
            let set = cached_set(&c);
            match &first {
                None => {
                    assert_eq!(s.hits, 0);
                    first = Some(set);
                }
                Some(f) => {
                    // The same records, and exactly their share of the epoch.
                    assert_eq!(&set, f, "epoch {epoch} changed the cached set");
                    assert_eq!(s.hits - before.hits, 300);
                    assert_eq!(s.inserts, 300);
                }
            }
        }
    }

    #[test]
    fn future_aware_keeps_records_needed_sooner() {
        let c = Cache::new(3 * charge(10));
        let b = [0u8; 10];
        let k = |i| key(0, i, 10);
        assert_eq!(c.insert(k(1), &b, NextUse::At(10)), Admit::Inserted);
        assert_eq!(c.insert(k(2), &b, NextUse::At(20)), Admit::Inserted);
        assert_eq!(c.insert(k(3), &b, NextUse::At(30)), Admit::Inserted);
        // Needed sooner than the farthest: replaces it.
        assert_eq!(c.insert(k(4), &b, NextUse::At(5)), Admit::Inserted);
        assert!(c.get(&k(3)).is_none());
        // Needed later than everything cached, never again, or unknown: not admitted.
        assert_eq!(c.insert(k(5), &b, NextUse::At(40)), Admit::Rejected);
        assert_eq!(c.insert(k(6), &b, NextUse::Never), Admit::Rejected);
        assert_eq!(c.insert(k(7), &b, NextUse::Unknown), Admit::Rejected);
        // Once record 1 is known not to be needed again it goes first, even
        // for a record of unknown future.
        assert!(c.touch(&k(1), NextUse::Never));
        assert!(!c.touch(&k(3), NextUse::At(1)));
        assert_eq!(c.insert(k(7), &b, NextUse::Unknown), Admit::Inserted);
        assert!(c.get(&k(1)).is_none());
        // An unknown entry goes before any with a known next use.
        assert_eq!(c.insert(k(8), &b, NextUse::At(25)), Admit::Inserted);
        assert!(c.get(&k(7)).is_none());
        let s = c.stats();
        assert_eq!((s.entries, s.evictions, s.inserts), (3, 3, 6));
        assert_eq!(c.audit(), (30, 3));
        // Present: the hint updates the rank, Unknown does not.
        assert_eq!(c.insert(k(8), &b, NextUse::Unknown), Admit::Present);
        assert_eq!(c.insert(k(9), &b, NextUse::At(30)), Admit::Rejected);
        assert_eq!(c.insert(k(8), &b, NextUse::At(50)), Admit::Present);
        assert_eq!(c.insert(k(9), &b, NextUse::At(30)), Admit::Inserted);
        assert!(c.get(&k(8)).is_none());
    }

    #[test]
    fn a_record_never_needed_again_is_not_copied_in_even_with_room() {
        let c = Cache::new(10 * charge(10));
        let b = [0u8; 10];
        let k = |i| key(0, i, 10);
        assert_eq!(c.insert(k(1), &b, NextUse::Never), Admit::Rejected);
        assert!(c.get(&k(1)).is_none());
        assert_eq!(c.stats().charged, 0, "nothing was reserved for it");
        // Others still are, and a cached record later known not to be needed
        // stays until something needs its room.
        assert_eq!(c.insert(k(2), &b, NextUse::At(3)), Admit::Inserted);
        assert_eq!(c.insert(k(3), &b, NextUse::Unknown), Admit::Inserted);
        assert!(c.touch(&k(2), NextUse::Never));
        assert!(c.get(&k(2)).is_some());
    }

    /// Plays `order` through a fresh cache of `capacity` records of 100
    /// bytes; `known` gives each access the step of the record's next
    /// access. Returns the hits.
    fn play(order: &[u64], capacity: u64, known: bool) -> u64 {
        let c = Cache::new(capacity * charge(100));
        let data = [1u8; 100];
        let mut next_at = vec![None; order.len()];
        let mut seen: HashMap<u64, u64> = HashMap::new();
        for (t, &r) in order.iter().enumerate().rev() {
            next_at[t] = seen.insert(r, t as u64);
        }
        let mut hits = 0;
        for (t, &r) in order.iter().enumerate() {
            let k = key(0, r, 100);
            let next = match (known, next_at[t]) {
                (false, _) => NextUse::Unknown,
                (true, Some(s)) => NextUse::At(s),
                (true, None) => NextUse::Never,
            };
            if c.get(&k).is_some() {
                hits += 1;
                c.touch(&k, next);
            } else {
                c.insert(k, &data, next);
            }
        }
        let s = c.stats();
        assert!(s.charged <= c.capacity());
        assert_eq!(c.audit(), (s.bytes, s.entries));
        hits
    }

    #[test]
    fn knowing_the_future_matches_the_bound_on_epochs_and_beats_it_on_draws() {
        const N: u64 = 2000;
        // Whole epochs of permutations: a hit needs the record cached across
        // the epoch boundary since its last read, so no policy hits more than
        // the capacity per epoch; the fixed subset already does, and so must
        // the future-aware mode.
        let epochs: Vec<u64> = (0..4).flat_map(|e| permutation(N, 100 + e)).collect();
        assert_eq!(play(&epochs, N / 5, false), 3 * N / 5);
        assert_eq!(play(&epochs, N / 5, true), 3 * N / 5);
        // Independent draws (sampling with replacement) recur within an
        // epoch: keeping the records needed soonest beats a fixed subset.
        let mut s = 7u64;
        let draws: Vec<u64> = (0..8 * N)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s % N
            })
            .collect();
        let base = play(&draws, N / 5, false) as f64 / draws.len() as f64;
        let fut = play(&draws, N / 5, true) as f64 / draws.len() as f64;
        assert!(fut > base + 0.1, "future-aware {fut} vs fixed subset {base}");
    }

    #[test]
    fn another_crc_length_or_store_is_a_miss() {
        let c = Cache::new(1 << 20);
        let k = key(0, 1, 4);
        c.insert(k, b"abcd", NextUse::Unknown);
        assert_eq!(c.get(&k).as_deref(), Some(&b"abcd"[..]));
        let mut other = k;
        other.record.crc = Some(12345);
        assert!(c.get(&other).is_none());
        let mut other = k;
        other.record.stored_len = 5;
        assert!(c.get(&other).is_none());
        let mut other = k;
        other.store = store(1);
        assert!(c.get(&other).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (1, 3));
    }

    #[test]
    fn clear_store_drops_only_that_store() {
        let c = Cache::new(1 << 20);
        for i in 0..10 {
            c.insert(key(0, i, 8), &[0; 8], NextUse::Unknown);
            c.insert(key(1, i, 8), &[1; 8], NextUse::At(i));
        }
        assert_eq!(c.clear_store(store(0)), 10);
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.charged), (10, 80, 10 * charge(8)));
        assert!(c.get(&key(1, 3, 8)).is_some());
        assert_eq!(c.audit(), (80, 10));
    }

    #[test]
    fn concurrent_use_keeps_accounting_exact() {
        let cap = 400 * charge(2048);
        let c = Cache::new(cap);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let c = &c;
                s.spawn(move || {
                    let order = permutation(20_000, t);
                    for (n, &x) in order.iter().enumerate() {
                        let i = x % 2000;
                        let len = 1 + (i * 7919 % 4096) as usize;
                        let k = key(i % 3, i, len as u32);
                        let next = match x % 4 {
                            0 => NextUse::Unknown,
                            1 => NextUse::Never,
                            _ => NextUse::At(x / 4),
                        };
                        match n % 5 {
                            0 => {
                                c.touch(&k, next);
                            }
                            1 if t == 0 && n % 1000 == 1 => c.set_capacity(cap - (n as u64 % 3) * charge(4096)),
                            _ => {
                                if let Some(v) = c.get(&k) {
                                    assert_eq!(v.len(), len);
                                } else {
                                    c.insert(k, &vec![0; len], next);
                                }
                            }
                        }
                        assert!(c.stats().charged <= cap);
                    }
                });
            }
        });
        // An insert racing a shrink may have reserved against the old
        // capacity; setting it again finishes the shrink.
        c.set_capacity(c.capacity());
        let s = c.stats();
        assert_eq!(c.audit(), (s.bytes, s.entries));
        assert!(s.charged <= s.capacity);
        assert_eq!(s.inserts - s.evictions, s.entries);
    }

    #[test]
    fn store_identity_and_record_keys() {
        let dir = tempfile::tempdir().unwrap();
        let a = StoreId::of(dir.path()).unwrap();
        assert_eq!(a, StoreId::of(&dir.path().join(".")).unwrap());
        let other = tempfile::tempdir().unwrap();
        assert_ne!(a, StoreId::of(other.path()).unwrap());
        assert!(StoreId::of(&dir.path().join("missing")).is_err());
        let e = Entry {
            chunk: ChunkId(3),
            offset: 40,
            stored_len: 7,
            logical_len: 9,
            checksum: Some(5),
            codec: crate::format::codec::Codec::Zstd,
            within: 0,
        };
        assert_eq!(Key::new(a, &e).record, RecordKey { chunk: ChunkId(3), offset: 40, stored_len: 7, crc: Some(5) });
    }
}
