//! The open set of a dataset's parts: opening a dataset (every part
//! checked), locating a record's part, and the parts kept open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};

use serde_json::Value;

use super::dense::{Dense, DENSE_BYTES, DENSE_MAX_RECORDS, DENSE_PART_MAX};
use super::manifest::{read_manifest, schema_of, Manifest, PartEntry, MANIFEST_FILE, SEED};
use crate::error::{corrupted, Error, Result};
use crate::format::crc::crc32c_append;
use crate::format::fingerprint::Fingerprint;
use crate::store::{Store, View};

/// Opens part `k` (entry `p`) of the dataset at `root` read-only and checks
/// it against its entry and, when given, `schema`.
pub(super) fn check_part(root: &Path, k: usize, p: &PartEntry, schema: Option<&Value>) -> Result<Store> {
    let path = root.join(&p.dir);
    let restore = || {
        format!(
            "restore the folder {} from a copy (`zring parts {}` lists every part the manifest names)",
            p.dir,
            root.display()
        )
    };
    let store = Store::builder(&path).open().map_err(|e| match e {
        Error::NotAStore { reason, .. } => Error::NotAStore {
            path: path.clone(),
            reason: format!(
                "part {k} of the dataset {} is missing or damaged ({reason}); {}",
                root.display(),
                restore()
            ),
        },
        Error::Corrupted { what, detail } => Error::Corrupted {
            what,
            detail: format!("{detail} (part {k} of the dataset {}; {})", root.display(), restore()),
        },
        other => other,
    })?;
    let want = p.fingerprint()?;
    let got = store.fingerprint()?;
    if got != want {
        return Err(corrupted(
            path.display().to_string(),
            format!(
                "part {k} holds {} records (content {:08x}) but the manifest lists {} (content {:08x}): it was replaced \
                 or changed after its commit; restore it, or commit the dataset again",
                got.records, got.content, want.records, want.content
            ),
        ));
    }
    let Some(schema) = schema else { return Ok(store) };
    let s = schema_of(store.schema()?.as_deref(), &path)?;
    if &s != schema {
        return Err(corrupted(
            path.display().to_string(),
            format!(
                "part {k} has schema {s}, the dataset's other parts {schema}: its dtype or shape differs; write it \
                 again with theirs (a part a commit refuses stays staged)"
            ),
        ));
    }
    Ok(store)
}

/// `err`, the error opening part `dir` of the dataset at `root` as its
/// manifest of `generation` lists it, or a [`Error::Stale`] when the part is
/// missing (or was removed while it was being opened) because a later
/// commit (an overwrite) no longer lists it: the
/// handle reads a generation that is gone, and is to be opened again.
pub(super) fn dropped(root: &Path, generation: u64, dir: &str, err: Error) -> Error {
    // Missing, or removed while it was being opened (its schema.json gone).
    if !matches!(err, Error::NotAStore { .. }) && root.join(dir).exists() {
        return err;
    }
    match read_manifest(root) {
        Ok(now) if now.generation != generation && !now.parts.iter().any(|p| p.dir == dir) => Error::Stale {
            path: root.to_path_buf(),
            detail: format!(
                "part {dir} of manifest generation {generation}, which this handle reads, was removed by a later \
                 commit (mode=\"overwrite\", generation {})",
                now.generation
            ),
        },
        _ => err,
    }
}

/// The rank that reads each part when `ranks` ranks each read only their
/// own parts: each part in manifest order goes to the rank with the least
/// weight so far (the lowest such rank on a tie), a part weighing what
/// [`placement_weights`](super::placement_weights) says (its decoded bytes,
/// or its records in older manifests). Deterministic, within one part's
/// weight of balanced, and prefix-stable: parts appended later
/// never move an earlier part, so each rank's parts after an append commit
/// are its parts before plus some new ones, and a state saved over a rank's
/// parts resumes over them grown.
pub fn assign_ranks(weights: &[u64], ranks: u32) -> Vec<u32> {
    // The ranks by (load, rank), least first: O(log ranks) a part.
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32)>> =
        (0..ranks.max(1)).map(|k| std::cmp::Reverse((0, k))).collect();
    weights
        .iter()
        .map(|&r| {
            let std::cmp::Reverse((load, k)) = heap.pop().expect("at least one rank");
            heap.push(std::cmp::Reverse((load.saturating_add(r), k)));
            k
        })
        .collect()
}

