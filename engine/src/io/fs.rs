//! The storage seam: every file operation of the engine outside the batched
//! transfers of [`crate::io::uring`] goes through here, which turns failures
//! into typed errors naming the file and passes the fault-injection hooks
//! ([`crate::io::fault`]).
//!
//! # One door to a store's files
//!
//! A store's files are reached through a [`Dir`]: a descriptor of the store
//! directory, taken once when the store is opened or made, and every file in
//! it is opened, created, renamed and removed relative to that descriptor
//! (`openat`, `renameat`, `unlinkat`), never through a path:
//!
//! * Every open carries `O_NOFOLLOW|O_CLOEXEC`, and a file the engine creates
//!   is created with `O_CREAT|O_EXCL`: a symbolic link (or anything else)
//!   planted at a name the engine writes is never followed and never
//!   truncated. A temporary file's stale copy is unlinked first (`unlinkat`
//!   removes the link, not its target) and the name made new.
//! * Whatever is opened must be a regular file: a FIFO or device planted at a
//!   store file's name is an error. A store's open never waits on a FIFO:
//!   a reader's open of `pins` ([`Dir::open_quiet`]) and a writer's
//!   ([`Dir::open_or_create_mode`]) are made with `O_NONBLOCK`, cleared once
//!   the file is known to be regular; a FIFO planted at a chunk's name still
//!   makes the read that opens it wait for a writer, as before (readers
//!   open chunks when first read, outside every lock, [`crate::io::fds`],
//!   and such a wait can be interrupted).
//! * Every file created gets one mode, [`file_mode`], from the directory's:
//!   written by those who may write the directory, read by those who may
//!   read it (the umask still applies).
//! * Directories inside (a staging directory, an old store being removed) are
//!   opened with `O_DIRECTORY|O_NOFOLLOW` and walked by descriptor
//!   ([`Dir::remove_tree`]), so a directory swapped for a link mid-removal
//!   removes nothing outside it.
//!
//! The path the caller names for the store is resolved once, as given (a
//! link the caller names is the caller's choice); a directory renamed or
//! swapped at that path afterwards is not followed by this handle's writes.
//! The events recorded for the crash simulation still name full paths (the
//! directory's path joined with the file's name).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};

use crate::error::{io_err, Result};
use crate::io::fault::{hit, record, Event, Kind};

/// The mode of every file the engine creates in a store directory of mode
/// `dir_mode`: read and write for the owner; write for the group and others
/// only where they may write the directory ([`lock_mode`]),
/// read where they may read it.
pub(crate) fn file_mode(dir_mode: u32) -> u32 {
    lock_mode(dir_mode) | (dir_mode & 0o044)
}

/// The mode of a store's `lock` file in a directory of mode `dir_mode`: read
/// and write for the owner, and for the group and others only where they may
/// write the directory (and so the store) anyway.
pub(crate) fn lock_mode(dir_mode: u32) -> u32 {
    let mut mode = 0o600;
    if dir_mode & 0o020 != 0 {
        mode |= 0o060;
    }
    if dir_mode & 0o002 != 0 {
        mode |= 0o006;
    }
    mode
}

fn errno(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

/// The error of a store file that is not a regular file (a FIFO, a device,
/// a directory planted at its name).
pub(crate) fn not_regular() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")
}

fn cname(name: &str) -> std::io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput.into())
}

/// A directory held open by descriptor: a store's, or a staging directory's
/// (module docs). Names given to its methods are single path components.
#[derive(Debug)]
pub(crate) struct Dir {
    file: File,
    path: PathBuf,
    /// The mode of files created in it ([`file_mode`]).
    mode: u32,
}

