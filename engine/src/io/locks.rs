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
