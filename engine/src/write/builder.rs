//! Building a store beside its destination and putting it in place in one
//! rename.
//!
//! A store written where it will be read is visible half-written, and a
//! failure part-way leaves half a store that a later writer refuses (files
//! without a head). A [`Staging`] directory is made beside the destination
//! (same file system, so the rename is atomic), filled, and then either
//! renamed into place ([`Staging::publish`]) or removed. Replacing an
//! existing destination swaps the two directories in one
//! `renameat2(RENAME_EXCHANGE)`, so a reader sees the old store or the new
//! one and never no store; where the file system cannot swap, the old one is
//! renamed away first (a moment without a store, never a mix). The parent
//! directory is fsynced after the rename, so a crash after `publish`
//! returned keeps the new store in place.
//!
//! A crash before `publish` leaves the hidden `.NAME.*.partial` directory
//! beside the destination, and the destination as it was; the directory is
//! safe to delete, and the next staging for the same destination removes it
//! once its process is gone ([`remove_stale`]).
//!
//! Every step goes through descriptors ([`crate::io::fs::Dir`]): the
//! staging directory is made with `mkdirat` in the parent's descriptor and
//! held open from then on, the store is built in it by descriptor, publish
//! renames relative to the parent's descriptor after checking the name
//! still holds the directory built in, and a replace checks that the
//! destination is a store ([`check_replaceable`]) and removes what it
//! swapped out by walking it by descriptor.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::RenameFlags;

use crate::error::{Error, Result};
use crate::format::head::Head;
use crate::format::names::{HEAD_FILE, LOADERX_META};
use crate::io::fs::Dir;

/// A directory being built beside `dest`, to take its place in one rename;
/// removed when dropped unpublished.
///
/// Replacing an existing `dest` swaps the two directories in one
/// `renameat2(RENAME_EXCHANGE)`, so a reader finds the old store or the new
/// one, never none; where the file system cannot swap, the old one is
/// renamed away first (a moment without a store, never a mix). Only a
/// store, a directory of stores or an empty directory is replaced
/// ([`check_replaceable`]); anything else is [`Error::NotReplaceable`] and
/// stays as it is. A crash before [`Staging::publish`] leaves `dest` as it
/// was and the hidden `.NAME.*.partial` directory beside it, which the next
/// staging for `dest` removes once its writer is gone.
///
/// The parent directory and the staging directory are held by descriptor
/// from the moment they are made (`io::fs::Dir`): the store is
/// built, published and removed through them, never by a path another user
/// of the parent could swap for a link.
#[derive(Debug)]
pub struct Staging {
    parent: Arc<Dir>,
    /// The staging directory's name in `parent`.
    name: String,
    /// The destination's name in `parent`.
    dest_name: String,
    dir: Arc<Dir>,
    path: PathBuf,
    dest: PathBuf,
    replace: bool,
    published: bool,
}

