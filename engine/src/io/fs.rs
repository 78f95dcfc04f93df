//! The storage seam: every file operation of the engine outside the batched
//! transfers of [`crate::io::uring`] goes through these functions, which turn
//! failures into typed errors naming the file and pass the fault-injection
//! hooks ([`crate::io::fault`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{io_err, Result};
use crate::io::fault::{hit, record, Event, Kind};

/// Opens `path` with `opts`.
pub(crate) fn open(path: &Path, opts: &OpenOptions) -> Result<File> {
    hit(Kind::Open).and_then(|()| opts.open(path)).map_err(io_err("open", path))
}

/// Opens `path` read-only.
pub(crate) fn open_read(path: &Path) -> Result<File> {
    open(path, OpenOptions::new().read(true))
}

/// Opens `path` for reading and writing.
pub(crate) fn open_rw(path: &Path) -> Result<File> {
    open(path, OpenOptions::new().read(true).write(true))
}

/// Creates `path`, which must not exist yet.
pub(crate) fn create_new(path: &Path) -> Result<File> {
    let f = hit(Kind::Open)
        .and_then(|()| OpenOptions::new().read(true).write(true).create_new(true).open(path))
        .map_err(io_err("create", path))?;
    record(|| Event::Create(path.into()));
    Ok(f)
}

/// Creates or truncates `path`.
pub(crate) fn create(path: &Path) -> Result<File> {
    let f = hit(Kind::Open)
        .and_then(|()| OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path))
        .map_err(io_err("create", path))?;
    record(|| Event::Create(path.into()));
    Ok(f)
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

/// Makes a directory's entries (creations, renames, removals) durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    let d = open_read(dir)?;
    hit(Kind::Fsync).and_then(|()| d.sync_all()).map_err(io_err("fsync", dir))?;
    record(|| Event::FsyncDir(dir.into()));
    Ok(())
}

/// Sets a file's length.
pub(crate) fn set_len(f: &File, path: &Path, len: u64) -> Result<()> {
    f.set_len(len).map_err(io_err("truncate", path))?;
    record(|| Event::SetLen(path.into(), len));
    Ok(())
}

/// Removes a file.
pub(crate) fn remove(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(io_err("remove", path))?;
    record(|| Event::Remove(path.into()));
    Ok(())
}

/// Reads a whole (small) file.
pub(crate) fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    hit(Kind::Read)?;
    std::fs::read(path)
}

/// Renames `from` to `to` (atomic on POSIX file systems).
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(io_err("rename", from))?;
    record(|| Event::Rename(from.into(), to.into()));
    Ok(())
}

/// Writes a small file atomically: a temporary file, fsync, rename over
/// `name`, fsync the directory. A crash leaves the old file or the new one.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = create(&tmp)?;
    write_all(&mut f, &tmp, 0, bytes)?;
    fsync(&f, &tmp)?;
    crate::io::fault::crash_point("atomic.before_rename");
    rename(&tmp, &dir.join(name))?;
    crate::io::fault::crash_point("atomic.renamed");
    fsync_dir(dir)
}
