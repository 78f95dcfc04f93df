//! Open file description (OFD) locks on byte ranges through `fcntl`: the
//! locks the snapshot pins and the host's rank registry are made of. An OFD
//! lock belongs to the open file, not the process, so a thread, a forked
//! child or another handle each holding their own description see each
//! other's locks.

use std::fs::File;
use std::os::fd::AsRawFd;

/// A lock of `kind` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) on `len` bytes from
/// `start` (`len` 0: to the end of the file and beyond).
fn flock(kind: libc::c_int, start: u32, len: u32) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as i16;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = libc::off_t::from(start);
    l.l_len = libc::off_t::from(len);
    l
}

/// Takes (or with `F_UNLCK` releases) a lock of `kind` on `len` bytes from
/// `start`; with `wait`, waits for conflicting locks to go. `Ok(false)` when
/// another description holds a conflicting lock and `wait` is off.
pub(crate) fn lock(file: &File, kind: libc::c_int, start: u32, len: u32, wait: bool) -> std::io::Result<bool> {
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    let l = flock(kind, start, len);
    loop {
        // SAFETY: the descriptor is open for as long as `file` is borrowed,
        // and F_OFD_SETLK(W) only reads the `flock` struct `l` points to,
        // which outlives the call.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &l) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// The first lock another description holds that conflicts with a write
/// lock on `len` bytes from `start` (`l_type` is `F_UNLCK` when none does).
pub(crate) fn query(file: &File, start: u32, len: u32) -> std::io::Result<libc::flock> {
    let mut l = flock(libc::F_WRLCK, start, len);
    // SAFETY: the descriptor is open while `file` is borrowed; F_OFD_GETLK
    // reads and writes the `flock` struct `l`, which outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// Who keeps a write lock on a whole file from being taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Another description holds a write lock: only a descriptor opened
    /// for writing can take one.
    Writer,
    /// Others hold read locks only: any descriptor opened for reading can
    /// take one.
    Readers,
}

/// Takes a write lock on the whole of `file` (opened for writing) without
/// waiting. `Ok(None)` when taken, else who holds a conflicting lock.
pub(crate) fn try_write_whole(file: &File) -> std::io::Result<Option<Holder>> {
    // A conflicting lock released between the attempt and the query shows
    // as none: try again.
    for _ in 0..16 {
        if lock(file, libc::F_WRLCK, 0, 0, false)? {
            return Ok(None);
        }
        match i32::from(query(file, 0, 0)?.l_type) {
            libc::F_WRLCK => return Ok(Some(Holder::Writer)),
            libc::F_RDLCK => return Ok(Some(Holder::Readers)),
            _ => continue,
        }
    }
    Ok(Some(Holder::Writer))
}

/// How long [`lock_bounded`] waits by default, in milliseconds
/// (`ZRING_LOCK_WAIT_MS` sets it).
pub(crate) const DEFAULT_WAIT_MS: u64 = 5000;

/// The bound of [`lock_bounded`]: `ZRING_LOCK_WAIT_MS`, else
/// [`DEFAULT_WAIT_MS`].
pub(crate) fn wait_bound() -> std::time::Duration {
    let ms = std::env::var("ZRING_LOCK_WAIT_MS").ok().and_then(|v| v.trim().parse::<u64>().ok());
    std::time::Duration::from_millis(ms.unwrap_or(DEFAULT_WAIT_MS))
}

/// Takes a lock of `kind` on `len` bytes from `start`, trying again with a
/// growing pause (1 ms doubling to 100 ms) while another description holds
/// a conflicting one, for at most `bound`. `Ok(false)` when the bound ran
/// out: whoever holds the conflicting lock held it all that time.
pub(crate) fn lock_bounded(
    file: &File,
    kind: libc::c_int,
    start: u32,
    len: u32,
    bound: std::time::Duration,
) -> std::io::Result<bool> {
    let until = std::time::Instant::now() + bound;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        if lock(file, kind, start, len, false)? {
            return Ok(true);
        }
        let now = std::time::Instant::now();
        if now >= until {
            return Ok(false);
        }
        std::thread::sleep(pause.min(until - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read lock (which any reader can take) is told apart from a write
    /// lock (which needs a descriptor opened for writing).
    #[test]
    fn a_whole_file_write_lock_names_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let open_rw = || std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p);
        let a = open_rw().unwrap();
        let reader = File::open(&p).unwrap();
        assert!(lock(&reader, libc::F_RDLCK, 7, 1, false).unwrap());
        assert_eq!(try_write_whole(&a).unwrap(), Some(Holder::Readers));
        drop(reader);
        assert_eq!(try_write_whole(&a).unwrap(), None);
        let b = open_rw().unwrap();
        assert_eq!(try_write_whole(&b).unwrap(), Some(Holder::Writer));
        // A read-only descriptor cannot take a write lock at all.
        let ro = File::open(&p).unwrap();
        assert!(lock(&ro, libc::F_WRLCK, 0, 0, false).is_err());
    }

    /// The bounded wait gives up after its bound, and takes the lock once
    /// the holder lets go.
    #[test]
    fn a_bounded_wait_ends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let w = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).unwrap();
        assert!(lock(&w, libc::F_WRLCK, 0, 4, false).unwrap());
        let r = File::open(&p).unwrap();
        let bound = std::time::Duration::from_millis(30);
        assert!(!lock_bounded(&r, libc::F_RDLCK, 2, 1, bound).unwrap());
        assert!(lock_bounded(&r, libc::F_RDLCK, 4, 1, bound).unwrap(), "past the held range");
        drop(w);
        assert!(lock_bounded(&r, libc::F_RDLCK, 2, 1, bound).unwrap());
    }
}
