//! Datasets of parts: a folder of ordinary stores and a manifest that lists
//! the committed ones in order, read as one index space.
//!
//! A dataset too large for one writer is written in parts, each by its own
//! process (a Ray or Spark task, a `multiprocessing` worker), each part an
//! ordinary store in its own directory. The dataset is the list of parts its
//! manifest names; a part is readable as a dataset of its own too.
//!
//! # The manifest
//!
//! `manifest.json` at the dataset's root, with a CRC-32C member first as
//! `schema.json` has (`format/schema.rs`):
//!
//! ```text
//! {
//!   "crc32c": "1a2b3c4d",
//!   "format": "zring-parts",
//!   "version": 1,
//!   "generation": 3,
//!   "schema": { ...the parts' schema.json members... } or null,
//!   "parts": [
//!     {"dir": "parts/p-000000-<id>", "records": 1000, "content": "5f3a9c01"},
//!     ...
//!   ]
//! }
//! ```
//!
//! `generation` counts the commits. `dir` is relative to the dataset's root;
//! `records` and `content` are the part's [`Fingerprint`] when it was
//! committed. `schema` is what every part's `schema.json` holds, but for its
//! `"codec"` member (parts may be written with different codecs).
//!
//! A commit replaces the manifest atomically (written beside it, synced,
//! renamed over it, the directory synced). An *append* commit lists the old
//! parts first, in the same order, with the same fingerprints: the dataset
//! only grows, so a loader state saved over one generation resumes over a
//! later one ([`Parts::extends`]). Only an explicit overwrite writes a list
//! that is not a continuation of the old one.
//!
//! # Reading
//!
//! [`Parts::open`] reads the manifest and opens every part once to check it:
//! a part missing, not a store, holding other records than the manifest says
//! (its fingerprint differs) or described by another schema is an error
//! naming its directory; nothing is skipped. Record `i` of the dataset is
//! record `i - start(k)` of part `k`, found by binary search over the
//! parts' cumulative counts ([`Parts::locate`]).
//!
//! A hot random batch touches a couple of hundred parts. What it reads of
//! each is kept in arrays of the dataset, not in each part's objects (its
//! store, snapshot, table, chunk: scattered allocations, each a cache miss
//! per part touched): the small parts' table entries, copied while the
//! dataset opens (`Dense`), and each open part's chunk mapping, a cache
//! line per part in the open set (`Open::maps`, `crate::io::mapset`), taken
//! out when the part closes for room and put back when it opens again.
//!
//! Each open store holds two descriptors (its table and its pins file), and
//! its chunk files' descriptors live in the process's shared cache
//! (`io/fds.rs`). So the parts are kept open in a bounded set, least
//! recently used out: [`open_capacity`] stores, an eighth of the soft
//! `RLIMIT_NOFILE` in descriptors. A part evicted is opened again (and its
//! fingerprint checked again) when next read; a gather in flight keeps the
//! store it uses.
//!
//! The dataset's fingerprint is its record count and a CRC-32C over the
//! parts' fingerprints in order ([`Parts::fingerprint`]), so it changes when
//! any part does, and a dataset grown by an append commit
//! [extends](Parts::extends) the one before.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::crc::crc32c_append;
use crate::format::fingerprint::Fingerprint;
use crate::read::request::{Gather, Slots};
use crate::store::{Store, View};

/// The manifest's file name, at the dataset's root.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The manifest's `format` member.
const FORMAT: &str = "zring-parts";
/// The manifest version this build writes and reads.
const VERSION: u64 = 1;
/// The content of a dataset of no parts ("ZRPT" read as a number).
const SEED: u32 = 0x5450_525a;

/// One committed part as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEntry {
    /// The part's store directory, relative to the dataset's root.
    pub dir: String,
    /// Records in the part.
    pub records: u64,
    /// The part's fingerprint content, 8 lower-case hex digits.
    pub content: String,
}

impl PartEntry {
    /// The entry of a part whose fingerprint is `fp`.
    pub fn new(dir: impl Into<String>, fp: Fingerprint) -> PartEntry {
        PartEntry { dir: dir.into(), records: fp.records, content: format!("{:08x}", fp.content) }
    }

    /// The fingerprint the entry records.
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        let content =
            u32::from_str_radix(&self.content, 16).ok().filter(|_| self.content.len() == 8).ok_or_else(|| {
                Error::InvalidArgument(format!("part {}: content {:?} is not 8 hex digits", self.dir, self.content))
            })?;
        Ok(Fingerprint { records: self.records, content })
    }
}

/// The manifest of a dataset of parts (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"zring-parts"`.
    pub format: String,
    /// The manifest version.
    pub version: u64,
    /// Commits so far (the first commit writes 1).
    pub generation: u64,
    /// The parts' `schema.json` members but `"codec"`, or `null` for raw
    /// stores.
    pub schema: Value,
    /// The committed parts, in order.
    pub parts: Vec<PartEntry>,
}

impl Manifest {
    /// A manifest of `parts` at `generation`.
    pub fn new(generation: u64, schema: Value, parts: Vec<PartEntry>) -> Manifest {
        Manifest { format: FORMAT.into(), version: VERSION, generation, schema, parts }
    }

    /// Records in all parts.
    pub fn records(&self) -> u64 {
        self.parts.iter().map(|p| p.records).sum()
    }
}