/// Stores a dataset keeps open at most: an eighth of the soft
/// `RLIMIT_NOFILE` in descriptors, two per store, at least 4.
pub fn open_capacity() -> usize {
    (crate::io::fds::nofile_limit() / 16).clamp(4, 1 << 20) as usize
}

/// An open part: its store, and the one snapshot of it every read uses
/// (a committed part does not change).
pub struct OpenPart {
    /// The part's store, open read-only.
    pub store: Arc<Store>,
    /// A view of it, taken when it was opened.
    pub view: View,
}

/// The parts open now: a slot per part, and how many are filled.
pub(super) struct Open {
    pub(super) slots: Vec<Option<Arc<OpenPart>>>,
    pub(super) count: usize,
    /// Each open part's one chunk mapping, when its entries are in the
    /// dataset's copy ([`Dense`]) and it reads through its mappings: what a
    /// hot gather reads of each part it touches, one cache line per part in
    /// one array, the mapping's owner kept beside it
    /// (`read::gather::gather_mapped`). A part closed for room leaves it.
    pub(super) maps: crate::io::mapset::MapSet,
    /// The dictionary of each part in `maps`, if it has one.
    pub(super) dicts: Vec<Option<Arc<crate::format::codec::Dict>>>,
}

/// An open dataset of parts (module docs).
pub struct Parts {
    pub(super) root: PathBuf,
    pub(super) manifest: Manifest,
    /// Each part's number in the manifest on disk (all of them, or a
    /// rank's: [`Parts::open_rank`]).
    pub(super) numbers: Vec<usize>,
    /// `ends[k]`: records in parts `0..=k`.
    pub(super) ends: Vec<u64>,
    /// Each part's first record's index in the whole dataset (all the
    /// manifest's parts), which a rank's view of it does not hold.
    pub(super) whole_starts: Vec<u64>,
    /// Records in the whole dataset.
    pub(super) whole_len: u64,
    pub(super) fingerprints: Vec<Fingerprint>,
    pub(super) open: RwLock<Open>,
    /// The first part's `schema.json` text, read when the dataset was opened
    /// (a later overwrite commit may remove the part's folder).
    pub(super) schema_text: Option<String>,
    /// Each part's last use, by [`Parts::clock`].
    pub(super) stamps: Vec<AtomicU64>,
    /// Each part's records copied from its mappings by [`Parts::gather`]
    /// and not yet counted into its store's reads: one array for the
    /// dataset, so a gather touching hundreds of parts adds to a few
    /// cache lines, and each part's counters are updated every
    /// few dozen of its records (`read::gather::count_mapped`).
    pub(super) pending: Vec<AtomicU64>,
    /// Whether each part was read ahead whole on its first cold record
    /// (`read::gather::gather_over`): once per part while the dataset is
    /// open, however often the part is closed and opened again.
    pub(super) ahead: Vec<AtomicBool>,
    /// Whether each part's store copies records from its mappings, set
    /// when it opens ([`View::maps`]): what a gather asks of every part it
    /// touches, kept here so that it reads no part's store for it.
    pub(super) mapped: Vec<AtomicBool>,
    pub(super) clock: AtomicU64,
    pub(super) capacity: usize,
    /// Small parts' table entries, copied when the dataset opened.
    pub(super) dense: Option<Dense>,
    /// What fills the parts' files before they are read, for a dataset
    /// whose files are a cache of object storage ([`Parts::set_fill`]).
    pub(super) fill: std::sync::OnceLock<Arc<dyn super::fill::Fill>>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("root", &self.root)
            .field("parts", &self.manifest.parts.len())
            .field("records", &self.len())
            .finish()
    }
}

impl Parts {
    /// Opens the dataset at `dir` and checks every part (module docs).
    pub fn open(dir: impl AsRef<Path>) -> Result<Parts> {
        Parts::open_with_capacity(dir, open_capacity())
    }