impl Dir {
    /// Opens the directory at `path` (a link `path` itself names is
    /// followed: the caller chose it).
    pub(crate) fn open(path: &Path) -> Result<Dir> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = hit(Kind::Open)
            .and_then(|()| rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty()).map_err(errno))
            .map_err(io_err("open", path))?;
        Dir::from_fd(fd, path.to_path_buf())
    }

    fn from_fd(fd: OwnedFd, path: PathBuf) -> Result<Dir> {
        let file = File::from(fd);
        let m = file.metadata().map_err(io_err("stat", &path))?;
        Ok(Dir { file, path, mode: file_mode(m.mode()) })
    }

    /// The directory's path, for messages (and what it was opened by).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory, for messages.
    pub(crate) fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// The directory's own metadata (through the descriptor).
    pub(crate) fn metadata(&self) -> Result<std::fs::Metadata> {
        self.file.metadata().map_err(io_err("stat", &self.path))
    }

    /// (device, inode) of the directory held.
    pub(crate) fn dev_ino(&self) -> Result<(u64, u64)> {
        let m = self.metadata()?;
        Ok((m.dev(), m.ino()))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn openat(&self, name: &str, flags: OFlags, mode: u32) -> std::io::Result<OwnedFd> {
        hit(Kind::Open)?;
        self.openat_quiet(name, flags, mode)
    }

    /// [`Dir::openat`] outside the fault-injection seam.
    fn openat_quiet(&self, name: &str, flags: OFlags, mode: u32) -> std::io::Result<OwnedFd> {
        let c = cname(name)?;
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(self.fd(), c.as_c_str(), flags, Mode::from_raw_mode(mode)).map_err(errno)
    }

    /// Opens an existing regular file `name` with `flags` (an access mode,
    /// and `O_DIRECT` where wanted); never through a link, and a FIFO or
    /// device in its place is an error (a FIFO's open waits for a writer
    /// first: module docs).
    pub(crate) fn open_with(&self, name: &str, flags: OFlags) -> Result<File> {
        hit(Kind::Open).map_err(io_err("open", self.join(name)))?;
        self.open_regular(name, flags)
    }

    /// [`Dir::open_with`] outside the fault-injection seam, for the opens
    /// whose failure only means "go without" (a reader's pins file, the
    /// writer lock a reader looks at), and that never wait: the file is
    /// opened with `O_NONBLOCK` (a FIFO's open for reading would wait for a
    /// writer), checked to be a regular file, and `O_NONBLOCK` is cleared
    /// again unless `flags` ask for it.
    pub(crate) fn open_quiet(&self, name: &str, flags: OFlags) -> Result<File> {
        let file = self.open_regular(name, flags | OFlags::NONBLOCK)?;
        if !flags.contains(OFlags::NONBLOCK) {
            let fl = rustix::fs::fcntl_getfl(&file).map_err(|e| io_err("open", self.join(name))(errno(e)))?;
            rustix::fs::fcntl_setfl(&file, fl - OFlags::NONBLOCK)
                .map_err(|e| io_err("open", self.join(name))(errno(e)))?;
        }
        Ok(file)
    }

    /// Opens `name` with `flags` and checks it is a regular file.
    fn open_regular(&self, name: &str, flags: OFlags) -> Result<File> {
        let p = || self.join(name);
        let fd = self.openat_quiet(name, flags, 0).map_err(|e| io_err("open", p())(e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", p())(errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io_err("open", p())(not_regular()));
        }
        Ok(File::from(fd))
    }

    /// Opens `name` read-only.
    pub(crate) fn open_read(&self, name: &str) -> Result<File> {
        self.open_with(name, OFlags::RDONLY)
    }

    /// Opens `name` for reading and writing.
    pub(crate) fn open_rw(&self, name: &str) -> Result<File> {
        self.open_with(name, OFlags::RDWR)
    }

    /// Opens `name` for reading and writing, creating it with `mode` if it
    /// does not exist; never through a link, and only a regular file.
    pub(crate) fn open_or_create_mode(&self, name: &str, mode: u32) -> Result<File> {
        let fd = self
            .openat(name, OFlags::RDWR | OFlags::CREATE | OFlags::NONBLOCK, mode)
            .map_err(io_err("open", self.join(name)))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", self.join(name))(errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io_err("open", self.join(name))(not_regular()));
        }
        let fl = rustix::fs::fcntl_getfl(&fd).map_err(|e| io_err("open", self.join(name))(errno(e)))?;
        rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(|e| io_err("open", self.join(name))(errno(e)))?;
        Ok(File::from(fd))
    }

    /// Creates `name`, which must not exist yet (`O_EXCL`), with
    /// [`file_mode`], or `mode` when given.
    pub(crate) fn create_new_mode(&self, name: &str, mode: Option<u32>) -> Result<File> {
        let p = self.join(name);
        let fd = self
            .openat(name, OFlags::RDWR | OFlags::CREATE | OFlags::EXCL, mode.unwrap_or(self.mode))
            .map_err(io_err("create", &p))?;
        record(|| Event::Create(p));
        Ok(File::from(fd))
    }

    /// Creates `name`, which must not exist yet (`O_EXCL`).
    pub(crate) fn create_new(&self, name: &str) -> Result<File> {
        self.create_new_mode(name, None)
    }

    /// Creates `name` empty: whatever is at the name (a stale temporary
    /// file, a link) is unlinked first, then the name is made new with
    /// `O_EXCL`. Never truncates through a name.
    pub(crate) fn create(&self, name: &str) -> Result<File> {
        match self.unlink(name) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", self.join(name))(e)),
        }
        self.create_new(name)
    }

    fn unlink(&self, name: &str) -> std::io::Result<()> {
        let c = cname(name)?;
        rustix::fs::unlinkat(self.fd(), c.as_c_str(), AtFlags::empty()).map_err(errno)
    }

    /// Removes the file (or link, never its target) `name`.
    pub(crate) fn remove(&self, name: &str) -> Result<()> {
        let p = self.join(name);
        self.unlink(name).map_err(io_err("remove", &p))?;
        record(|| Event::Remove(p));
        Ok(())
    }

    /// Reads the whole (small) regular file `name`.
    pub(crate) fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        hit(Kind::Read)?;
        let mut f = match self.open_read(name) {
            Ok(f) => f,
            Err(crate::error::Error::Io { source, .. }) => return Err(source),
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        };
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut b)?;
        Ok(b)
    }

    /// The metadata of `name` itself (a link is not followed).
    pub(crate) fn stat(&self, name: &str) -> std::io::Result<rustix::fs::Stat> {
        let c = cname(name)?;
        rustix::fs::statat(self.fd(), c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)
    }

    /// Whether anything (a link included) is at `name`.
    pub(crate) fn exists(&self, name: &str) -> bool {
        self.stat(name).is_ok()
    }

    /// Whether a regular file is at `name` (a link to one is not).
    pub(crate) fn is_file(&self, name: &str) -> bool {
        self.stat(name).is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::RegularFile)
    }

    /// The names in the directory (without `.` and `..`), each with its type
    /// (a link is a link).
    pub(crate) fn entries(&self) -> Result<Vec<(String, FileType)>> {
        let list = rustix::fs::Dir::read_from(self.fd()).map_err(|e| io_err("list", &self.path)(errno(e)))?;
        let mut out = Vec::new();
        for e in list {
            let e = e.map_err(|e| io_err("list", &self.path)(errno(e)))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let ty = match e.file_type() {
                FileType::Unknown => match self.stat(&name) {
                    Ok(s) => FileType::from_raw_mode(s.st_mode),
                    Err(_) => continue,
                },
                t => t,
            };
            out.push((name, ty));
        }
        Ok(out)
    }

    /// Renames `from` to `to`, both in this directory.
    pub(crate) fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_to(from, self, to, RenameFlags::empty())
    }

    /// `renameat2(self/from, to_dir/to, flags)`.
    pub(crate) fn rename_to(&self, from: &str, to_dir: &Dir, to: &str, flags: RenameFlags) -> Result<()> {
        let (pf, pt) = (self.join(from), to_dir.join(to));
        let r = cname(from).and_then(|f| {
            let t = cname(to)?;
            rustix::fs::renameat_with(self.fd(), f.as_c_str(), to_dir.fd(), t.as_c_str(), flags).map_err(errno)
        });
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(crate::error::Error::AlreadyExists { path: pt })
            }
            Err(e) => return Err(io_err("rename", &pf)(e)),
        }
        record(|| Event::Rename(pf, pt));
        Ok(())
    }

    /// Makes the directory's entries (creations, renames, removals) durable.
    pub(crate) fn fsync(&self) -> Result<()> {
        hit(Kind::Open).map_err(io_err("open", &self.path))?;
        hit(Kind::Fsync).and_then(|()| self.file.sync_all()).map_err(io_err("fsync", &self.path))?;
        record(|| Event::FsyncDir(self.path.clone()));
        Ok(())
    }

    /// Writes a small file atomically: a new temporary file (`NAME.tmp`,
    /// made anew: [`Dir::create`]), fsync, rename over `name`, fsync the
    /// directory. A crash leaves the old file or the new one.
    pub(crate) fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let tmp = format!("{name}.tmp");
        let tp = self.join(&tmp);
        let mut f = self.create(&tmp)?;
        write_all(&mut f, &tp, 0, bytes)?;
        fsync(&f, &tp)?;
        crate::io::fault::crash_point("atomic.before_rename");
        self.rename(&tmp, name)?;
        crate::io::fault::crash_point("atomic.renamed");
        self.fsync()
    }

    /// Makes directory `name` (mode 0777 less the umask, as any directory).
    pub(crate) fn mkdir(&self, name: &str) -> std::io::Result<()> {
        let c = cname(name)?;
        rustix::fs::mkdirat(self.fd(), c.as_c_str(), Mode::from_raw_mode(0o777)).map_err(errno)
    }

    /// Opens directory `name` in this one, never through a link.
    pub(crate) fn open_dir(&self, name: &str) -> Result<Dir> {
        let p = self.join(name);
        let fd =
            self.openat(name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK, 0).map_err(io_err("open", &p))?;
        Dir::from_fd(fd, p)
    }

    /// Removes everything in this directory, walking it by descriptor:
    /// each subdirectory is opened with `O_NOFOLLOW` and emptied the same
    /// way, every other entry (a link included) unlinked by name relative
    /// to its directory's descriptor. Nothing outside the tree is touched,
    /// whatever is swapped in meanwhile. Best effort; the first error is
    /// returned after the rest was tried.
    pub(crate) fn empty(&self) -> std::io::Result<()> {
        self.empty_depth(0)
    }

    fn empty_depth(&self, depth: u32) -> std::io::Result<()> {
        if depth > 64 {
            return Err(std::io::Error::other("directory tree deeper than 64 levels"));
        }
        // Listed whole first, then removed: no unlink under an open listing.
        let mut names = Vec::new();
        for e in rustix::fs::Dir::read_from(self.fd()).map_err(errno)? {
            let e = e.map_err(errno)?;
            let n = e.file_name();
            if n.to_bytes() != b"." && n.to_bytes() != b".." {
                names.push(n.to_owned());
            }
        }
        let mut first = Ok(());
        for c in names {
            let r = match rustix::fs::unlinkat(self.fd(), c.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                // A directory: emptied by descriptor, then removed.
                Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => self.remove_subtree(&c, depth),
                Err(e) => Err(errno(e)),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Removes directory `c` and everything in it by descriptor
    /// ([`Dir::empty`]); a link at `c` is not followed (nor removed).
    fn remove_subtree(&self, c: &std::ffi::CStr, depth: u32) -> std::io::Result<()> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = match rustix::fs::openat(self.fd(), c, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(errno(e)),
        };
        let sub = Dir::from_fd(fd, self.join(c.to_string_lossy().as_ref()))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        sub.empty_depth(depth + 1)?;
        self.remove_dir_held_c(c, &sub)
    }

    /// Removes the (empty) directory `name`, if it is still `held`.
    pub(crate) fn remove_dir_held(&self, name: &str, held: &Dir) -> std::io::Result<()> {
        self.remove_dir_held_c(&cname(name)?, held)
    }

    fn remove_dir_held_c(&self, c: &std::ffi::CStr, held: &Dir) -> std::io::Result<()> {
        let st = rustix::fs::statat(self.fd(), c, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        let (dev, ino) = held.dev_ino().map_err(|e| std::io::Error::other(e.to_string()))?;
        if (st.st_dev, st.st_ino) != (dev, ino) {
            let p = self.join(c.to_string_lossy().as_ref());
            return Err(std::io::Error::other(format!("{} was replaced while it was being removed", p.display())));
        }
        rustix::fs::unlinkat(self.fd(), c, AtFlags::REMOVEDIR).map_err(errno)
    }
}

impl Dir {
    /// The permission bits of the directory held (what files and folders
    /// made in it follow).
    pub(crate) fn dir_mode(&self) -> Result<u32> {
        Ok(self.metadata()?.mode() & 0o7777)
    }

    /// Reads the whole regular file `name`, of at most `max` bytes; never
    /// through a link, and without waiting on a FIFO (opened
    /// `O_NONBLOCK`): anything but a regular file, or a file over `max`
    /// bytes, is an error naming it. `Ok(None)` when nothing is at `name`.
    pub(crate) fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let p = || self.join(name);
        hit(Kind::Read).map_err(io_err("read", p()))?;
        let fd = match self.openat(name, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", p())(e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", p())(errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io_err("open", p())(std::io::Error::other("not a regular file")));
        }
        if st.st_size as u64 > max {
            let e = std::io::Error::other(format!("{} bytes, more than the {max} such a file may hold", st.st_size));
            return Err(io_err("read", p())(e));
        }
        let mut b = Vec::with_capacity(st.st_size as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(File::from(fd), max + 1), &mut b)
            .map_err(io_err("read", p()))?;
        Ok(Some(b))
    }

    /// Opens (creating it with `mode` if need be) the regular file `name`
    /// read-only, for a `flock`: never through a link, never waiting on a
    /// FIFO. Read-only, so a lock file made by another member of the
    /// directory's group with a narrower mode still serves.
    pub(crate) fn open_lock(&self, name: &str, mode: u32) -> Result<File> {
        let p = || self.join(name);
        let fd =
            self.openat(name, OFlags::RDONLY | OFlags::CREATE | OFlags::NONBLOCK, mode).map_err(io_err("open", p()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", p())(errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io_err("open", p())(std::io::Error::other("not a regular file")));
        }
        Ok(File::from(fd))
    }

    /// Makes directory `name` with permission bits `mode` (less the umask,
    /// as any directory).
    pub(crate) fn mkdir_mode(&self, name: &str, mode: u32) -> std::io::Result<()> {
        let c = cname(name)?;
        rustix::fs::mkdirat(self.fd(), c.as_c_str(), Mode::from_raw_mode(mode)).map_err(errno)
    }

    /// Renames `src` (a path, resolved as given: the caller's own) to `to`
    /// in this directory, never replacing what is there.
    pub(crate) fn rename_into(&self, src: &Path, to: &str) -> Result<()> {
        let pt = self.join(to);
        let r = cname(to).and_then(|t| {
            rustix::fs::renameat_with(rustix::fs::CWD, src, self.fd(), t.as_c_str(), RenameFlags::NOREPLACE)
                .map_err(errno)
        });
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(crate::error::Error::AlreadyExists { path: pt })
            }
            Err(e) => return Err(io_err("rename", src)(e)),
        }
        record(|| Event::Rename(src.to_path_buf(), pt));
        Ok(())
    }

    /// Opens the directory at the relative path `rel` (single components
    /// only, no `..`), each component opened with `O_NOFOLLOW`.
    pub(crate) fn open_rel_dir(&self, rel: &str) -> Result<Dir> {
        let mut names = rel.split('/').filter(|c| !c.is_empty());
        let first =
            names.next().ok_or_else(|| crate::error::Error::InvalidArgument(format!("{rel:?} names no directory")))?;
        let mut d = self.open_dir(first)?;
        for n in names {
            d = d.open_dir(n)?;
        }
        Ok(d)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

/// Writes all of `bytes` at `offset` of a file the caller writes sequentially.
pub(crate) fn write_all(f: &mut File, path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    record(|| Event::Write(path.into(), offset, bytes.to_vec()));
    hit(Kind::Write).and_then(|()| f.write_all(bytes)).map_err(io_err("write", path))
}

/// Makes a file's contents durable.
pub(crate) fn fsync(f: &File, path: &Path) -> Result<()> {
    hit(Kind::Fsync).and_then(|()| f.sync_all()).map_err(io_err("fsync", path))?;
    record(|| Event::Fsync(path.into()));
    Ok(())
}

/// Sets a file's length.
pub(crate) fn set_len(f: &File, path: &Path, len: u64) -> Result<()> {
    f.set_len(len).map_err(io_err("truncate", path))?;
    record(|| Event::SetLen(path.into(), len));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Every file made through a directory gets the directory-derived mode
    /// (written by those who may write the directory, read by those who may
    /// read it), less the umask the test runs under.
    #[test]
    fn files_get_the_mode_of_their_directory() {
        // Read, not set: setting it would race the other tests' files.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
            .unwrap();
        for (dir_mode, want) in [(0o755, 0o644), (0o700, 0o600), (0o2775, 0o664), (0o750, 0o640), (0o777, 0o666)] {
            assert_eq!(file_mode(dir_mode), want, "{dir_mode:o}");
            let t = tempfile::tempdir().unwrap();
            std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
            let d = Dir::open(t.path()).unwrap();
            d.create_new("a").unwrap();
            d.open_or_create_mode("b", d.mode).unwrap();
            d.write_atomic("c", b"x").unwrap();
            for n in ["a", "b", "c"] {
                assert_eq!(mode(&t.path().join(n)), want & !umask, "{dir_mode:o} {n}");
            }
        }
    }

    /// A link at a name is removed (never its target) before a file is
    /// made there, and never opened.
    #[test]
    fn links_are_neither_followed_nor_truncated() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let d = Dir::open(t.path()).unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("x.tmp")).unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("y")).unwrap();
        assert!(d.open_read("y").is_err() && d.open_rw("y").is_err() && d.open_or_create_mode("y", 0o600).is_err());
        assert!(d.read("y").is_err());
        assert!(d.create_new("y").is_err(), "O_EXCL: a link at the name is not a new file");
        d.write_atomic("x", b"new").unwrap();
        assert_eq!(std::fs::read(t.path().join("x")).unwrap(), b"new");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // A directory tree with a link to a directory outside it is removed
        // by descriptor; the outside directory keeps its file.
        d.mkdir("tree").unwrap();
        let tree = d.open_dir("tree").unwrap();
        tree.mkdir("sub").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("tree/sub/out")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("tree/out")).unwrap();
        tree.empty().unwrap();
        d.remove_dir_held("tree", &tree).unwrap();
        assert!(!t.path().join("tree").exists());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // A link at a directory's name is not opened as the directory.
        std::os::unix::fs::symlink(outside.path(), t.path().join("dirlink")).unwrap();
        assert!(d.open_dir("dirlink").is_err());
    }
}