/// Whether `dir` holds a dataset of parts (a manifest).
pub fn is_parts(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// The manifest of the dataset at `dir`, checked against its checksum.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NotAStore {
                path: dir.to_path_buf(),
                reason: format!("no {MANIFEST_FILE}: not a dataset of parts (commit parts to make one)"),
            })
        }
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    // Only a commit writes the manifest: one edited or damaged is restored,
    // never repaired in place (its parts are still there).
    const RESTORE: &str = "restore manifest.json from a copy or undo the edit (only zring.parts.commit \
                           writes it; the parts it lists are unchanged)";
    let bad = |detail: String| corrupted(path.display().to_string(), format!("{detail}; {RESTORE}"));
    let text = crate::format::schema::decode(&path, &bytes).map_err(|e| match e {
        Error::Corrupted { detail, .. } => bad(detail),
        other => other,
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| bad(format!("not a manifest: {e}")))?;
    if m.format != FORMAT {
        return Err(bad(format!("format {:?}, expected {FORMAT:?}", m.format)));
    }
    if m.version != VERSION {
        return Err(Error::UnsupportedVersion { path, found: m.version as u32, supported: VERSION as u32 });
    }
    for p in &m.parts {
        p.fingerprint().map_err(|e| bad(e.to_string()))?;
        if !relative_inside(&p.dir) {
            return Err(bad(format!("part directory {:?} is not a relative path inside the dataset", p.dir)));
        }
    }
    Ok(m)
}

/// Whether `dir` is a relative path that stays inside the dataset.
fn relative_inside(dir: &str) -> bool {
    let p = Path::new(dir);
    !dir.is_empty() && p.components().all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Replaces the manifest of the dataset at `dir` with `parts` in one atomic
/// rename, and returns the manifest written. With `replace` false (an
/// append), the current manifest's parts must be the first of `parts`, in
/// order and with the same fingerprints; with `replace` any list goes (an
/// overwrite). Every part is opened and must hold the records its entry
/// says, and have the schema `schema`. The generation is the current one
/// plus one. The caller serialises commits (one driver commits).
pub fn commit_manifest(dir: &Path, schema: Value, parts: Vec<PartEntry>, replace: bool) -> Result<Manifest> {
    let old = match read_manifest(dir) {
        Ok(m) => Some(m),
        Err(Error::NotAStore { .. }) => None,
        Err(e) => return Err(e),
    };
    if let (Some(old), false) = (&old, replace) {
        let keeps = old.parts.len() <= parts.len() && old.parts.iter().zip(&parts).all(|(a, b)| a == b);
        if !keeps {
            return Err(Error::InvalidArgument(format!(
                "an append to {} must list its {} committed parts first, unchanged; use an overwrite to replace them",
                dir.display(),
                old.parts.len()
            )));
        }
        if !old.parts.is_empty() && old.schema != schema {
            return Err(Error::InvalidArgument(format!(
                "the parts appended to {} have schema {schema}, the dataset has {}",
                dir.display(),
                old.schema
            )));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (k, p) in parts.iter().enumerate() {
        if !relative_inside(&p.dir) {
            return Err(Error::InvalidArgument(format!(
                "part {k}: {:?} is not a relative path inside the dataset",
                p.dir
            )));
        }
        if !seen.insert(p.dir.as_str()) {
            return Err(Error::InvalidArgument(format!("part {:?} is listed twice", p.dir)));
        }
        check_part(dir, k, p, Some(&schema))?;
    }
    let generation = old.as_ref().map_or(0, |m| m.generation) + 1;
    let m = Manifest::new(generation, schema, parts);
    let body = serde_json::to_string_pretty(&m).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let bytes = crate::format::schema::encode(&(body + "\n"))?;
    replace_file(dir, MANIFEST_FILE, &bytes)?;
    Ok(m)
}

/// Writes `name` in `dir` as a new file beside it, synced, renamed over
/// the old one, the directory synced.
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let dst = dir.join(name);
    let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(bytes).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("sync", &tmp))?;
    drop(f);
    if let Err(e) = std::fs::rename(&tmp, &dst) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("rename", &dst)(e));
    }
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))
}

/// The schema a part's `schema.json` text describes, as a manifest keeps
/// it: every member but `"codec"`; `null` for a store without one.
pub fn schema_of(text: Option<&str>, path: &Path) -> Result<Value> {
    let Some(text) = text else { return Ok(Value::Null) };
    let mut v: Value = serde_json::from_str(text)
        .map_err(|e| corrupted(path.join("schema.json").display().to_string(), format!("not JSON: {e}")))?;
    if let Value::Object(m) = &mut v {
        m.remove("codec");
    }
    Ok(v)
}

