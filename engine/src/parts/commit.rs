//! The one owner of a dataset of parts' files: staging a part, committing
//! staged parts, and removing what is no longer wanted.
//!
//! # The folder
//!
//! ```text
//! corpus/
//!   manifest.json         the committed parts, in order (manifest.rs)
//!   .commit.lock          one commit at a time (flock)
//!   parts/<name>/         one store per committed part
//!   staging/<name>/       written, not yet committed
//!   .job-<J>.lock         held (shared) while job J lives
//!   dropped/<name>        marks parts/<name>, dropped by an overwrite
//! ```
//!
//! Every file and folder is reached through the dataset folder's
//! descriptor ([`Dir`]): `staging`, `parts` and `dropped` are opened with
//! `O_NOFOLLOW` (a link planted at one of their names is refused, naming
//! it), staged parts are opened and moved by descriptor and checked to be
//! the directory that was validated, the manifest is read without following
//! a link or waiting on a FIFO, and written as a new file made with
//! `O_EXCL` and renamed over the old one. Files and folders get modes from
//! the dataset folder's ([`crate::io::fs::file_mode`]), so a commit works
//! for every member of a group that may write the folder.
//!
//! # The commit
//!
//! Under the dataset's lock, a commit
//! 1. reads the manifest: one that is missing while `parts/` holds part
//!    folders, or that does not read, is an error, never a new dataset;
//! 2. returns to `staging/` the part folders a commit that died moved into
//!    `parts/` before its manifest (listed by no manifest, marked by no
//!    overwrite);
//! 3. checks every part it is given: staged as a real directory (or
//!    listed already: a retried commit), holding the records its
//!    fingerprint says and the schema of the others;
//! 4. moves the staged parts into `parts/` (`RENAME_NOREPLACE`, each
//!    checked after the move to be the folder checked), marks the parts an
//!    overwrite drops, and
//! 5. replaces the manifest in one rename: the **commit point**. Before it,
//!    a failure leaves the manifest as it was (the moved parts are returned
//!    to `staging/` now, or by the next commit); from it on, the commit
//!    stands: a failure to sync the folder, or to clean up, is a warning in
//!    [`Committed::warnings`], never an undo.
//!
//! [`commit`] takes the commits of several datasets (the columns of one
//! table): all are locked and checked before any is applied, so a part
//! refused in one column commits no column.
//!
//! # What is removed, and when
//!
//! By ownership, never by age alone:
//! * a dropped part, [`KEEP_DROPPED`] after the overwrite that dropped it
//!   (readers of the generation before read on meanwhile);
//! * a job's staged leftovers (the parts of its failed or retried tasks,
//!   and what they were building) when the job commits or gives up
//!   ([`Options::job`], [`abandon`]), and a dead job's once no process holds
//!   its lock (`.job-<J>.lock`, held shared by the job's driver and
//!   each of its writers);
//! * a store being built whose writer is gone (the engine's rule for a
//!   store's `.partial` folders);
//! * temporary manifests (only a commit holding the lock writes one);
//! * staged parts of no job, only at an age the caller names
//!   ([`Options::remove_older_than`]): nothing proves their writer gone.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustix::fs::{FileType, RenameFlags};
use serde_json::Value;

use super::manifest::{
    read_manifest_in, relative_inside, schema_of, Manifest, PartEntry, DROPPED_DIR, MANIFEST_FILE, PARTS_DIR,
    STAGING_DIR,
};
use crate::error::{corrupted, Error, Result};
use crate::format::fingerprint::Fingerprint;
use crate::io::fault::crash_point;
use crate::io::fs::{file_mode, Dir};
use crate::store::Store;

/// The lock a commit holds.
const LOCK_FILE: &str = ".commit.lock";
/// How long a part an overwrite dropped stays (readers of the generation
/// before keep reading it).
pub const KEEP_DROPPED: Duration = Duration::from_secs(3600);

/// A part staged for a commit: its folder's name under `staging/`, and its
/// fingerprint as its writer took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The part's folder name (`p-…`).
    pub name: String,
    /// Records in it.
    pub records: u64,
    /// Its fingerprint content, 8 hex digits.
    pub content: String,
}

/// What a commit does with the parts already committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The new list is the old one, then the new parts.
    Append,
    /// The new list is the new parts only; the others are dropped.
    Overwrite,
}