impl Staging {
    /// Creates an empty hidden directory beside `dest`
    /// (`.NAME.<pid>-<n>.partial`, with the mode any directory made there
    /// gets), and the parent directories `dest` needs. An existing `dest`
    /// is [`Error::AlreadyExists`] unless `replace`, and with `replace`
    /// [`Error::NotReplaceable`] unless it is a store, a directory of stores
    /// or empty. Staging directories of writers that are gone (killed before
    /// they published) are removed first (by descriptor, as the module docs say).
    pub fn new(dest: impl AsRef<Path>, replace: bool) -> Result<Staging> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dest = dest.as_ref().to_path_buf();
        let dest_name = dest
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty() && *n != "." && *n != "..")
            .ok_or_else(|| Error::InvalidArgument(format!("{} names no directory to create", dest.display())))?
            .to_string();
        let parent_path = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // A staging directory inside another (a names store built in its
        // store's) is reached through the outer one's descriptor.
        let parent = match resolve(&parent_path, true)? {
            Some(d) => d,
            None => {
                std::fs::create_dir_all(&parent_path)
                    .map_err(crate::error::io_err("create directory", &parent_path))?;
                Arc::new(Dir::open(&parent_path)?)
            }
        };
        if parent.exists(&dest_name) {
            if !replace {
                return Err(Error::AlreadyExists { path: dest });
            }
            // Refused before anything is built.
            replaceable(&parent, &dest_name, &dest)?;
        }
        remove_stale(&parent, &dest_name);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!(".{dest_name}.{}-{n}.partial", std::process::id());
            // `mkdirat` applies the umask to 0777, as for any directory.
            match parent.mkdir(&name) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(crate::error::io_err("create directory", parent.join(&name))(e)),
            }
            let dir = parent.open_dir(&name)?;
            // Made a moment ago by this process: another user of the parent
            // who swapped in a directory of theirs is not built in.
            let owner = std::os::unix::fs::MetadataExt::uid(&dir.metadata()?);
            if owner != rustix::process::geteuid().as_raw() {
                return Err(Error::Io {
                    op: "create directory",
                    path: parent.join(&name),
                    source: std::io::Error::other("replaced by another user's directory as it was made"),
                });
            }
            let path = parent.join(&name);
            let dir = Arc::new(dir);
            register(&path, &dir);
            return Ok(Staging { parent, name, dest_name, dir, path, dest, replace, published: false });
        }
    }

    /// The directory to build in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory to build in, by descriptor.
    pub(crate) fn handle(&self) -> Arc<Dir> {
        Arc::clone(&self.dir)
    }

    /// Where [`Staging::publish`] puts it.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Puts the directory at the destination (see [`Staging`]) and fsyncs
    /// the parent. Everything in it must be durable already (a
    /// store's writer syncs when it closes). A destination that appeared
    /// since [`Staging::new`] without `replace` is [`Error::AlreadyExists`],
    /// and the staged directory is removed; one that is not a store (nor a
    /// directory of stores, nor empty) is [`Error::NotReplaceable`], and
    /// nothing is moved.
    pub fn publish(mut self) -> Result<()> {
        let parent = &self.parent;
        // The name is renamed, not the descriptor: it must still be the
        // directory built in (another user of the parent may have moved it
        // and put something else, a link, at its name).
        let held = self.dir.dev_ino()?;
        if !parent.stat(&self.name).is_ok_and(|st| (st.st_dev, st.st_ino) == held) {
            return Err(Error::Io {
                op: "publish",
                path: self.path.clone(),
                source: std::io::Error::other("the staging directory was moved or replaced while the store was built"),
            });
        }
        if !parent.exists(&self.dest_name) {
            // RENAME_NOREPLACE: a destination created meanwhile is not
            // silently replaced (a plain rename would take an empty one).
            parent.rename_to(&self.name, parent, &self.dest_name, RenameFlags::NOREPLACE)?;
            self.published = true;
            return parent.fsync();
        }
        if !self.replace {
            return Err(Error::AlreadyExists { path: self.dest.clone() });
        }
        let old = replaceable(parent, &self.dest_name, &self.dest)?;
        let old_name = match parent.rename_to(&self.name, parent, &self.dest_name, RenameFlags::EXCHANGE) {
            // The old store now sits at the staging name.
            Ok(()) => self.name.clone(),
            Err(Error::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) =>
            {
                let old_name = format!("{}.old", self.name);
                parent.rename(&self.dest_name, &old_name)?;
                parent.rename(&self.name, &self.dest_name)?;
                old_name
            }
            Err(e) => return Err(e),
        };
        self.published = true;
        parent.fsync()?;
        // What was swapped out is removed only if it is the directory
        // checked above (another user of the parent may have swapped
        // something else in between): walked by descriptor, never by path.
        match parent.stat(&old_name) {
            Ok(st) if old.dev_ino().is_ok_and(|d| d == (st.st_dev, st.st_ino)) => {
                let _ = old.empty();
                let _ = parent.remove_dir_held(&old_name, &old);
                let _ = parent.fsync();
                Ok(())
            }
            Ok(_) => {
                let kept = format!("{}.kept", old_name.trim_end_matches(".old").trim_end_matches(".partial"));
                let _ = parent.rename(&old_name, &kept);
                Err(Error::NotReplaceable {
                    path: self.dest.clone(),
                    reason: format!(
                        "it changed while it was being replaced; the new store is in place, and what was there was \
                         kept at {}",
                        parent.join(&kept).display()
                    ),
                })
            }
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = self.dir.empty();
            let _ = self.parent.remove_dir_held(&self.name, &self.dir);
        }
    }
}

/// Live staging directories of this process, by the path [`Staging::path`]
/// gave: a store opened by that path (or a directory under it, such as a
/// names store) is reached through the staging directory's descriptor
/// ([`resolve`]), not by the path, which another user of the parent
/// directory could swap for a link.
static STAGED: std::sync::Mutex<Vec<(PathBuf, std::sync::Weak<Dir>)>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn register(path: &Path, dir: &Arc<Dir>) {
    let mut staged = STAGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    staged.retain(|(_, w)| w.strong_count() > 0);
    staged.push((path.to_path_buf(), Arc::downgrade(dir)));
}