    /// [`Parts::open`] keeping at most `capacity` stores open (at least 1).
    pub fn open_with_capacity(dir: impl AsRef<Path>, capacity: usize) -> Result<Parts> {
        Parts::open_selected(dir, capacity, None)
    }

    /// Opens only the parts of rank `rank` of `ranks` ([`assign_ranks`]):
    /// the dataset they make, in manifest order; the other parts need not
    /// be on this host. `manifest()` then lists those parts only.
    pub fn open_rank(dir: impl AsRef<Path>, rank: u32, ranks: u32) -> Result<Parts> {
        if ranks == 0 || rank >= ranks {
            return Err(Error::InvalidArgument(format!("rank {rank} of {ranks}: need 0 <= rank < ranks")));
        }
        Parts::open_selected(dir, open_capacity(), Some((rank, ranks)))
    }

    /// Opens the dataset (or a rank's parts of it). A part missing because an
    /// overwrite commit dropped it between reading the manifest and opening
    /// the part is no damage: the open starts again from the new manifest.
    fn open_selected(dir: impl AsRef<Path>, capacity: usize, rank: Option<(u32, u32)>) -> Result<Parts> {
        let mut tries = 0;
        loop {
            match Parts::open_once(dir.as_ref(), capacity, rank) {
                Err(Error::Stale { .. }) if tries < 8 => tries += 1,
                other => return other,
            }
        }
    }

    fn open_once(dir: &Path, capacity: usize, rank: Option<(u32, u32)>) -> Result<Parts> {
        let root = dir.to_path_buf();
        let mut manifest = read_manifest(&root)?;
        let mut numbers: Vec<usize> = (0..manifest.parts.len()).collect();
        let mut whole = Vec::with_capacity(manifest.parts.len());
        let mut whole_len = 0u64;
        for p in &manifest.parts {
            whole.push(whole_len);
            whole_len = whole_len.saturating_add(p.records);
        }
        if let Some((rank, ranks)) = rank {
            let owner = assign_ranks(&super::placement_weights(&manifest), ranks);
            numbers.retain(|&k| owner[k] == rank);
            manifest.parts = numbers.iter().map(|&k| manifest.parts[k].clone()).collect();
        }
        let mut ends = Vec::with_capacity(manifest.parts.len());
        let mut fingerprints = Vec::with_capacity(manifest.parts.len());
        let mut total = 0u64;
        for p in &manifest.parts {
            total = total
                .checked_add(p.records)
                .ok_or_else(|| corrupted(root.join(MANIFEST_FILE).display().to_string(), "more than 2^64 records"))?;
            ends.push(total);
            fingerprints.push(p.fingerprint()?);
        }
        let capacity = capacity.max(1);
        let n = manifest.parts.len();
        let whole_starts = numbers.iter().map(|&k| whole[k]).collect();
        let mut parts = Parts {
            root,
            manifest,
            numbers,
            ends,
            whole_starts,
            whole_len,
            fingerprints,
            open: RwLock::new(Open {
                slots: vec![None; n],
                count: 0,
                maps: crate::io::mapset::MapSet::new(&[]),
                dicts: vec![None; n],
            }),
            schema_text: None,
            stamps: (0..n).map(|_| AtomicU64::new(0)).collect(),
            pending: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ahead: (0..n).map(|_| AtomicBool::new(false)).collect(),
            mapped: (0..n).map(|_| AtomicBool::new(false)).collect(),
            clock: AtomicU64::new(0),
            capacity,
            dense: None,
            fill: std::sync::OnceLock::new(),
        };
        let mut schema_text = None;
        // The small parts' entries, copied as each part is checked (`Dense`).
        let mut dense = (crate::env::parts_dense()
            && total <= DENSE_MAX_RECORDS
            && parts.manifest.parts.iter().any(|p| p.records <= DENSE_PART_MAX))
        .then(|| memmap2::MmapMut::map_anon(total as usize * DENSE_BYTES).ok())
        .flatten()
        .map(|m| {
            let _ = m.advise(memmap2::Advice::HugePage);
            (m, vec![false; n], vec![(0u32, 0usize); n])
        });
        // The length of each copied part's one chunk: the room its slot of
        // the open set's mappings takes.
        let mut lens = vec![0u64; n];
        {
            let mut open = parts.write();
            for (k, p) in parts.manifest.parts.iter().enumerate() {
                let store = check_part(&parts.root, parts.numbers[k], p, Some(&parts.manifest.schema))
                    .map_err(|e| dropped(&parts.root, parts.manifest.generation, &p.dir, e))?;
                if k == 0 {
                    schema_text = store.schema()?;
                }
                let store = Arc::new(store);
                if let Some((bytes, ok, shape)) = dense.as_mut().filter(|_| p.records <= DENSE_PART_MAX) {
                    let view = store.view();
                    let snap = view.source(&parts.pending[k], &parts.ahead[k], &parts.mapped[k]).snap;
                    let start = if k == 0 { 0 } else { parts.ends[k - 1] };
                    // Copied only where the entries cost at most half the
                    // bytes they index: a part of tiny records (labels) is
                    // read through its table, whose pages the kernel may
                    // drop, rather than held twice over in the dataset's
                    // anonymous memory.
                    let stored: u64 = snap.chunks.iter().map(|c| c.len).sum();
                    let worth = stored >= p.records.saturating_mul(2 * DENSE_BYTES as u64);
                    if worth && snap.records() == p.records && Dense::copy(bytes, start, snap) {
                        ok[k] = true;
                        shape[k] = (snap.chunk_base, snap.chunks.len());
                        if let [c] = &snap.chunks[..] {
                            lens[k] = c.len;
                        }
                    }
                }
                if open.count < capacity {
                    let view = store.view();
                    parts.mapped[k].store(view.maps(), Relaxed);
                    open.slots[k] = Some(Arc::new(OpenPart { store, view }));
                    open.count += 1;
                }
            }
        }
        parts.schema_text = schema_text;
        parts.dense = dense.and_then(|(bytes, ok, shape)| {
            Some(Dense {
                bytes: bytes.make_read_only().ok()?,
                ok: ok.into_iter().map(AtomicBool::new).collect(),
                shape,
            })
        });
        if parts.dense.is_some() {
            let mut open = parts.open.write().unwrap_or_else(PoisonError::into_inner);
            open.maps = crate::io::mapset::MapSet::new(&lens);
            for k in 0..n {
                parts.map_part(&mut open, k);
            }
        }
        Ok(parts)
    }

