//! Loaded windows: the slabs a block load ([`crate::read::blocks`]) read a
//! window's runs of records into, kept whole for the gathers to copy the
//! records from, with no copy of their own.
//!
//! A window is the slabs of one [`crate::read::blocks::prefetch`] call and
//! an index from each record's key to its bytes in them. A gather looks a
//! record up in the store's loaded windows before its record cache and
//! copies it from the slab into the batch, checking its checksum as it does
//! every record's ([`crate::read::item::finish_record`]).
//!
//! # Memory
//!
//! Each slab is held against the store's record cache ([`Cache::hold`]): its
//! whole capacity is charged there, evicting cached records to make room,
//! for as long as the slab lives, and released when its last reference goes
//! ([`Held`]'s drop). A record sliced out of a slab keeps the whole slab
//! alive, and charged: the budget counts what is held. A slab that cannot be
//! held (the cache's capacity is taken by other windows) is dropped at once
//! and its records are read by the gathers that need them.
//!
//! # Lifetime
//!
//! A store keeps its [`KEEP`] newest windows while it loads the next: a
//! loader in mode 3 begins to load window `w + 2` once a step of window
//! `w + 1` is claimed, and the load begins by releasing window `w`
//! ([`Windows::trim`]). By then every step of window `w + 1`'s predecessor
//! has been claimed, and at a prefetch depth of at most a window's steps,
//! every step drawing from window `w` has been delivered (a claim is at
//! most the depth ahead of the consumer). Released at the end of the load of
//! `w + 1` instead, a window whose last steps were claimed but not yet
//! gathered lost records to the race with a fast load (read again from disk,
//! one by one). A gather still copying from a released window holds the
//! slabs it reads ([`Loaded`], taken once per gather), so its bytes stay
//! valid and charged until it ends; a record looked up after its window's
//! release is not found and is read from disk like any other. Each window's
//! index is built before it is published and never changed after, so
//! lookups take no lock: a gather takes the list of windows (a short lock,
//! once per gather, never held by the loading thread while it reads), then
//! searches it freely.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustc_hash::FxBuildHasher;

use crate::format::record::Entry;
use crate::io::slab::Slab;
use crate::memory::cache::{Cache, RecordKey};

/// Windows a store keeps loaded (module docs).
pub(crate) const KEEP: usize = 2;

/// A slab charged to a record cache while it lives (module docs).
struct Held {
    /// `None` only once dropped.
    slab: Option<Slab>,
    cache: Arc<Cache>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.slab.as_ref().map_or(&[], Slab::as_ref)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(slab) = self.slab.take() {
            // Still charged: kept for the next window's reads, or released.
            self.cache.put_spare(slab);
        }
    }
}

/// `slab`, whose capacity the caller charged to `cache` ([`Cache::hold`]),
/// frozen: the charge is released with its last reference (or kept with
/// the slab for the next window's reads, [`Cache::put_spare`]).
pub(crate) fn held(cache: &Arc<Cache>, slab: Slab) -> Bytes {
    Bytes::from_owner(Held { slab: Some(slab), cache: Arc::clone(cache) })
}

/// One loaded window: its slabs and where each record lies in them.
#[derive(Default)]
pub(crate) struct Window {
    slabs: Vec<Bytes>,
    /// Record key → (slab, offset of its stored bytes in it).
    at: HashMap<RecordKey, (u32, u32), FxBuildHasher>,
}

impl Window {
    /// Adds a held slab; returns its number for [`Window::add`].
    pub fn slab(&mut self, bytes: Bytes) -> u32 {
        self.slabs.push(bytes);
        (self.slabs.len() - 1) as u32
    }

    /// Record `e`'s stored bytes start `at` bytes into slab `slab`.
    pub fn add(&mut self, e: &Entry, slab: u32, at: usize) {
        debug_assert!(at + e.stored_len as usize <= self.slabs[slab as usize].len());
        self.at.insert(RecordKey::of(e), (slab, at as u32));
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.slabs.is_empty()
    }