/// The directory `path` names when it is a live staging directory of this
/// process or lies under one: reached from the staging directory's
/// descriptor, component by component, never through a link (`create`
/// makes the missing ones). `None` for any other path.
pub(crate) fn resolve(path: &Path, create: bool) -> Result<Option<Arc<Dir>>> {
    let found = {
        let staged = STAGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        staged.iter().find_map(|(p, w)| {
            let rest = path.strip_prefix(p).ok()?;
            Some((w.upgrade()?, rest.to_path_buf()))
        })
    };
    let Some((mut dir, rest)) = found else { return Ok(None) };
    for c in rest.components() {
        let std::path::Component::Normal(name) = c else {
            return Err(Error::InvalidArgument(format!("{} leaves its staging directory", path.display())));
        };
        let name = name.to_str().ok_or_else(|| Error::InvalidArgument(format!("{} is not UTF-8", path.display())))?;
        if create {
            match dir.mkdir(name) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(crate::error::io_err("create directory", dir.join(name))(e)),
            }
        }
        dir = Arc::new(dir.open_dir(name)?);
    }
    Ok(Some(dir))
}

/// Whether the directory at `path` may be replaced by a new store
/// (`overwrite=True`, [`Staging`]): `Ok` for a zring store (a `head.zr`
/// that reads as one), a loaderx store (its `meta.zr`), a directory of
/// stores (every entry a `*.zr` directory holding one: what a conversion to
/// several stores makes) or an empty directory, and for nothing at `path`;
/// [`Error::NotReplaceable`] naming the path and what was found otherwise.
/// Nothing is changed either way.
pub fn check_replaceable(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let name = match path.file_name().and_then(|n| n.to_str()) {
        Some(n) => n,
        None => return Err(Error::InvalidArgument(format!("{} names no directory", path.display()))),
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = match resolve(parent, false).and_then(|d| match d {
        Some(d) => Ok(d),
        None => Dir::open(parent).map(Arc::new),
    }) {
        Ok(d) => d,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !parent.exists(name) {
        return Ok(());
    }
    replaceable(&parent, name, path).map(drop)
}

/// [`check_replaceable`] for `name` in `parent`; returns the directory held.
fn replaceable(parent: &Dir, name: &str, path: &Path) -> Result<Dir> {
    let refuse = |reason: String| Error::NotReplaceable { path: path.to_path_buf(), reason };
    let dir = match parent.open_dir(name) {
        Ok(d) => d,
        Err(Error::Io { source, .. }) if matches!(source.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            return Err(refuse("it is not a directory (a file or a symbolic link)".into()))
        }
        Err(e) => return Err(e),
    };
    let entries = dir.entries()?;
    if entries.is_empty() || holds_store(&dir) {
        return Ok(dir);
    }
    let nested = entries.iter().all(|(n, ty)| {
        n.ends_with(".zr") && *ty == rustix::fs::FileType::Directory && dir.open_dir(n).is_ok_and(|d| holds_store(&d))
    });
    if nested {
        return Ok(dir);
    }
    let reason = if dir.exists(HEAD_FILE) {
        match Head::read(&dir) {
            Err(e) => format!("its {HEAD_FILE} does not read as a store's ({e})"),
            Ok(_) => format!("its {HEAD_FILE} is not a regular file"),
        }
    } else {
        let mut names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).take(4).collect();
        names.sort_unstable();
        format!(
            "no {HEAD_FILE}; it holds {} {} ({}{})",
            entries.len(),
            if entries.len() == 1 { "entry" } else { "entries" },
            names.join(", "),
            if entries.len() > 4 { ", ..." } else { "" }
        )
    };
    Err(refuse(reason))
}

/// Whether `dir` holds a zring store (a `head.zr` that reads) or a loaderx
/// one (a `meta.zr` with loaderx's magic).
fn holds_store(dir: &Dir) -> bool {
    if dir.is_file(HEAD_FILE) {
        return Head::read(dir).is_ok();
    }
    dir.is_file(LOADERX_META) && crate::format::table::Table::open_loaderx(dir).is_ok()
}

/// Removes the staging directories for `dest_name` in `parent`
/// (`.NAME.<pid>-<n>.partial`, and `.partial.old`) that writers killed
/// before publishing left, by descriptor ([`Dir::remove_tree`]). One is
/// removed only when it belongs to this user, its process is gone (`kill(pid,
/// 0)` answers ESRCH) and no one holds its store's writer lock (a writer in
/// another pid namespace, sharing the file system, still holds it). Best
/// effort: what cannot be removed stays.
pub(crate) fn remove_stale(parent: &Dir, dest_name: &str) {
    let prefix = format!(".{dest_name}.");
    remove_stale_where(parent, |name| name.strip_prefix(&prefix));
}

/// [`remove_stale`] for every destination in `parent`: each
/// `.NAME.<pid>-<n>.partial` folder whose writer is gone.
pub(crate) fn remove_stale_all(parent: &Dir) {
    remove_stale_where(parent, |name| {
        let rest = name.strip_prefix('.')?;
        let end = rest.strip_suffix(".partial").or_else(|| rest.strip_suffix(".partial.old"))?;
        let dot = end.rfind('.')?;
        Some(&rest[dot + 1..])
    });
}

/// Removes each staging folder in `parent` whose name `tail` maps to
/// `<pid>-<n>.partial` (or `.partial.old`) and whose writer is gone.
fn remove_stale_where(parent: &Dir, tail: impl Fn(&str) -> Option<&str>) {
    let Ok(entries) = parent.entries() else { return };
    let me = std::process::id();
    let euid = rustix::process::geteuid().as_raw();
    for (name, ty) in entries {
        if ty != rustix::fs::FileType::Directory {
            continue;
        }
        let Some(rest) = tail(&name) else { continue };
        let Some(rest) = rest.strip_suffix(".partial").or_else(|| rest.strip_suffix(".partial.old")) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else { continue };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u64>()) else { continue };
        if pid == me || !gone(pid) {
            continue;
        }
        let Ok(dir) = parent.open_dir(&name) else { continue };
        if dir.metadata().map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok() != Some(euid) || locked(&dir) {
            continue;
        }
        let _ = dir.empty();
        let _ = parent.remove_dir_held(&name, &dir);
    }
}

