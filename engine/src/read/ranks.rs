//! The host's rank registry: how many zring processes share a memory cgroup.
//!
//! A training host runs one process per accelerator in one cgroup, and each
//! would otherwise size its record cache as if the limit were its own. The
//! budget ([`crate::read::budget`]) already subtracts the other processes'
//! anonymous memory, which keeps the sum within the limit; the registry makes
//! the split fair: with `n` ranks registered, none takes more than `limit / n`
//! less its own memory, so a rank that started first does not keep the
//! cache the later ones needed.
//!
//! The registry is one small file per cgroup limit, in `/dev/shm` (memory,
//! shared by the processes of a host or container; the temporary directory
//! where there is none), named after a hash of the path of the limit file. A
//! process registers by taking an open file description lock for reading on
//! the byte at its pid, and holds it for its life; the kernel drops it when
//! the process dies, so a rank that dies gives its share back at once. [`count`]
//! asks the kernel for conflicting locks (`F_OFD_GETLK`) from byte 0 up, one
//! call per registered rank. A file that cannot be opened or locked counts
//! one rank: the budget is then as for a process alone.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most ranks counted (a bound on the calls one count makes).
const MAX_RANKS: u64 = 4096;

struct Registered {
    pid: u32,
    key: PathBuf,
    file: Option<File>,
}

static REGISTERED: Mutex<Option<Registered>> = Mutex::new(None);

/// Ranks registered for the cgroup whose limit is set by `limit_file`, this
/// process (registered on first call) included.
pub(crate) fn count(limit_file: &Path) -> u64 {
    let mut g = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if g.as_ref().is_none_or(|r| r.pid != pid || r.key != limit_file) {
        *g = Some(Registered { pid, key: limit_file.to_path_buf(), file: register(limit_file, pid) });
    }
    match g.as_ref().and_then(|r| r.file.as_ref()) {
        Some(f) => 1 + others(f),
        None => 1,
    }
}

/// The registry file of `limit_file`.
fn registry(limit_file: &Path) -> PathBuf {
    // FNV-1a: stable across processes and builds (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in limit_file.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    dir.join(format!("zring-ranks-{h:016x}"))
}

fn register(limit_file: &Path, pid: u32) -> Option<File> {
    let p = registry(limit_file);
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o666).open(&p);
    let file = match file {
        Ok(f) => {
            // Other users' ranks open it too (the umask may have narrowed the mode).
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
            f
        }
        Err(_) => OpenOptions::new().read(true).open(&p).ok()?,
    };
    crate::read::pins::lock(&file, libc::F_RDLCK as i16, pid, 1).ok().filter(|&ok| ok)?;
    Some(file)
}

/// Other descriptions' locks on `f` (this process's own never conflict).
fn others(f: &File) -> u64 {
    let mut n = 0;
    let mut start = 0u32;
    while n < MAX_RANKS {
        let mut l = crate::read::pins::flock(libc::F_WRLCK as i16, start, 0);
        // SAFETY: the descriptor is open while `f` is borrowed; F_OFD_GETLK
        // reads and writes the `flock` struct `l`, which outlives the call.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut l) } != 0 {
            break;
        }
        if l.l_type == libc::F_UNLCK as i16 {
            break;
        }
        n += 1;
        let Ok(next) = u32::try_from(l.l_start + l.l_len.max(1)) else { break };
        start = next;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_count_while_they_live() {
        let key = tempfile::tempdir().unwrap();
        let key = key.path().join("memory.max");
        assert_eq!(count(&key), 1);
        // Another rank (a description of its own, as another process has):
        // registered while its file is open, gone when it closes.
        let other = register(&key, std::process::id() + 1).expect("OFD locks on the registry");
        assert_eq!(count(&key), 2);
        drop(other);
        assert_eq!(count(&key), 1);
        let _ = std::fs::remove_file(registry(&key));
    }
}