/// Opens part `k` (entry `p`) of the dataset at `root` read-only and checks
/// it against its entry and, when given, `schema`.
fn check_part(root: &Path, k: usize, p: &PartEntry, schema: Option<&Value>) -> Result<Store> {
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
fn dropped(root: &Path, generation: u64, dir: &str, err: Error) -> Error {
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
/// own parts: each part in manifest order goes to the rank with the fewest
/// records so far (the lowest such rank on a tie). Deterministic, within
/// one part's records of balanced, and prefix-stable: parts appended later
/// never move an earlier part, so each rank's parts after an append commit
/// are its parts before plus some new ones, and a state saved over a rank's
/// parts resumes over them grown.
pub fn assign_ranks(records: &[u64], ranks: u32) -> Vec<u32> {
    let mut load = vec![0u64; ranks.max(1) as usize];
    records
        .iter()
        .map(|&r| {
            let k = (0..load.len()).min_by_key(|&k| (load[k], k)).expect("at least one rank");
            load[k] += r;
            k as u32
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
struct Open {
    slots: Vec<Option<Arc<OpenPart>>>,
    count: usize,
    /// Each open part's one chunk mapping, when its entries are in the
    /// dataset's copy ([`Dense`]) and it reads through its mappings: what a
    /// hot gather reads of each part it touches, one cache line per part in
    /// one array, the mapping's owner kept beside it
    /// (`read::gather::gather_mapped`). A part closed for room leaves it.
    maps: crate::io::mapset::MapSet,
    /// The dictionary of each part in `maps`, if it has one.
    dicts: Vec<Option<Arc<crate::format::codec::Dict>>>,
}

/// An open dataset of parts (module docs).
pub struct Parts {
    root: PathBuf,
    manifest: Manifest,
    /// Each part's number in the manifest on disk (all of them, or a
    /// rank's: [`Parts::open_rank`]).
    numbers: Vec<usize>,
    /// `ends[k]`: records in parts `0..=k`.
    ends: Vec<u64>,
    fingerprints: Vec<Fingerprint>,
    open: RwLock<Open>,
    /// The first part's `schema.json` text, read when the dataset was opened
    /// (a later overwrite commit may remove the part's folder).
    schema_text: Option<String>,
    /// Each part's last use, by [`Parts::clock`].
    stamps: Vec<AtomicU64>,
    /// Each part's records copied from its mappings by [`Parts::gather`]
    /// and not yet counted into its store's reads: one array for the
    /// dataset, so a gather touching hundreds of parts adds to a few
    /// cache lines, and each part's counters are updated every
    /// few dozen of its records (`read::gather::count_mapped`).
    pending: Vec<AtomicU64>,
    /// Whether each part was read ahead whole on its first cold record
    /// (`read::gather::gather_over`): once per part while the dataset is
    /// open, however often the part is closed and opened again.
    ahead: Vec<AtomicBool>,
    /// Whether each part's store copies records from its mappings, set
    /// when it opens ([`View::maps`]): what a gather asks of every part it
    /// touches, kept here so that it reads no part's store for it.
    mapped: Vec<AtomicBool>,
    clock: AtomicU64,
    capacity: usize,
    /// Small parts' table entries, copied when the dataset opened.
    dense: Option<Dense>,
}

/// Records a dataset copies the table entries of into one array ([`Dense`])
/// at most: [`DENSE_BYTES`] each, 128 MiB.
const DENSE_MAX_RECORDS: u64 = 1 << 22;
/// A part's table is copied when it holds at most this many records.
const DENSE_PART_MAX: u64 = 1 << 16;
/// Bytes of a record's entry in [`Dense`]: `offset u56 | codec u8`,
/// `chunk u32`, `stored u32`, `logical u32`, `crc u32`, `within u32`, `0 u32`,
/// little-endian (two to a cache line).
const DENSE_BYTES: usize = 32;

/// The table entries of a dataset's small parts, copied into one array
/// indexed by the dataset's record index when the dataset opened, each
/// checked then as every read checks it ([`crate::snapshot::Snapshot::entry`]:
/// its own checksum, or its table page's, and the chunk bytes it names). A
/// random gather over a thousand parts then finds each record's entry with
/// one load from one array (on huge pages where the kernel gives them),
/// instead of each part's snapshot, table and table page: those are
/// scattered allocations and a small mapping per part, and each part touched
/// cost a translation miss of its own. A committed part does not change, so
/// the copy holds for the dataset's life; a part opened again whose chunks
/// differ is read through its table again. Every record's own checksum is
/// still checked on every read.
struct Dense {
    bytes: memmap2::Mmap,
    /// Whether each part's entries are in `bytes`.
    ok: Vec<AtomicBool>,
    /// Each part's `(chunk_base, chunks)` when it was copied.
    shape: Vec<(u32, usize)>,
}

impl Dense {
    /// Record `i`'s entry (its part's entries are in the array).
    #[inline]
    fn entry(&self, i: u64) -> Option<crate::format::record::Entry> {
        let b = self.bytes.get(i as usize * DENSE_BYTES..)?.get(..DENSE_BYTES)?;
        let w = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let off = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        Some(crate::format::record::Entry {
            chunk: crate::format::record::ChunkId(w(8)),
            offset: off & ((1 << 56) - 1),
            stored_len: w(12),
            logical_len: w(16),
            checksum: Some(w(20)),
            codec: crate::format::codec::Codec::from_tag((off >> 56) as u8)?,
            within: w(24),
        })
    }

    /// Copies the entries of `snap` (part `k`, whose first record is
    /// `start`) into `bytes`; false, with nothing to rely on, when an entry
    /// fails its checks or has no form here (no checksum: loaderx):
    /// the part is then read through its table, which reports it.
    fn copy(bytes: &mut [u8], start: u64, snap: &crate::snapshot::Snapshot) -> bool {
        for i in 0..snap.records() {
            let Ok(e) = snap.entry(i) else { return false };
            let (Some(crc), true) = (e.checksum, e.offset < 1 << 56) else {
                return false;
            };
            let b = &mut bytes[(start + i) as usize * DENSE_BYTES..][..DENSE_BYTES];
            b[..8].copy_from_slice(&(e.offset | (e.codec as u64) << 56).to_le_bytes());
            b[8..12].copy_from_slice(&e.chunk.0.to_le_bytes());
            b[12..16].copy_from_slice(&e.stored_len.to_le_bytes());
            b[16..20].copy_from_slice(&e.logical_len.to_le_bytes());
            b[20..24].copy_from_slice(&crc.to_le_bytes());
            b[24..28].copy_from_slice(&e.within.to_le_bytes());
        }
        true
    }
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
        if let Some((rank, ranks)) = rank {
            let records: Vec<u64> = manifest.parts.iter().map(|p| p.records).collect();
            let owner = assign_ranks(&records, ranks);
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
        let mut parts = Parts {
            root,
            manifest,
            numbers,
            ends,
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
                    if snap.records() == p.records && Dense::copy(bytes, start, snap) {
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
    fn map_part(&self, open: &mut Open, k: usize) {
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Open> {
        self.open.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Open> {
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
    fn parts_of(&self, ks: &[usize]) -> Result<Vec<Arc<OpenPart>>> {
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

    /// Reads the records of `req` into `dst` as [`Store::gather`] does,
    /// `req.indices` being indices of the dataset, with the same checks
    /// (every index, entry and slot, the checksum of every record read).
    ///
    /// A batch touching many parts is one gather (`read::gather::gather_over`):
    /// the records are located and checked in one pass; those in memory
    /// are copied straight from their part's mappings (with the decode pool
    /// for a batch worth it) and counted into the dataset's pending counts,
    /// each part's reads counted every few hundred of its records; the
    /// other records of parts read buffered go out in one batch of reads
    /// for all parts; a part read through its record cache, and a part's
    /// share large enough for the decode pool, are read as that store's
    /// gather reads them. The parts are taken
    /// open (opened if need be) a few at a time, at most a quarter of the
    /// open set at once; a call over more parts than that checks and reads
    /// one group of parts after the other, so an error in a later group can
    /// come after an earlier group's slots were written.
    pub fn gather(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<()> {
        if self.gather_hot(req, dst)? {
            return Ok(());
        }
        let n = req.indices.len();
        let mut located = Vec::with_capacity(n);
        for &i in req.indices {
            located.push(self.locate(i)?);
        }
        // The parts touched, in order, and the slot of each record's part.
        let mut touched: Vec<usize> = located.iter().map(|&(k, _)| k).collect();
        touched.sort_unstable();
        touched.dedup();
        // Every record's entry from the dataset's copy, when all its parts
        // are in it (`Dense`).
        let dense: Option<Vec<crate::format::record::Entry>> = self.dense.as_ref().and_then(|d| {
            touched.iter().all(|&k| d.ok[k].load(Relaxed)).then(|| req.indices.iter().map(|&i| d.entry(i)).collect())?
        });
        let group = (self.capacity / 4).max(1);
        if touched.len() <= group {
            let at: Vec<(usize, u64)> =
                located.iter().map(|&(k, l)| (touched.binary_search(&k).expect("touched"), l)).collect();
            {
                // Every part open (the usual case): read under the open
                // set's lock taken shared, no reference count touched.
                let _gate = crate::fork::enter();
                let open = self.read();
                let held: Option<Vec<&OpenPart>> =
                    touched.iter().map(|&k| open.slots.get(k).and_then(Option::as_deref)).collect();
                if let Some(held) = held {
                    let now = self.clock.load(Relaxed);
                    for &k in &touched {
                        self.stamps[k].store(now, Relaxed);
                    }
                    let sources = self.sources(&held, &touched);
                    let dense = dense.as_deref().map(|entries| crate::read::gather::Dense { entries });
                    return crate::read::gather::gather_over(&sources, &at, dense, req, dst);
                }
            }
            let open = self.parts_of(&touched)?;
            let held: Vec<&OpenPart> = open.iter().map(|p| &**p).collect();
            let sources = self.sources(&held, &touched);
            let dense = dense.as_deref().map(|entries| crate::read::gather::Dense { entries });
            return crate::read::gather::gather_over(&sources, &at, dense, req, dst);
        }
        // More parts than a group: each group's records as a gather of
        // their own, into the slots the caller gave them.
        let (starts, width) = match req.slots {
            Slots::Fixed(stride) => {
                if Some(dst.len()) != n.checked_mul(stride) {
                    return Err(Error::InvalidArgument(format!(
                        "gather: destination is {} bytes, expected {n} indices × stride {stride}",
                        dst.len()
                    )));
                }
                ((0..n as u64).map(|k| k * stride as u64).collect::<Vec<_>>(), Some(stride))
            }
            Slots::Ragged(starts) => (starts.to_vec(), None),
            Slots::FixedAt { width, starts } => (starts.to_vec(), Some(width)),
        };
        if starts.len() != n || !(req.next.is_empty() || req.next.len() == n) {
            return Err(Error::InvalidArgument(format!(
                "gather: {n} indices but {} slot starts and {} next-use hints",
                starts.len(),
                req.next.len()
            )));
        }
        for parts in touched.chunks(group) {
            let open = self.parts_of(parts)?;
            let held: Vec<&OpenPart> = open.iter().map(|p| &**p).collect();
            let sources = self.sources(&held, parts);
            let (mut idx, mut at, mut st, mut next) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut ents = Vec::new();
            for (p, &(k, l)) in located.iter().enumerate() {
                if let Ok(slot) = parts.binary_search(&k) {
                    if let Some(d) = &dense {
                        ents.push(d[p]);
                    }
                    idx.push(req.indices[p]);
                    at.push((slot, l));
                    st.push(starts[p]);
                    if !req.next.is_empty() {
                        next.push(req.next[p]);
                    }
                }
            }
            let slots = match width {
                Some(width) => Slots::FixedAt { width, starts: &st },
                None => Slots::Ragged(&st),
            };
            let g = Gather { indices: &idx, slots, next: &next, fan_out: req.fan_out };
            let dense = dense.as_ref().map(|_| crate::read::gather::Dense { entries: &ents });
            crate::read::gather::gather_over(&sources, &at, dense, &g, dst)?;
        }
        Ok(())
    }

    /// [`Parts::gather`] of records all in memory, of parts whose entries
    /// are in the dataset's copy ([`Dense`]) and whose mappings the open set
    /// keeps ([`Open::maps`]): each record's entry from the copy, its
    /// mapping from the open set's array, read under the open set's lock
    /// taken shared (`read::gather::gather_mapped`). `Ok(false)`, nothing
    /// counted, when that does not apply to every record (a part closed, a
    /// page not in memory, a record failing its checks): the caller reads
    /// the request the general way, which reports what failed.
    fn gather_hot(&self, req: &Gather<'_>, dst: &mut [u8]) -> Result<bool> {
        let Some(d) = &self.dense else { return Ok(false) };
        let _gate = crate::fork::enter();
        let open = self.read();
        let mut located = Vec::with_capacity(req.indices.len());
        for &i in req.indices {
            let (k, _) = self.locate(i)?;
            // The entry's and the part's lines, loaded while the next are located.
            if let Some(b) = d.bytes.get(i as usize * DENSE_BYTES) {
                crate::io::mmap::prefetch_line(b);
            }
            open.maps.prefetch_line(k);
            located.push(k);
        }
        let mut recs = Vec::with_capacity(req.indices.len());
        for (&i, &k) in req.indices.iter().zip(&located) {
            let Some(e) = d.entry(i).filter(|_| d.ok[k].load(Relaxed)) else { return Ok(false) };
            recs.push((k, e));
        }
        let flush = |k: usize| {
            if let Some(p) = &open.slots[k] {
                crate::read::gather::flush_mapped(&self.source(p, k));
            }
        };
        if crate::read::gather::gather_mapped(&open.maps, &open.dicts, &recs, &self.pending, &flush, req, dst).is_none()
        {
            return Ok(false);
        }
        let now = self.clock.load(Relaxed);
        for &k in &located {
            if self.stamps[k].load(Relaxed) != now {
                self.stamps[k].store(now, Relaxed);
            }
        }
        Ok(true)
    }

    /// What a gather reads parts `ks` with, `held[j]` being part `ks[j]`
    /// open: of each part, its snapshot and the dataset's own arrays, not its
    /// store (out of the CPU cache for most of hundreds of parts; read only
    /// for what records not in memory need).
    fn sources<'a>(&'a self, held: &[&'a OpenPart], ks: &[usize]) -> Vec<crate::read::gather::Source<'a>> {
        held.iter().zip(ks).map(|(p, &k)| self.source(p, k)).collect()
    }

    fn source<'a>(&'a self, p: &'a OpenPart, k: usize) -> crate::read::gather::Source<'a> {
        p.view.source(&self.pending[k], &self.ahead[k], &self.mapped[k])
    }

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
    fn fingerprint_of_first(&self, n: usize) -> Fingerprint {
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
        let n = self.ends.partition_point(|&e| e < earlier.records);
        n < self.part_count() && self.ends[n] == earlier.records && self.fingerprint_of_first(n + 1) == earlier
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dataset of six raw parts of 20 records each in `root`, record `i`
    /// (`record(i)`) at global index `i`.
    fn six_parts(root: &Path, record: impl Fn(u32) -> Vec<u8>) {
        let entries: Vec<PartEntry> = (0..6u32)
            .map(|k| {
                let name = format!("p{k}");
                let store = Store::builder(root.join(&name)).codec(crate::format::codec::Codec::Raw).create().unwrap();
                let data: Vec<Vec<u8>> = (k * 20..k * 20 + 20).map(&record).collect();
                store.append(&data.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
                store.sync().unwrap();
                PartEntry::new(name, store.fingerprint().unwrap())
            })
            .collect();
        commit_manifest(root, Value::Null, entries, false).unwrap();
    }

    fn part(root: &Path, name: &str, recs: std::ops::Range<u32>) -> PartEntry {
        let store = Store::builder(root.join(name)).create().unwrap();
        let data: Vec<Vec<u8>> = recs.map(|i| i.to_le_bytes().to_vec()).collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        store.append(&refs, None).unwrap();
        store.sync().unwrap();
        PartEntry::new(name, store.fingerprint().unwrap())
    }

    #[test]
    fn indices_map_to_parts_and_the_manifest_only_grows() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let a = part(root, "a", 0..10);
        let b = part(root, "b", 10..13);
        let m = commit_manifest(root, Value::Null, vec![a.clone(), b.clone()], false).unwrap();
        assert_eq!(m.generation, 1);
        let parts = Parts::open_with_capacity(root, 1).unwrap();
        assert_eq!(parts.len(), 13);
        assert_eq!(parts.locate(0).unwrap(), (0, 0));
        assert_eq!(parts.locate(9).unwrap(), (0, 9));
        assert_eq!(parts.locate(10).unwrap(), (1, 0));
        assert_eq!(parts.locate(12).unwrap(), (1, 2));
        assert!(matches!(parts.locate(13), Err(Error::IndexOutOfRange { index: 13, len: 13 })));
        // One store open at a time: part 1 is opened on demand.
        let s = parts.store(1).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(parts.open_stores().len(), 1);
        let before = parts.fingerprint();

        // An append must keep the old parts first.
        let c = part(root, "c", 13..20);
        let err = commit_manifest(root, Value::Null, vec![b.clone(), a.clone(), c.clone()], false).unwrap_err();
        assert!(err.to_string().contains("must list its 2 committed parts first"), "{err}");
        let m = commit_manifest(root, Value::Null, vec![a.clone(), b.clone(), c.clone()], false).unwrap();
        assert_eq!(m.generation, 2);
        let grown = Parts::open(root).unwrap();
        assert_eq!(grown.len(), 20);
        assert!(grown.extends(before));
        assert!(!grown.extends(Fingerprint { records: 10, content: before.content }));
        // An overwrite that drops a part is not a continuation.
        commit_manifest(root, Value::Null, vec![b.clone(), c.clone()], true).unwrap();
        assert!(!Parts::open(root).unwrap().extends(before));
    }

    #[test]
    fn a_gather_over_parts_reads_each_record_into_its_slot_and_checks_slots_across_parts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let entries: Vec<PartEntry> = (0..12u32).map(|k| part(root, &format!("p{k}"), k * 5..k * 5 + 5)).collect();
        commit_manifest(root, Value::Null, entries, false).unwrap();
        let idx: Vec<u64> = (0..200u64).map(|i| (i * 37 + 11) % 60).collect();
        let want: Vec<u8> = idx.iter().flat_map(|&i| (i as u32).to_le_bytes()).collect();
        // All parts in one group (capacity 64), and a group of one part at a time (capacity 2).
        for capacity in [64, 2] {
            let parts = Parts::open_with_capacity(root, capacity).unwrap();
            let mut dst = vec![0xffu8; idx.len() * 4];
            parts.gather(&Gather::fixed(&idx, 4), &mut dst).unwrap();
            assert_eq!(dst, want, "capacity {capacity}");
            // Ragged slots in reverse order, and fixed slots wider than the records.
            let starts: Vec<u64> = (0..idx.len() as u64).rev().map(|k| k * 4).collect();
            let mut dst = vec![0u8; idx.len() * 4];
            parts.gather(&Gather::ragged(&idx, &starts), &mut dst).unwrap();
            let back: Vec<u8> = idx.iter().rev().flat_map(|&i| (i as u32).to_le_bytes()).collect();
            assert_eq!(dst, back);
            let mut dst = vec![0xffu8; 2 * 8];
            parts.gather(&Gather::fixed(&[59, 0], 8), &mut dst).unwrap();
            assert_eq!(dst, [59, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        let parts = Parts::open(root).unwrap();
        // Two records of different parts in overlapping slots: refused, nothing written.
        let mut dst = vec![7u8; 8];
        let err = parts.gather(&Gather::ragged(&[1, 58], &[0, 2]), &mut dst).unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{err}");
        assert_eq!(dst, [7u8; 8]);
        assert!(matches!(
            parts.gather(&Gather::fixed(&[60], 4), &mut [0u8; 4]),
            Err(Error::IndexOutOfRange { index: 60, len: 60 })
        ));
        assert!(matches!(parts.gather(&Gather::fixed(&[3], 2), &mut [0u8; 2]), Err(Error::RecordSize { .. })));
    }

    /// Parts each compressed with their own dictionary: a gather across them
    /// decodes every record with its own part's dictionary (each part's is
    /// taken once per gather, not per record), and a dictionary's record in a
    /// part of another is never decoded with the wrong one.
    #[test]
    fn a_gather_over_parts_decodes_each_record_with_its_parts_dictionary() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let record = |k: u32, i: u32| -> Vec<u8> {
            let word = format!("part{k}-{}-", ["alpha", "beta", "gamma"][k as usize % 3]);
            let mut r: Vec<u8> = word.bytes().cycle().take(600).collect();
            r.extend_from_slice(&i.to_le_bytes());
            r
        };
        let entries: Vec<PartEntry> = (0..3u32)
            .map(|k| {
                let name = format!("d{k}");
                let store = Store::builder(root.join(&name)).create().unwrap();
                let data: Vec<Vec<u8>> = (0..64).map(|i| record(k, i)).collect();
                let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                assert!(store.train_dict(&refs, 4 << 10).unwrap() > 0);
                store.append(&refs, Some(crate::format::codec::Codec::ZstdDict)).unwrap();
                store.sync().unwrap();
                assert!(store.stats().unwrap().zstd_dict_records > 0);
                PartEntry::new(name, store.fingerprint().unwrap())
            })
            .collect();
        commit_manifest(root, Value::Null, entries, false).unwrap();
        let parts = Parts::open(root).unwrap();
        let idx: Vec<u64> = (0..192u64).map(|i| (i * 37 + 5) % 192).collect();
        let starts: Vec<u64> = (0..idx.len() as u64).map(|k| k * 604).collect();
        for _ in 0..2 {
            let mut dst = vec![0u8; idx.len() * 604];
            parts.gather(&Gather::ragged(&idx, &starts), &mut dst).unwrap();
            for (k, &i) in idx.iter().enumerate() {
                assert_eq!(dst[k * 604..][..604], record((i / 64) as u32, (i % 64) as u32)[..], "record {i}");
            }
        }
    }

    /// Small parts' entries are copied into the dataset's array when it opens
    /// (`Dense`): a gather reads them from there, each record still checked
    /// against its checksum on every read, and a damaged record or table
    /// entry is an error naming its part.
    #[test]
    fn a_gather_over_parts_reads_entries_from_the_datasets_copy_and_names_a_damaged_part() {
        if !crate::env::parts_dense() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let record = |i: u32| -> Vec<u8> { (0..100u32).map(|b| (i * 13 + b) as u8).collect() };
        six_parts(root, record);
        let idx: Vec<u64> = (0..300u64).map(|i| (i * 53 + 7) % 120).collect();
        let want: Vec<u8> = idx.iter().flat_map(|&i| record(i as u32)).collect();
        // Every part open, and one part open at a time (parts closed and opened again).
        for capacity in [64, 1] {
            let parts = Parts::open_with_capacity(root, capacity).unwrap();
            let d = parts.dense.as_ref().expect("small parts are copied");
            assert!(d.ok.iter().all(|ok| ok.load(Relaxed)));
            for _ in 0..2 {
                let mut dst = vec![0u8; idx.len() * 100];
                parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
                assert_eq!(dst, want, "capacity {capacity}");
            }
        }
        // A record's bytes damaged after the dataset opened: still checked.
        let parts = Parts::open(root).unwrap();
        let chunk = root.join("p2").join(crate::format::names::chunk_name(
            crate::format::table::Format::Native,
            crate::format::record::ChunkId(0),
        ));
        let mut bytes = std::fs::read(&chunk).unwrap();
        bytes[5 * 100 + 3] ^= 0x10;
        std::fs::write(&chunk, &bytes).unwrap();
        let err = parts.gather(&Gather::fixed(&[45], 100), &mut [0u8; 100]).unwrap_err();
        assert!(matches!(&err, Error::ChecksumMismatch { record: 5, .. }), "{err}");
        assert!(err.to_string().contains("p2"), "{err}");
        let mut dst = vec![0u8; 100];
        parts.gather(&Gather::fixed(&[46], 100), &mut dst).unwrap();
        assert_eq!(dst, record(46));
        bytes[5 * 100 + 3] ^= 0x10;
        std::fs::write(&chunk, &bytes).unwrap();
        // A table entry damaged before the dataset opens: the part is not
        // copied, and reading the entry is an error naming its table.
        let table = std::fs::read_dir(root.join("p4"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("table-"))
            .unwrap();
        let mut t = std::fs::read(&table).unwrap();
        let n = t.len();
        t[n - 32 * 3 + 9] ^= 0x01;
        std::fs::write(&table, &t).unwrap();
        match Parts::open(root) {
            Ok(parts) => {
                assert!(!parts.dense.as_ref().unwrap().ok[4].load(Relaxed));
                assert!(parts.dense.as_ref().unwrap().ok[3].load(Relaxed));
                let err = parts.gather(&Gather::fixed(&[97], 100), &mut [0u8; 100]).unwrap_err();
                assert!(matches!(&err, Error::Corrupted { .. }), "{err}");
                assert!(err.to_string().contains("p4"), "{err}");
            }
            Err(err) => assert!(err.to_string().contains("p4"), "{err}"),
        }
    }

    /// A hot gather reads each part's mapping from the open set's array
    /// (`Open::maps`): a part closed for room leaves it (its mapping unmapped,
    /// not kept by the array), a part opened again is put back with its new
    /// mapping, and every gather after reads the right records through it.
    #[test]
    fn a_hot_gather_follows_parts_closed_and_opened_again_in_the_open_sets_mappings() {
        if !crate::env::parts_dense() || !crate::io::mmap::allowed() || crate::env::direct().is_some() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let record = |i: u32| -> Vec<u8> { (0..100u32).map(|b| (i * 7 + b * 3) as u8).collect() };
        six_parts(root, record);
        // The chunk files of part `k` mapped in this process now.
        let mapped = |k: usize| {
            let needle = format!("{}/", root.join(format!("p{k}")).display());
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| l.contains(&needle) && l.contains("chunk-"))
                .count()
        };
        let served = || crate::read::gather::MAPPED_GATHERS.with(std::cell::Cell::get);
        for capacity in [1, 2, 64] {
            let parts = Parts::open_with_capacity(root, capacity).unwrap();
            for (round, &k) in [0usize, 1, 0, 2, 3, 0, 5, 4, 0, 1].iter().enumerate() {
                let idx: Vec<u64> = (0..40u64).map(|j| k as u64 * 20 + (j * 7 + round as u64) % 20).collect();
                let want: Vec<u8> = idx.iter().flat_map(|&i| record(i as u32)).collect();
                for _ in 0..2 {
                    let before = served();
                    let mut dst = vec![0u8; idx.len() * 100];
                    parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
                    assert_eq!(dst, want, "capacity {capacity}, part {k}, round {round}");
                    let open = parts.read();
                    assert!(open.slots[k].is_some());
                    assert_eq!(open.maps.shape(k).map(|(_, len)| len), Some(20 * 100), "part {k} is in the array");
                    let in_array: Vec<usize> = (0..6).filter(|&j| open.maps.shape(j).is_some()).collect();
                    assert!(in_array.iter().all(|&j| open.slots[j].is_some()), "a closed part left the array");
                    assert!(in_array.len() <= capacity);
                    drop(open);
                    // Part k open and in the array: this gather or the one
                    // before it took the hot path (the first may have opened it).
                    if served() == before {
                        let mut dst = vec![0u8; idx.len() * 100];
                        parts.gather(&Gather::fixed(&idx, 100), &mut dst).unwrap();
                        assert_eq!(dst, want);
                        assert_eq!(served(), before + 1, "a hot gather of an open part takes the array's mapping");
                    }
                }
                if capacity == 1 {
                    // The other parts closed: their mappings are gone too.
                    assert!((0..6).filter(|&j| j != k).all(|j| mapped(j) == 0), "a closed part stays mapped");
                    assert_eq!(mapped(k), 1);
                }
            }
        }
    }

    /// A cold record of a small part read buffered brings its whole part into
    /// the page cache (as the kernel's readahead does in one large file);
    /// a part nothing was read from stays out.
    #[test]
    fn a_cold_record_of_a_small_part_reads_the_part_ahead_whole() {
        if crate::env::direct().is_some() {
            return; // ZRING_DIRECT forces a mode: nothing is read ahead.
        }
        let dir = tempfile::tempdir_in(crate::io::disk_scratch_dir()).unwrap();
        let root = dir.path();
        let record = |i: u32| -> Vec<u8> { (0..1024).map(|b| (i as usize * 7 + b) as u8).collect() };
        let entries: Vec<PartEntry> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let store = Store::builder(root.join(name)).codec(crate::format::codec::Codec::Raw).create().unwrap();
                let data: Vec<Vec<u8>> = (k as u32 * 64..k as u32 * 64 + 64).map(record).collect();
                store.append(&data.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
                store.sync().unwrap();
                PartEntry::new(*name, store.fingerprint().unwrap())
            })
            .collect();
        commit_manifest(root, Value::Null, entries, false).unwrap();
        let chunk = |name: &str| {
            let path = root.join(name).join(crate::format::names::chunk_name(
                crate::format::table::Format::Native,
                crate::format::record::ChunkId(0),
            ));
            let f = std::fs::File::open(path).unwrap();
            let len = f.metadata().unwrap().len() as usize;
            (f, len)
        };
        let parts = Parts::open(root).unwrap();
        for name in ["a", "b"] {
            let (f, len) = chunk(name);
            assert!(len >= 64 * 1024);
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            assert!(!crate::io::mmap::file_resident(&f, len), "posix_fadvise(DONTNEED) dropped nothing");
        }
        let mut dst = vec![0u8; 1024];
        parts.gather(&Gather::fixed(&[5], 1024), &mut dst).unwrap();
        assert_eq!(dst, record(5));
        let (a, a_len) = chunk("a");
        // The readahead runs without the gather waiting for it.
        let t = std::time::Instant::now();
        while !crate::io::mmap::file_resident(&a, a_len) {
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "part a was not read ahead whole");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (b, b_len) = chunk("b");
        assert!(!crate::io::mmap::file_resident(&b, b_len), "part b was read ahead though nothing was read of it");
    }

    #[test]
    fn ranks_get_balanced_prefix_stable_parts_and_need_only_theirs() {
        assert_eq!(assign_ranks(&[10, 3, 3, 3, 3, 1], 2), vec![0, 1, 1, 1, 1, 0]);
        let before = assign_ranks(&[5, 9, 2, 7], 3);
        assert_eq!(assign_ranks(&[5, 9, 2, 7, 4, 4, 8], 3)[..4], before[..]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let entries: Vec<PartEntry> =
            (0..5u32).map(|k| part(root, &format!("p{k}"), k * 10..k * 10 + 10 - k)).collect();
        commit_manifest(root, Value::Null, entries, false).unwrap();
        // Records 10, 9, 8, 7, 6: loads 10/0, 10/9, 10/17, 17/17, then the tie goes to rank 0.
        let owner = assign_ranks(&[10, 9, 8, 7, 6], 2);
        assert_eq!(owner, vec![0, 1, 1, 0, 0]);
        // Rank 1 reads with rank 0's parts gone.
        for k in [0, 3, 4] {
            std::fs::remove_dir_all(root.join(format!("p{k}"))).unwrap();
        }
        let r1 = Parts::open_rank(root, 1, 2).unwrap();
        assert_eq!((r1.part_count(), r1.len(), r1.number(1)), (2, 17, 2));
        assert!(r1.store(1).unwrap().path().ends_with("p2"));
        let err = Parts::open_rank(root, 0, 2).unwrap_err();
        assert!(matches!(&err, Error::NotAStore { path, .. } if path.ends_with("p0")), "{err}");
        assert!(err.to_string().contains("part 0 "), "{err}");
        assert!(Parts::open_rank(root, 2, 2).is_err());
    }

    #[test]
    fn a_missing_changed_or_other_schema_part_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let a = part(root, "a", 0..10);
        let b = part(root, "b", 10..13);
        commit_manifest(root, Value::Null, vec![a.clone(), b.clone()], false).unwrap();
        // Changed after its commit.
        let w = Store::builder(root.join("b")).open_writable().unwrap();
        w.append(&[&b"x"[..]], None).unwrap();
        w.sync().unwrap();
        drop(w);
        let err = Parts::open(root).unwrap_err();
        assert!(matches!(&err, Error::Corrupted { what, .. } if what.ends_with("b")), "{err}");
        assert!(err.to_string().contains("part 1 holds 4 records"), "{err}");
        // Missing.
        std::fs::remove_dir_all(root.join("b")).unwrap();
        let err = Parts::open(root).unwrap_err();
        assert!(matches!(&err, Error::NotAStore { path, .. } if path.ends_with("b")), "{err}");
        // Another schema.
        let c = part(root, "c", 0..2);
        Store::builder(root.join("c")).open_writable().unwrap().set_schema("{\"dtype\": \"<f4\"}").unwrap();
        let err = commit_manifest(root, Value::Null, vec![a, c], true).unwrap_err();
        assert!(err.to_string().contains("part 1 has schema"), "{err}");
        // A damaged manifest.
        let p = root.join(MANIFEST_FILE);
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 4;
        std::fs::write(&p, &bytes).unwrap();
        assert!(matches!(read_manifest(root), Err(Error::Corrupted { .. })));
    }
}