/// Whether process `pid` no longer exists (in this pid namespace).
fn gone(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    matches!(rustix::process::test_kill_process(pid), Err(rustix::io::Errno::SRCH))
}

/// Whether someone holds the writer lock of the store being built in `dir`
/// (a `flock`, or an OFD lock).
fn locked(dir: &Dir) -> bool {
    let Ok(f) = dir.open_quiet(crate::format::names::LOCK_FILE, rustix::fs::OFlags::RDONLY) else { return false };
    let held_flock = match f.try_lock_shared() {
        Ok(()) => {
            let _ = f.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(_) => false,
    };
    let held_ofd = crate::io::locks::query(&f, 0, 0).is_ok_and(|l| i32::from(l.l_type) != libc::F_UNLCK);
    held_flock || held_ofd
}

#[cfg(test)]
mod tests {
    use super::Staging;
    use crate::{Error, Store};

    fn records(s: &Store) -> Vec<Vec<u8>> {
        (0..s.len())
            .map(|i| {
                let mut b = vec![0u8; s.record_len(i).unwrap() as usize];
                let n = b.len();
                s.gather(&crate::Gather::fixed(&[i], n), &mut b).unwrap();
                b
            })
            .collect()
    }

    fn leftovers(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    /// A store built in a staging directory appears at its destination only
    /// when published; replacing swaps the old store for the new one whole;
    /// a staging dropped unpublished leaves the destination as it was and
    /// nothing beside it.
    #[test]
    fn a_staged_store_appears_whole_or_not_at_all() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("nested").join("s");
        let st = Staging::new(&dest, false).unwrap();
        {
            let s = Store::builder(st.path()).create().unwrap();
            s.append(&[b"one", b"two"], None).unwrap();
            s.close().unwrap();
        }
        assert!(!dest.exists(), "nothing at the destination before publish");
        st.publish().unwrap();
        assert_eq!(records(&Store::open(&dest).unwrap()), vec![b"one".to_vec(), b"two".to_vec()]);

        assert!(matches!(Staging::new(&dest, false), Err(Error::AlreadyExists { .. })));
        let st = Staging::new(&dest, true).unwrap();
        Store::builder(st.path()).create().unwrap().append(&[b"three"], None).unwrap();
        drop(st);
        assert_eq!(records(&Store::open(&dest).unwrap()).len(), 2, "dropped unpublished: the old store stays");
        assert!(leftovers(&root.path().join("nested")).is_empty());

        let st = Staging::new(&dest, true).unwrap();
        {
            let s = Store::builder(st.path()).create().unwrap();
            s.append(&[b"three"], None).unwrap();
        }
        st.publish().unwrap();
        assert_eq!(records(&Store::open(&dest).unwrap()), vec![b"three".to_vec()]);
        assert!(leftovers(&root.path().join("nested")).is_empty());

        // A destination that appears meanwhile is not replaced without `replace`.
        let other = root.path().join("o");
        let st = Staging::new(&other, false).unwrap();
        std::fs::create_dir(&other).unwrap();
        assert!(matches!(st.publish(), Err(Error::AlreadyExists { .. })));
        assert!(leftovers(root.path()).is_empty());

        // Through the builder: closed, synced and sealed as any store.
        let staged = Store::builder(&other).sealable(true).create_staged(true).unwrap();
        staged.append_fixed(&[7u8; 800], 8, None).unwrap();
        assert_eq!(staged.seal().unwrap().format_after, 2);
        staged.publish().unwrap();
        let s = Store::open(&other).unwrap();
        assert_eq!((s.len(), s.table_format().0), (100, 2));
        assert!(leftovers(root.path()).is_empty());
    }
}