/// The commit of one dataset.
#[derive(Clone, Debug)]
pub struct Request {
    /// The dataset folder (made if need be).
    pub root: PathBuf,
    /// The parts, in order.
    pub parts: Vec<Staged>,
    /// Append or overwrite.
    pub mode: Mode,
}

/// What a commit removes besides dropped parts (module docs).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The committing job: its staged leftovers are removed after the commit.
    pub job: Option<String>,
    /// Remove staged parts of no job at least this old.
    pub remove_older_than: Option<Duration>,
    /// Remove nothing staged (dropped parts still go when due).
    pub keep_staged: bool,
}

/// A commit that stands.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The manifest's generation.
    pub generation: u64,
    /// What failed after the commit point (it stands regardless).
    pub warnings: Vec<String>,
}

/// Whether `name` is a part's folder name: `p-` and then letters, digits,
/// `-` and `_` (no dot, no slash).
pub fn valid_part_name(name: &str) -> bool {
    name.len() > 2
        && name.len() <= 200
        && name.starts_with("p-")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Whether `job` is a job id: 1 to 64 letters, digits or `_`.
pub fn valid_job(job: &str) -> bool {
    !job.is_empty() && job.len() <= 64 && job.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn invalid_name(name: &str) -> Error {
    Error::InvalidArgument(format!(
        "{name:?} is not a part's name (p- and then letters, digits, - or _); give the PartInfo write_part returned"
    ))
}

fn check_job(job: &str) -> Result<()> {
    if valid_job(job) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("job {job:?} is not a job id (1 to 64 letters, digits or _)")))
    }
}

/// Opens the dataset folder at `path`, making it (and its parents) when
/// `create`; `None` when it is missing and not made. The path is resolved
/// as given (a link the caller names is the caller's choice).
fn open_root(path: &Path, create: bool) -> Result<Option<Dir>> {
    let missing = |e: &Error| matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT));
    match Dir::open(path) {
        Ok(d) => Ok(Some(d)),
        Err(e) if missing(&e) && create => {
            std::fs::create_dir_all(path).map_err(crate::error::io_err("create directory", path))?;
            Dir::open(path).map(Some)
        }
        Err(e) if missing(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Folder `name` of the dataset folder `root`, made (with the mode of
/// `root`) when `create`; `None` when it is missing and not made. Anything
/// but a directory at the name (a link above all) is refused, naming it.
fn sub(root: &Dir, name: &str, create: bool) -> Result<Option<Dir>> {
    let p = root.join(name);
    match root.stat(name) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
        Ok(st) => return Err(not_a_folder(&p, FileType::from_raw_mode(st.st_mode))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Ok(None);
            }
            match root.mkdir_mode(name, root.dir_mode()? & 0o777) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(crate::error::io_err("create directory", &p)(e)),
            }
        }
        Err(e) => return Err(crate::error::io_err("stat", &p)(e)),
    }
    match root.open_dir(name) {
        Ok(d) => Ok(Some(d)),
        Err(Error::Io { source, .. }) if matches!(source.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            Err(not_a_folder(&p, FileType::Symlink))
        }
        Err(e) => Err(e),
    }
}

fn not_a_folder(p: &Path, ty: FileType) -> Error {
    let what = if ty == FileType::Symlink { "a symbolic link" } else { "not a directory" };
    Error::Io {
        op: "open",
        path: p.to_path_buf(),
        source: std::io::Error::other(format!(
            "{what}, where a dataset of parts keeps a folder of its own: refused, nothing was changed (remove it, \
             or move it away, and commit again)"
        )),
    }
}