    /// Record `e`'s stored bytes, if this window holds them.
    pub fn get(&self, e: &Entry) -> Option<&[u8]> {
        let &(slab, at) = self.at.get(&RecordKey::of(e))?;
        let at = at as usize;
        self.slabs[slab as usize].get(at..at + e.stored_len as usize)
    }
}

/// The windows one gather searches, taken once ([`Windows::loaded`]).
#[derive(Default)]
pub(crate) struct Loaded(Vec<Arc<Window>>);

impl Loaded {
    /// Record `e`'s stored bytes, newest window first.
    pub fn get(&self, e: &Entry) -> Option<&[u8]> {
        self.0.iter().rev().find_map(|w| w.get(e))
    }
}

/// A store's loaded windows (module docs).
#[derive(Default)]
pub(crate) struct Windows {
    list: Mutex<Vec<Arc<Window>>>,
    /// Whether `list` is not empty: gathers of a store that never loaded a
    /// window take no lock.
    any: AtomicBool,
}

impl Windows {
    /// The windows loaded now, for one gather to search.
    pub fn loaded(&self) -> Loaded {
        if !self.any.load(Relaxed) {
            return Loaded::default();
        }
        Loaded(self.lock().clone())
    }

    /// Publishes `w` (module docs: it is released by a later [`Windows::trim`]).
    pub fn publish(&self, w: Window) {
        if w.is_empty() {
            return;
        }
        self.lock().push(Arc::new(w));
        self.any.store(true, Relaxed);
    }

    /// Releases the windows beyond the newest [`KEEP`], before the next load.
    pub fn trim(&self) {
        let old: Vec<Arc<Window>> = {
            let mut list = self.lock();
            let over = list.len().saturating_sub(KEEP);
            list.drain(..over).collect()
        };
        // Freed outside the lock: releasing a window frees its slabs.
        drop(old);
    }

    /// Releases the oldest window; `false` when there is none.
    pub fn release_oldest(&self) -> bool {
        let old = {
            let mut list = self.lock();
            if list.is_empty() {
                return false;
            }
            let w = list.remove(0);
            self.any.store(!list.is_empty(), Relaxed);
            w
        };
        drop(old);
        true
    }

