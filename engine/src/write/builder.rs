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
//! safe to delete.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_err, Error, Result};
use crate::io::fs;

/// A directory being built beside `dest`, to take its place in one rename;
/// removed when dropped unpublished.
///
/// Replacing an existing `dest` swaps the two directories in one
/// `renameat2(RENAME_EXCHANGE)`, so a reader finds the old store or the new
/// one, never none; where the file system cannot swap, the old one is
/// renamed away first (a moment without a store, never a mix). A crash
/// before [`Staging::publish`] leaves `dest` as it was and the hidden
/// `.NAME.*.partial` directory beside it, which is safe to delete.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    dest: PathBuf,
    replace: bool,
    published: bool,
}

impl Staging {
    /// Creates an empty hidden directory beside `dest`
    /// (`.NAME.<pid>-<n>.partial`, with the mode any directory made there
    /// gets), and the parent directories `dest` needs. An existing `dest`
    /// is [`Error::AlreadyExists`] unless `replace`.
    pub fn new(dest: impl AsRef<Path>, replace: bool) -> Result<Staging> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dest = dest.as_ref().to_path_buf();
        let name = dest
            .file_name()
            .ok_or_else(|| Error::InvalidArgument(format!("{} names no directory to create", dest.display())))?
            .to_string_lossy()
            .into_owned();
        if !replace && std::fs::symlink_metadata(&dest).is_ok() {
            return Err(Error::AlreadyExists { path: dest });
        }
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io_err("create directory", &parent))?;
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!(".{name}.{}-{n}.partial", std::process::id()));
            // `create_dir` applies the umask to 0777, as for any directory.
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(Staging { dir, dest, replace, published: false }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create directory", &dir)(e)),
            }
        }
    }

    /// The directory to build in.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where [`Staging::publish`] puts it.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Puts the directory at the destination (see [`Staging`]) and fsyncs
    /// the parent. Everything in it must be durable already (a
    /// store's writer syncs when it closes). A destination that appeared
    /// since [`Staging::new`] without `replace` is [`Error::AlreadyExists`],
    /// and the staged directory is removed.
    pub fn publish(mut self) -> Result<()> {
        let parent = self.dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        let exists = std::fs::symlink_metadata(&self.dest).is_ok();
        if !exists {
            // RENAME_NOREPLACE: a destination created meanwhile is not
            // silently replaced (a plain rename would take an empty one).
            rename_with(&self.dir, &self.dest, rustix::fs::RenameFlags::NOREPLACE)?;
        } else if !self.replace {
            return Err(Error::AlreadyExists { path: self.dest.clone() });
        } else {
            match rename_with(&self.dir, &self.dest, rustix::fs::RenameFlags::EXCHANGE) {
                // The old store now sits at the staging name; removed below.
                Ok(()) => {}
                Err(Error::Io { source, .. })
                    if matches!(source.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) =>
                {
                    let old =
                        parent.join(format!("{}.old", self.dir.file_name().unwrap_or_default().to_string_lossy()));
                    fs::rename(&self.dest, &old)?;
                    fs::rename(&self.dir, &self.dest)?;
                    let _ = std::fs::remove_dir_all(&old);
                }
                Err(e) => return Err(e),
            }
        }
        self.published = true;
        if exists {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        fs::fsync_dir(&parent)
    }
}

/// `renameat2(from, to, flags)`; a file system that does not know the flag
/// answers EINVAL.
fn rename_with(from: &Path, to: &Path, flags: rustix::fs::RenameFlags) -> Result<()> {
    rustix::fs::renameat_with(rustix::fs::CWD, from, rustix::fs::CWD, to, flags).map_err(|e| {
        let source = std::io::Error::from_raw_os_error(e.raw_os_error());
        match source.kind() {
            std::io::ErrorKind::AlreadyExists => Error::AlreadyExists { path: to.into() },
            _ => io_err("rename", to)(source),
        }
    })
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
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