/// An exclusive `flock` on the dataset's `.commit.lock`, held for a commit.
struct CommitLock(#[allow(dead_code)] File);

fn lock_commits(root: &Dir) -> Result<CommitLock> {
    let f = root.open_lock(LOCK_FILE, file_mode(root.dir_mode()?))?;
    f.lock().map_err(crate::error::io_err("lock", root.join(LOCK_FILE)))?;
    Ok(CommitLock(f))
}

/// (device, inode) of `name` in `dir`, not following a link.
fn dev_ino(dir: &Dir, name: &str) -> Option<(u64, u64)> {
    dir.stat(name).ok().map(|st| (st.st_dev, st.st_ino))
}

/// Whether `name` in `dir` is a directory (not a link to one).
fn is_dir(dir: &Dir, name: &str) -> bool {
    dir.stat(name).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Opens part folder `name` of `dir` by descriptor and reads its store:
/// the folder's (device, inode), its fingerprint and schema.
fn read_part(dir: &Dir, name: &str) -> Result<((u64, u64), Fingerprint, Value, u64)> {
    let p = dir.join(name);
    let held = dir.open_dir(name).map_err(|e| match e {
        Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            not_a_folder(&p, FileType::Symlink)
        }
        other => other,
    })?;
    let id = held.dev_ino()?;
    let store = Store::builder(&p).in_dir(Arc::new(held)).open()?;
    let fp = store.fingerprint()?;
    let schema = schema_of(store.schema()?.as_deref(), &p)?;
    let bytes = store.stats()?.logical_bytes;
    Ok((id, fp, schema, bytes))
}

/// A writer of staged parts (`zring.parts.write_part`): holds the
/// dataset's `staging/` by descriptor, so that a store built at
/// [`PartWriter::staging_path`]`/NAME` is made through it (no link planted
/// at `staging` is followed), and, for a job, the job's lock shared.
pub struct PartWriter {
    staging: Arc<Dir>,
    _job: Option<JobHold>,
}

impl PartWriter {
    /// Opens (making them if need be) the dataset folder `root` and its
    /// `staging/`; with `job`, holds the job's lock while it lives.
    pub fn new(root: &Path, job: Option<&str>) -> Result<PartWriter> {
        let dir = open_root(root, true)?.expect("made");
        let staging = Arc::new(sub(&dir, STAGING_DIR, true)?.expect("made"));
        crate::write::builder::register(staging.path(), &staging);
        let job = match job {
            Some(j) => Some(JobHold::take(&dir, j)?),
            None => None,
        };
        Ok(PartWriter { staging, _job: job })
    }

    /// The staging folder's path: a store built at a path under it goes
    /// through the descriptor held.
    pub fn staging_path(&self) -> &Path {
        self.staging.path()
    }

    /// The fingerprint and schema of the staged part `name` (read through
    /// the descriptor).
    pub fn finish(&self, name: &str) -> Result<(Fingerprint, Value)> {
        if !valid_part_name(name) {
            return Err(invalid_name(name));
        }
        let (_, fp, schema, _) = read_part(&self.staging, name)?;
        Ok((fp, schema))
    }

    /// Moves the complete store at `src` (a path of the caller's, on the
    /// dataset's file system) into `staging/` as part `name`, and returns
    /// its fingerprint and schema.
    pub fn adopt(&self, src: &Path, name: &str) -> Result<(Fingerprint, Value)> {
        if !valid_part_name(name) {
            return Err(invalid_name(name));
        }
        self.staging.rename_into(src, name)?;
        self.staging.fsync()?;
        self.finish(name)
    }

    /// Replaces the `schema.json` of the staged part `name` with `json`
    /// (its records unchanged): how a writer that saw one block of a
    /// ragged column holding rows of one length, and wrote a fixed part,
    /// makes it ragged like its column's other parts.
    pub fn set_schema(&self, name: &str, json: &str) -> Result<()> {
        if !valid_part_name(name) {
            return Err(invalid_name(name));
        }
        let p = self.staging.join(name);
        let held = Arc::new(self.staging.open_dir(name)?);
        let store = Store::builder(&p).in_dir(held).open_writable()?;
        store.set_schema(json)
    }
}

/// A job's lock (`.job-<J>.lock` in the dataset folder), held shared.
pub struct JobHold {
    _file: File,
}

fn job_lock_name(job: &str) -> String {
    format!(".job-{job}.lock")
}

impl JobHold {
    /// Holds job `job`'s lock in the dataset folder `root`, shared: the job
    /// is alive while any process holds it.
    fn take(root: &Dir, job: &str) -> Result<JobHold> {
        check_job(job)?;
        let name = job_lock_name(job);
        for _ in 0..16 {
            let f = root.open_lock(&name, file_mode(root.dir_mode()?))?;
            f.lock_shared().map_err(crate::error::io_err("lock", root.join(&name)))?;
            // A cleanup that found the job gone unlinks the name while it
            // holds the lock: a lock on the unlinked file proves nothing.
            let st = rustix::fs::fstat(&f).map_err(|e| crate::error::io_err("stat", root.join(&name))(e.into()))?;
            if dev_ino(root, &name) == Some((st.st_dev, st.st_ino)) {
                return Ok(JobHold { _file: f });
            }
        }
        Err(Error::Io {
            op: "lock",
            path: root.join(&name),
            source: std::io::Error::other("the job's lock file kept being replaced"),
        })
    }

    /// Holds job `job`'s lock in the dataset at `root` (made if need be):
    /// the job's driver holds it from before its tasks start until it
    /// commits or gives up, so no other commit takes its staged parts for
    /// a dead job's.
    pub fn hold(root: &Path, job: &str) -> Result<JobHold> {
        check_job(job)?;
        let dir = open_root(root, true)?.expect("made");
        JobHold::take(&dir, job)
    }
}

/// The job a staged entry belongs to: `p-<J>-<id>` (a part), `.p-<J>-…`
/// (one being built), `.building-<J>-…` (what earlier versions built).
fn job_of(name: &str) -> Option<&str> {
    let rest =
        name.strip_prefix("p-").or_else(|| name.strip_prefix(".p-")).or_else(|| name.strip_prefix(".building-"))?;
    let (job, tail) = rest.split_once('-')?;
    (valid_job(job) && !tail.is_empty()).then_some(job)
}

/// Whether `name` is a staged part of no job (`p-<32 hex>`).
fn jobless_part(name: &str) -> bool {
    name.strip_prefix("p-").is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes entry `name` of `dir` (a folder walked by descriptor, or a
/// file or link by name).
fn remove_entry(dir: &Dir, name: &str) -> std::io::Result<()> {
    if is_dir(dir, name) {
        let held = dir.open_dir(name).map_err(|e| std::io::Error::other(e.to_string()))?;
        held.empty()?;
        dir.remove_dir_held(name, &held)
    } else {
        match dir.remove(name) {
            Ok(()) => Ok(()),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// One dataset's commit, checked and not yet applied.
struct Prepared {
    root: Dir,
    _lock: CommitLock,
    parts: Dir,
    staging: Option<Dir>,
    /// The manifest read (generation 0 and no parts for a new dataset),
    /// and whether a file held it.
    old: Manifest,
    existed: bool,
    new: Vec<PartEntry>,
    schema: Value,
    /// Staged parts to move: name, and the folder checked.
    moves: Vec<(String, (u64, u64))>,
    /// Part folder names the new list drops.
    dropping: Vec<String>,
}

/// The manifest of `root`, or a new dataset's (generation 0, no parts)
/// when there is none and `parts/` holds no part folder; an error when
/// the manifest is missing over committed parts, or does not read.
fn current(root: &Dir, parts: &Dir) -> Result<(Manifest, bool)> {
    if let Some(m) = read_manifest_in(root)? {
        return Ok((m, true));
    }
    let held = parts.entries()?.len();
    if held > 0 {
        return Err(corrupted(
            root.join(MANIFEST_FILE).display().to_string(),
            format!(
                "missing, while {} holds {held} committed part folders: restore {MANIFEST_FILE} from a copy; \
                 nothing was changed (a commit never starts a new dataset over committed parts)",
                parts.path().display()
            ),
        ));
    }
    Ok((Manifest::new(0, Value::Null, Vec::new()), false))
}

/// Returns to `staging/` the folders in `parts/` that no manifest lists
/// and no overwrite marked: what a commit that died before its manifest
/// moved (module docs, step 2).
fn recover(root: &Dir, parts: &Dir, staging: &mut Option<Dir>, old: &Manifest) -> Result<()> {
    let listed: HashSet<&str> = old.parts.iter().filter_map(|p| p.dir.strip_prefix("parts/")).collect();
    let dropped = sub(root, DROPPED_DIR, false)?;
    for (name, _) in parts.entries()? {
        if listed.contains(name.as_str()) || dropped.as_ref().is_some_and(|d| d.exists(&name)) {
            continue;
        }
        if staging.is_none() {
            *staging = sub(root, STAGING_DIR, true)?;
        }
        let st = staging.as_ref().expect("made");
        match parts.rename_to(&name, st, &name, RenameFlags::NOREPLACE) {
            Ok(()) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn prepare(req: &Request) -> Result<Prepared> {
    let root = open_root(&req.root, true)?.expect("made");
    let lock = lock_commits(&root)?;
    let parts = sub(&root, PARTS_DIR, true)?.expect("made");
    let mut staging = sub(&root, STAGING_DIR, false)?;
    sub(&root, DROPPED_DIR, false)?;
    let (old, existed) = current(&root, &parts)?;
    recover(&root, &parts, &mut staging, &old)?;
    let listed: HashMap<&str, &PartEntry> = old.parts.iter().map(|p| (p.dir.as_str(), p)).collect();
    let mut new: Vec<PartEntry> = if req.mode == Mode::Append { old.parts.clone() } else { Vec::new() };
    let mut schema = if req.mode == Mode::Append && !old.parts.is_empty() { Some(old.schema.clone()) } else { None };
    let mut seen = HashSet::new();
    let mut moves = Vec::new();
    for s in &req.parts {
        if !valid_part_name(&s.name) {
            return Err(invalid_name(&s.name));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(Error::InvalidArgument(format!("part {} is given twice; give each part once", s.name)));
        }
        let mut want = PartEntry {
            dir: format!("{PARTS_DIR}/{}", s.name),
            records: s.records,
            content: s.content.clone(),
            bytes: None,
        };
        want.fingerprint()?;
        if let Some(had) = listed.get(want.dir.as_str()) {
            // Committed before: a retried commit.
            if !had.same_part(&want) {
                return Err(Error::InvalidArgument(format!(
                    "part {} is committed with {} records (content {}), not the {} records (content {}) given",
                    s.name, had.records, had.content, s.records, s.content
                )));
            }
            if req.mode == Mode::Overwrite {
                new.push((*had).clone());
                if schema.is_none() {
                    schema = Some(old.schema.clone());
                }
            }
            continue;
        }
        let st = staging.as_ref().filter(|d| d.exists(&s.name)).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "part {} is not staged in {}: it was removed, never written there, or written for another dataset \
                 (commit it to the dataset given to write_part, or write it again)",
                s.name,
                req.root.join(STAGING_DIR).display()
            ))
        })?;
        let (held, fp, part_schema, bytes) = read_part(st, &s.name)?;
        let got = PartEntry::new(want.dir.clone(), fp);
        if !got.same_part(&want) {
            return Err(corrupted(
                st.join(&s.name).display().to_string(),
                format!(
                    "holds {} records (content {}) but its PartInfo says {} (content {}): it was changed after it \
                     was written; write it again",
                    got.records, got.content, want.records, want.content
                ),
            ));
        }
        match &schema {
            None => schema = Some(part_schema),
            Some(s0) if *s0 != part_schema => {
                return Err(corrupted(
                    st.join(&s.name).display().to_string(),
                    format!(
                        "has schema {part_schema}, the dataset's other parts {s0}: its dtype or shape differs; write \
                         it again with theirs (the parts of a refused commit stay staged)"
                    ),
                ))
            }
            Some(_) => {}
        }
        moves.push((s.name.clone(), held));
        want.bytes = Some(bytes);
        new.push(want);
    }
    let keep: HashSet<&str> = new.iter().map(|p| p.dir.as_str()).collect();
    let dropping = old
        .parts
        .iter()
        .filter(|p| !keep.contains(p.dir.as_str()))
        .filter_map(|p| p.dir.strip_prefix("parts/").map(str::to_string))
        .collect();
    for p in &new {
        if !relative_inside(&p.dir) {
            return Err(Error::InvalidArgument(format!("{:?} is not a part folder inside the dataset", p.dir)));
        }
    }
    let schema = if new.is_empty() { Value::Null } else { schema.unwrap_or(Value::Null) };
    Ok(Prepared { root, _lock: lock, parts, staging, old, existed, new, schema, moves, dropping })
}

/// Writes `m` as the manifest of `root`: a new temporary file (made with
/// `O_EXCL`, whatever was at its name unlinked first), synced, renamed over
/// `manifest.json`. The rename is the commit point; the folder's sync
/// after it is returned apart, as it does not undo the commit.
fn write_manifest(root: &Dir, m: &Manifest) -> Result<std::result::Result<(), Error>> {
    let bytes = m.to_bytes()?;
    let tmp = format!(".{MANIFEST_FILE}.{}.tmp", std::process::id());
    let tp = root.join(&tmp);
    let mut f = root.create(&tmp)?;
    let written = crate::io::fs::write_all(&mut f, &tp, 0, &bytes).and_then(|()| crate::io::fs::fsync(&f, &tp));
    drop(f);
    if let Err(e) = written {
        let _ = root.remove(&tmp);
        return Err(e);
    }
    crash_point("parts.manifest_written");
    if let Err(e) = root.rename(&tmp, MANIFEST_FILE) {
        let _ = root.remove(&tmp);
        return Err(e);
    }
    crash_point("parts.committed");
    Ok(root.fsync())
}

/// Moves the checked staged parts into `parts/`; on a failure, returns
/// those moved to `staging/` and reports it (nothing committed).
fn move_parts(p: &Prepared) -> Result<()> {
    let Some(staging) = &p.staging else { return Ok(()) };
    let mut moved: Vec<&str> = Vec::new();
    let result = (|| {
        for (name, held) in &p.moves {
            if dev_ino(staging, name) != Some(*held) {
                return Err(Error::Io {
                    op: "commit",
                    path: staging.join(name),
                    source: std::io::Error::other(
                        "the staged part was replaced after it was checked; nothing was committed",
                    ),
                });
            }
            staging.rename_to(name, &p.parts, name, RenameFlags::NOREPLACE)?;
            moved.push(name);
            if dev_ino(&p.parts, name) != Some(*held) {
                return Err(Error::Io {
                    op: "commit",
                    path: p.parts.join(name),
                    source: std::io::Error::other(
                        "the staged part was replaced as it was moved; nothing was committed",
                    ),
                });
            }
            crash_point("parts.moved_one");
        }
        if !p.moves.is_empty() {
            p.parts.fsync()?;
            staging.fsync()?;
        }
        Ok(())
    })();
    if result.is_err() {
        for name in moved {
            let _ = p.parts.rename_to(name, staging, name, RenameFlags::NOREPLACE);
        }
    }
    result
}

/// Applies a checked commit (module docs, steps 4 and 5) and cleans up.
fn apply(p: Prepared, opts: &Options) -> Result<Committed> {
    if !p.existed {
        // A new dataset gets a manifest of no parts before any part moves:
        // from then on a missing manifest is never a new dataset.
        let empty = Manifest::new(0, Value::Null, Vec::new());
        write_manifest(&p.root, &empty)??;
    }
    move_parts(&p)?;
    crash_point("parts.moved");
    if !p.dropping.is_empty() {
        // Marked before the commit point: a part an overwrite drops is never
        // mistaken for a dead commit's move (`recover`).
        let marks = sub(&p.root, DROPPED_DIR, true)?.expect("made");
        for name in &p.dropping {
            drop(marks.create(name)?);
        }
        marks.fsync()?;
    }
    let m = Manifest::new(p.old.generation + 1, p.schema.clone(), p.new.clone());
    let mut warnings = Vec::new();
    if let Err(e) = write_manifest(&p.root, &m).inspect_err(|_| {
        // Not committed: the moved parts go back to staging/.
        if let Some(st) = &p.staging {
            for (name, _) in &p.moves {
                let _ = p.parts.rename_to(name, st, name, RenameFlags::NOREPLACE);
            }
        }
    })? {
        warnings.push(format!(
            "generation {} of {} is committed, but syncing the folder failed ({e}): a power loss may undo it",
            m.generation,
            p.root.path().display()
        ));
    }
    clean(&p, &m, opts, &mut warnings);
    Ok(Committed { generation: m.generation, warnings })
}

/// Removes what is due (module docs); failures become warnings.
fn clean(p: &Prepared, m: &Manifest, opts: &Options, warnings: &mut Vec<String>) {
    let mut warn = |what: String, e: &dyn std::fmt::Display| warnings.push(format!("could not remove {what}: {e}"));
    let listed: HashSet<&str> = m.parts.iter().filter_map(|e| e.dir.strip_prefix("parts/")).collect();
    // Temporary manifests: only a commit holding the lock writes one.
    if let Ok(entries) = p.root.entries() {
        for (name, _) in entries {
            if name.starts_with(&format!(".{MANIFEST_FILE}.")) && name.ends_with(".tmp") {
                if let Err(e) = p.root.remove(&name) {
                    warn(p.root.join(&name).display().to_string(), &e);
                }
            }
            // The lock of a job that is gone (its staged leftovers go below).
            let job = name.strip_prefix(".job-").and_then(|n| n.strip_suffix(".lock"));
            if let Some(j) = job.filter(|j| valid_job(j) && Some(*j) != opts.job.as_deref()) {
                let gone_with_nothing_staged = p
                    .staging
                    .as_ref()
                    .is_none_or(|st| st.entries().unwrap_or_default().iter().all(|(n, _)| job_of(n) != Some(j)));
                if gone_with_nothing_staged {
                    if let Some(Some(_held)) = job_gone(&p.root, j) {
                        let _ = p.root.remove(&name);
                    }
                }
            }
        }
    }
    // Dropped parts, once due.
    match sub(&p.root, DROPPED_DIR, false) {
        Ok(Some(marks)) => {
            let now = SystemTime::now();
            for (name, _) in marks.entries().unwrap_or_default() {
                let due = marks.stat(&name).ok().is_some_and(|st| {
                    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
                    now.duration_since(at).unwrap_or_default() >= KEEP_DROPPED
                });
                let present = p.parts.exists(&name);
                if listed.contains(name.as_str()) || !present || due {
                    if present && due && !listed.contains(name.as_str()) {
                        if let Err(e) = remove_entry(&p.parts, &name) {
                            warn(p.parts.join(&name).display().to_string(), &e);
                            continue;
                        }
                    }
                    if let Err(e) = marks.remove(&name) {
                        warn(marks.join(&name).display().to_string(), &e);
                    }
                }
            }
        }
        Ok(None) => {}
        Err(e) => warnings.push(format!("left {DROPPED_DIR}/ alone: {e}")),
    }
    if opts.keep_staged {
        return;
    }
    if let Some(st) = &p.staging {
        clean_staging(&p.root, st, opts.job.as_deref(), opts.remove_older_than, warnings);
    }
}

/// Removes the staged leftovers of `job` (when given), of jobs that are
/// gone, of stores whose writer is gone, and (with `older_than`) staged
/// parts of no job at least that old.
fn clean_staging(root: &Dir, st: &Dir, job: Option<&str>, older_than: Option<Duration>, warnings: &mut Vec<String>) {
    let Ok(entries) = st.entries() else { return };
    let now = SystemTime::now();
    // Jobs found gone hold their lock (exclusively) until their entries are removed.
    let mut gone: HashMap<String, Option<File>> = HashMap::new();
    let mut live: HashSet<String> = HashSet::new();
    for (name, _) in &entries {
        let owner = job_of(name).map(str::to_string);
        let remove = match &owner {
            Some(j) if Some(j.as_str()) == job => true,
            Some(j) if live.contains(j) => false,
            Some(j) if gone.contains_key(j) => true,
            Some(j) => match job_gone(root, j) {
                Some(held) => {
                    gone.insert(j.clone(), held);
                    true
                }
                None => {
                    live.insert(j.clone());
                    false
                }
            },
            None => {
                jobless_part(name)
                    && older_than.is_some_and(|d| {
                        st.stat(name).ok().is_some_and(|s| {
                            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(s.st_mtime.max(0) as u64);
                            now.duration_since(at).unwrap_or_default() >= d
                        })
                    })
            }
        };
        if remove {
            if let Err(e) = remove_entry(st, name) {
                warnings.push(format!("could not remove {}: {e}", st.join(name).display()));
            }
        }
    }
    // Stores being built by writers that are gone (no job in their name).
    crate::write::builder::remove_stale_all(st);
    // The lock of a job found gone is unlinked while held; the committing
    // job's own stays for its holders ([`abandon`] removes it).
    for (j, held) in gone {
        if held.is_some() {
            let _ = root.remove(&job_lock_name(&j));
        }
    }
}

/// `Some(lock held exclusively, or None when there is no lock file)` when
/// no process holds job `job`'s lock; `None` when the job lives.
fn job_gone(root: &Dir, job: &str) -> Option<Option<File>> {
    let name = job_lock_name(job);
    match root.open_quiet(&name, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK) {
        Ok(f) => match f.try_lock() {
            Ok(()) => Some(Some(f)),
            Err(_) => None,
        },
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Some(None),
        Err(_) => None,
    }
}

/// Commits each request (module docs): all are locked (in the order of
/// their folders' paths) and checked before any is applied. `Err` means
/// nothing was committed when the error came while checking, or in the
/// first request applied.
pub fn commit(reqs: &[Request], opts: &Options) -> Result<Vec<Committed>> {
    if let Some(j) = &opts.job {
        check_job(j)?;
    }
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| reqs[a].root.cmp(&reqs[b].root));
    for w in order.windows(2) {
        if reqs[w[0]].root == reqs[w[1]].root {
            return Err(Error::InvalidArgument(format!("{} is given twice in one commit", reqs[w[0]].root.display())));
        }
    }
    let mut prepared: Vec<Option<Prepared>> = (0..reqs.len()).map(|_| None).collect();
    for &k in &order {
        prepared[k] = Some(prepare(&reqs[k])?);
    }
    prepared.into_iter().map(|p| apply(p.expect("prepared"), opts)).collect()
}

/// Ends job `job` in the dataset at `root`: removes what its writers
/// staged and did not commit, and its lock file (nothing committed is
/// touched), under the commit lock.
pub fn abandon(root: &Path, job: &str) -> Result<()> {
    check_job(job)?;
    let Some(dir) = open_root(root, false)? else { return Ok(()) };
    let _lock = lock_commits(&dir)?;
    let mut warnings = Vec::new();
    if let Some(st) = sub(&dir, STAGING_DIR, false)? {
        clean_staging(&dir, &st, Some(job), None, &mut warnings);
    }
    // The job's lock goes too: a holder left keeps its lock on the file
    // unlinked, and a writer of the job starting after makes it anew.
    match dir.remove(&job_lock_name(job)) {
        Ok(()) => {}
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warnings.push(e.to_string()),
    }
    match warnings.into_iter().next() {
        Some(w) => Err(Error::Io { op: "remove", path: dir.path().to_path_buf(), source: std::io::Error::other(w) }),
        None => Ok(()),
    }
}

/// Writes a manifest listing `parts`, folders already in place in the
/// dataset at `dir` (relative paths inside it), under the commit lock:
/// each opened by descriptor and checked against its entry and `schema`.
/// With `replace` false the old manifest's parts must come first,
/// unchanged. For tools and tests that lay parts out themselves; writers
/// stage parts and [`commit`] them.
pub fn commit_manifest(dir: &Path, schema: Value, parts: Vec<PartEntry>, replace: bool) -> Result<Manifest> {
    let root = open_root(dir, true)?.expect("made");
    let _lock = lock_commits(&root)?;
    let old = read_manifest_in(&root)?;
    if let (Some(old), false) = (&old, replace) {
        let keeps = old.parts.len() <= parts.len() && old.parts.iter().zip(&parts).all(|(a, b)| a == b);
        if !keeps {
            return Err(Error::InvalidArgument(format!(
                "an append to {} must list its {} committed parts first, unchanged; use an overwrite to replace them",
                dir.display(),
                old.parts.len()
            )));
        }
    }
    let mut seen = HashSet::new();
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
        let (_, fp, s, _) = match p.dir.rsplit_once('/') {
            Some((parent, name)) => read_part(&root.open_rel_dir(parent)?, name)?,
            None => read_part(&root, &p.dir)?,
        };
        if !PartEntry::new(p.dir.clone(), fp).same_part(p) {
            return Err(corrupted(
                root.join(&p.dir).display().to_string(),
                format!("part {k} holds {} records (content {:08x}), not what its entry says", fp.records, fp.content),
            ));
        }
        if s != schema {
            return Err(corrupted(
                root.join(&p.dir).display().to_string(),
                format!("part {k} has schema {s}, the dataset's other parts {schema}: its dtype or shape differs"),
            ));
        }
    }
    let generation = old.as_ref().map_or(0, |m| m.generation) + 1;
    let m = Manifest::new(generation, schema, parts);
    write_manifest(&root, &m)??;
    Ok(m)
}