    /// Puts open part `k`'s chunk mapping in the open set's array
    /// ([`Open::maps`]), mapping it now if need be, when its entries are in
    /// the dataset's copy and it reads through its mappings; else leaves its
    /// slot empty (its records are read the general way).
    pub(super) fn map_part(&self, open: &mut Open, k: usize) {
        open.maps.remove(k);
        open.dicts[k] = None;
        let copied = self.dense.as_ref().is_some_and(|d| d.ok[k].load(Relaxed));
        let Some(part) = open.slots[k].as_ref().filter(|_| copied && self.mapped[k].load(Relaxed)) else {
            return;
        };
        let snap = self.source(part, k).snap;
        if let [c] = &snap.chunks[..] {
            if !c.direct && c.mapping().is_some() && open.maps.install(k, &c.map, snap.chunk_base) {
                open.dicts[k] = snap.dict.clone();
            }
        }
    }

    /// The first part's `schema.json` text as it was when the dataset was
    /// opened (every part's, but for its codec), or `None`.
    pub fn schema_text(&self) -> Option<&str> {
        self.schema_text.as_deref()
    }

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, Open> {
        self.open.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Open> {
        self.open.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The dataset's directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Part `k`'s number in the manifest on disk (`k` itself unless the
    /// dataset was opened for a rank).
    pub fn number(&self, k: usize) -> usize {
        self.numbers[k]
    }

    /// Part `k`'s first record's index in the whole dataset: its start
    /// when all parts are open, else the records of the manifest's parts
    /// before it (what splits over the whole dataset key on).
    pub fn whole_start(&self, k: usize) -> u64 {
        self.whole_starts[k]
    }

    /// Records in the whole dataset (every part the manifest listed at
    /// open), whether or not this handle opened them all.
    pub fn whole_len(&self) -> u64 {
        self.whole_len
    }

    /// The manifest read at open (only the rank's parts, for
    /// [`Parts::open_rank`]).
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Records in all parts.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether the dataset holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parts in the dataset.
    pub fn part_count(&self) -> usize {
        self.ends.len()
    }

    /// The first index of part `k` in the dataset.
    pub fn start(&self, k: usize) -> u64 {
        if k == 0 {
            0
        } else {
            self.ends[k - 1]
        }
    }

    /// Records in part `k`.
    pub fn part_records(&self, k: usize) -> u64 {
        self.manifest.parts[k].records
    }

    /// Part `k`'s directory.
    pub fn part_path(&self, k: usize) -> PathBuf {
        self.root.join(&self.manifest.parts[k].dir)
    }

    /// The part that holds record `index` and its index there, or
    /// [`Error::IndexOutOfRange`]. O(log parts).
    pub fn locate(&self, index: u64) -> Result<(usize, u64)> {
        if index >= self.len() {
            return Err(Error::IndexOutOfRange { index, len: self.len() });
        }
        // Parts of about equal sizes (the usual case) put the record near
        // `index / len` of the way through them: a few steps from there,
        // else a binary search.
        let n = self.ends.len();
        let mut k = ((u128::from(index) * n as u128) / u128::from(self.len())) as usize;
        let mut steps = 0;
        loop {
            if self.ends[k] <= index {
                k += 1;
            } else if k > 0 && self.ends[k - 1] > index {
                k -= 1;
            } else {
                break;
            }
            steps += 1;
            if steps == 4 {
                k = self.ends.partition_point(|&e| e <= index);
                break;
            }
        }
        Ok((k, index - self.start(k)))
    }

    /// Part `k`, opened (and checked against its entry) if it is not open
    /// now, the part used longest ago closing to make room. A hit takes the
    /// open set's lock shared.
    pub fn part(&self, k: usize) -> Result<Arc<OpenPart>> {
        if k >= self.part_count() {
            return Err(Error::InvalidArgument(format!("part {k} of a dataset of {} parts", self.part_count())));
        }
        // Inside the fork gate (`fork.rs`): a child never inherits the open
        // set's lock held by another thread.
        let _gate = crate::fork::enter();
        if let Some(p) = &self.read().slots[k] {
            self.stamps[k].store(self.clock.load(Relaxed), Relaxed);
            return Ok(Arc::clone(p));
        }
        // The clock ticks at each open only, so a hit writes no shared line
        // but its own stamp: the part used longest ago is the one whose last
        // use came before the most opens.
        let now = self.clock.fetch_add(1, Relaxed) + 1;
        // Checked whole at open; a part opened again is checked for its records.
        let entry = &self.manifest.parts[k];
        let store = check_part(&self.root, self.numbers[k], entry, None)
            .map_err(|e| dropped(&self.root, self.manifest.generation, &entry.dir, e))?;
        let store = Arc::new(store);
        let view = store.view();
        let part = Arc::new(OpenPart { store, view });
        let mut open = self.write();
        if let Some(p) = &open.slots[k] {
            // Another thread opened it meanwhile: use that one.
            return Ok(Arc::clone(p));
        }
        while open.count >= self.capacity {
            let oldest = (0..open.slots.len())
                .filter(|&j| open.slots[j].is_some())
                .min_by_key(|&j| self.stamps[j].load(Relaxed))
                .expect("a full open set");
            open.maps.remove(oldest);
            open.dicts[oldest] = None;
            if let Some(p) = open.slots[oldest].take() {
                crate::read::gather::flush_mapped(&self.source(&p, oldest));
            }
            open.count -= 1;
        }
        self.mapped[k].store(part.view.maps(), Relaxed);
        let snap = part.view.source(&self.pending[k], &self.ahead[k], &self.mapped[k]).snap;
        if let Some(d) = &self.dense {
            if d.shape[k] != (snap.chunk_base, snap.chunks.len()) {
                d.ok[k].store(false, Relaxed);
            }
        }
        open.slots[k] = Some(Arc::clone(&part));
        open.count += 1;
        self.map_part(&mut open, k);
        self.stamps[k].store(now, Relaxed);
        Ok(part)
    }

    /// Parts `ks`, each as [`Parts::part`] takes it; those open taken
    /// under one hold of the open set's lock.
    pub(super) fn parts_of(&self, ks: &[usize]) -> Result<Vec<Arc<OpenPart>>> {
        let _gate = crate::fork::enter();
        let mut got: Vec<Option<Arc<OpenPart>>> = Vec::with_capacity(ks.len());
        {
            let open = self.read();
            let now = self.clock.load(Relaxed);
            for &k in ks {
                let p = open.slots.get(k).and_then(Option::as_ref).map(Arc::clone);
                if p.is_some() {
                    self.stamps[k].store(now, Relaxed);
                }
                got.push(p);
            }
        }
        ks.iter().zip(got).map(|(&k, p)| p.map_or_else(|| self.part(k), Ok)).collect()
    }

    /// `f` of part `k`, opened as [`Parts::part`] opens it; when the part
    /// is open, under the open set's lock taken shared, with no reference
    /// count touched.
    pub fn with_part<R>(&self, k: usize, f: impl FnOnce(&OpenPart) -> R) -> Result<R> {
        let _gate = crate::fork::enter();
        {
            let open = self.read();
            if let Some(p) = open.slots.get(k).and_then(Option::as_ref) {
                self.stamps[k].store(self.clock.load(Relaxed), Relaxed);
                return Ok(f(p));
            }
        }
        let part = self.part(k)?;
        Ok(f(&part))
    }
}

impl Parts {
    /// The store of part `k` ([`Parts::part`]).
    pub fn store(&self, k: usize) -> Result<Arc<Store>> {
        Ok(Arc::clone(&self.part(k)?.store))
    }

    /// An open part, any (the first open slot), or part 0 opened when none
    /// is: what stands for all parts in what a store says of its reads
    /// (read policy, hints), without opening a part for the question.
    pub fn any_part(&self) -> Result<Option<Arc<OpenPart>>> {
        let _gate = crate::fork::enter();
        if let Some(p) = self.read().slots.iter().flatten().next() {
            return Ok(Some(Arc::clone(p)));
        }
        if self.part_count() == 0 {
            return Ok(None);
        }
        self.part(0).map(Some)
    }

    /// Stores open now (at most the capacity), each with every record
    /// gathered from it counted into its read statistics
    /// ([`Store::read_stats`]; [`Parts::gather`] counts the records it
    /// copies from a part's mappings every few dozen).
    pub fn open_stores(&self) -> Vec<Arc<Store>> {
        let _gate = crate::fork::enter();
        let open = self.read();
        for (k, p) in open.slots.iter().enumerate() {
            if let Some(p) = p {
                crate::read::gather::flush_mapped(&self.source(p, k));
            }
        }
        open.slots.iter().flatten().map(|p| Arc::clone(&p.store)).collect()
    }

    /// The fingerprint of parts `0..n`: their records, and a CRC-32C over
    /// each part's fingerprint in order.
    pub(super) fn fingerprint_of_first(&self, n: usize) -> Fingerprint {
        let mut content = SEED;
        for fp in &self.fingerprints[..n] {
            let mut b = [0u8; 12];
            b[..8].copy_from_slice(&fp.records.to_le_bytes());
            b[8..].copy_from_slice(&fp.content.to_le_bytes());
            content = crc32c_append(content, &b);
        }
        Fingerprint { records: if n == 0 { 0 } else { self.ends[n - 1] }, content }
    }

    /// The dataset's fingerprint (module docs). O(parts).
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint_of_first(self.part_count())
    }

    /// Whether the dataset's first `earlier.records` records are those of
    /// the dataset `earlier` was taken of: its parts are this dataset's
    /// first ones, unchanged (an append commit grew it).
    pub fn extends(&self, earlier: Fingerprint) -> bool {
        if earlier.records == 0 {
            return earlier.content == SEED;
        }
        // Parts of no records (an empty input file's) share their end with
        // the part before: `earlier` may have been taken after any of them.
        let first = self.ends.partition_point(|&e| e < earlier.records);
        (first..self.part_count())
            .take_while(|&n| self.ends[n] == earlier.records)
            .any(|n| self.fingerprint_of_first(n + 1) == earlier)
    }
}