    /// Releases every window.
    pub fn clear(&self) {
        let old = std::mem::take(&mut *self.lock());
        self.any.store(false, Relaxed);
        drop(old);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Window>>> {
        // Nothing panics while the list is changed.
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    /// `slab` held in `cache` as the loads hold it, or `None`.
    fn hold(cache: &Arc<Cache>, slab: Slab) -> Option<Bytes> {
        let bytes = slab.as_ref().len() as u64;
        cache.hold(bytes).then(|| held(cache, slab))
    }

    use super::*;
    use crate::format::codec::Codec;
    use crate::format::record::ChunkId;
    use crate::memory::cache::{charge, Key, NextUse, StoreId};

    fn entry(offset: u64, len: u32) -> Entry {
        Entry {
            chunk: ChunkId(0),
            offset,
            stored_len: len,
            logical_len: len,
            checksum: Some(offset as u32),
            codec: Codec::Raw,
            within: 0,
        }
    }

    fn slab_of(bytes: &[u8]) -> Slab {
        let mut s = Slab::take_aligned(bytes.len());
        s.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        s
    }

    /// A held slab is charged its whole capacity while any record sliced
    /// from it lives, evicting cached records for room, and released with
    /// its last reference.
    #[test]
    fn a_held_slab_is_charged_while_any_record_of_it_lives() {
        let cache = Arc::new(Cache::new(1 << 20));
        let store = StoreId { dev: 1, ino: 1, born: None };
        for i in 0..100 {
            cache.insert(Key::new(store, &entry(i * 100_000, 12_288)), &[1; 12_288], NextUse::Unknown);
        }
        let full = cache.stats();
        assert_eq!(full.entries, (1 << 20) / charge(12_288));
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let held = hold(&cache, slab_of(&data)).expect("room is made by evicting records");
        let cap = held.len() as u64;
        assert!(cap >= 200_000);
        let s = cache.stats();
        assert!(s.entries < full.entries, "records were evicted for the slab");
        assert_eq!(s.charged, s.entries * charge(12_288) + cap);
        let record = held.slice(1000..13_288);
        let ptr = held.as_ptr();
        drop(held);
        assert_eq!(cache.stats().charged, s.charged, "a live record keeps its whole slab charged");
        assert_eq!(&record[..], &data[1000..13_288]);
        drop(record);
        // Kept, still charged, for the next window's reads; released by its taker.
        assert_eq!(cache.stats().charged, s.charged);
        let spare = cache.take_spare(cap as usize).expect("the released slab is kept as a spare");
        assert_eq!(spare.as_ref().as_ptr(), ptr);
        cache.unhold(cap);
        drop(spare);
        assert_eq!(cache.stats().charged, s.entries * charge(12_288), "the slab's charge is released");
        // A spare slab goes before any record when room is needed.
        let again = hold(&cache, slab_of(&data)).unwrap();
        drop(again);
        let before = cache.stats();
        assert_eq!(before.held, cap);
        let more = hold(&cache, slab_of(&data[..100_000])).unwrap();
        assert_eq!(cache.stats().entries, before.entries, "the spare slab made the room, no record was evicted");
        assert!(cache.take_spare(cap as usize).is_none());
        drop(more);
        // Larger than the whole capacity: not held, nothing charged or evicted.
        let before = cache.stats();
        assert!(hold(&cache, slab_of(&vec![0; 2 << 20])).is_none());
        assert_eq!(cache.stats(), before);
    }

    /// A gather that took the windows before a release still reads the
    /// released window's records; one that looks afterwards finds only the
    /// newest windows; the released slabs' charge goes with the last reader.
    #[test]
    fn a_record_held_past_its_windows_release_stays_correct() {
        let cache = Arc::new(Cache::new(64 << 20));
        let windows = Windows::default();
        let payload = |w: u64| -> Vec<u8> { (0..100_000u64).map(|i| ((i * 7 + w * 13) % 253) as u8).collect() };
        let mut entries = Vec::new();
        for w in 0..3u64 {
            let data = payload(w);
            let mut win = Window::default();
            let slab = win.slab(hold(&cache, slab_of(&data)).unwrap());
            let e = entry(w * 1_000_000 + 4096, 12_288);
            win.add(&e, slab, 4096);
            entries.push(e);
            if w == 1 {
                // A gather takes the windows 0 and 1, then window 2 is
                // published and window 0 released.
                let taken = windows.loaded();
                windows.publish(win);
                windows.trim();
                let before = cache.stats().charged;
                let mut next = Window::default();
                let data2 = payload(2);
                let slab2 = next.slab(hold(&cache, slab_of(&data2)).unwrap());
                next.add(&entry(2 * 1_000_000 + 4096, 12_288), slab2, 4096);
                // The next load begins by releasing window 0.
                windows.publish(next);
                assert!(windows.loaded().get(&entries[0]).is_some(), "kept until the next load begins");
                windows.trim();
                let got = taken.get(&entries[0]).expect("the gather's windows still hold window 0");
                assert_eq!(got, &payload(0)[4096..4096 + 12_288]);
                assert!(windows.loaded().get(&entries[0]).is_none(), "window 0 was released");
                assert!(cache.stats().charged > before, "window 2 is charged");
                let taken_ptr = got.as_ptr();
                drop(taken);
                let spare = cache.take_spare(128 << 10).expect("window 0's slab came back with its last reader");
                assert_eq!(spare.as_ref()[4096..].as_ptr(), taken_ptr);
                cache.unhold(128 << 10);
                break;
            }
            windows.publish(win);
        }
        let now = windows.loaded();
        assert_eq!(now.get(&entries[1]).unwrap(), &payload(1)[4096..4096 + 12_288]);
        assert!(now.get(&entry(5, 12_288)).is_none());
        drop(now);
        windows.clear();
        while cache.take_spare(128 << 10).is_some() {
            cache.unhold(128 << 10);
        }
        assert_eq!(cache.stats().charged, 0, "every slab released");
    }
}
