//! The host's rank registry: how many zring processes share a memory cgroup.
//!
//! A training host runs one process per accelerator in one cgroup, and each
//! would otherwise size its record cache as if the limit were its own. The
//! budget ([`crate::memory::budget`]) already subtracts the other processes'
//! anonymous memory, which keeps the sum within the limit; the registry makes
//! the split fair: with `n` ranks registered, none takes more than `limit / n`
//! less its own memory, so a rank that started first does not keep the
//! cache the later ones needed.
//!
//! # Where: a directory only its user can enter
//!
//! Each user has a directory `zring-<uid>` in `/dev/shm` (memory, shared by
//! the processes of a host or of a container; `ZRING_REGISTRY_DIR` names
//! another place, and the temporary directory stands in where there is no
//! `/dev/shm`). zring makes it mode 0700 and uses it only when `fstat` of the
//! directory, opened without following a symlink, shows a directory owned by
//! the process's effective user that no one else may enter. Anything else at
//! that name (a symlink, another user's directory, one open to the group or
//! others) is refused with one warning on stderr, and the process counts
//! itself alone. The directory stays when it empties, so its name cannot be
//! taken by another user between jobs.
//!
//! Inside it each cgroup has one file, `ranks-<dev>-<inode>`, named after the
//! device and inode number of the cgroup's directory: the cgroup's identity,
//! the same wherever the cgroup file system is mounted (a container with a
//! cgroup namespace sees another path for it), and never shared by two
//! cgroups (two containers' cgroups can have the same path in their
//! namespaces). The file is made 0600 and opened relative to the checked
//! directory's descriptor, `O_NOFOLLOW | O_CLOEXEC`; zring changes the mode of
//! nothing. Another user can neither read, lock, replace nor redirect it.
//!
//! # Ranks: one slot each
//!
//! A rank registers by taking an open file description write lock on one byte
//! of the file, the lowest free one (its *slot*), and holds it for its life.
//! The kernel drops the lock when the process dies, however it dies, so a rank
//! that dies gives its share back at once. Slots, not pids, tell ranks apart:
//! two ranks with one pid in different PID namespaces hold two slots. [`count`]
//! asks the kernel for conflicting locks (`F_OFD_GETLK`) over the slots,
//! splitting the range around each lock it finds (2n + 1 calls for `n` other
//! ranks: no scan of empty slots, and no reliance on the order in which the
//! kernel reports locks).
//!
//! # Leaving: the last rank removes the file
//!
//! At exit (an `atexit` handler), or when the process finds itself in another
//! cgroup, a rank locks the whole file for writing, which succeeds only when
//! no other rank holds a slot, and then removes the file if it is still the
//! one linked at its name. A newcomer that opened the file just before keeps
//! nothing stale: after taking its slot it checks that the name still links
//! the file it holds, and starts again if not; a newcomer that meets the whole
//! file locked waits for the leaver (an instant) and then finds it unlinked.
//! Files of ranks that all died without running exit handlers (killed) are
//! removed the same way by the next rank of that user that registers.
//!
//! # Without a shared registry
//!
//! Ranks that cannot see one registry count themselves alone: ranks run as
//! different users, and containers that do not share `/dev/shm` (Docker's
//! default, unless the containers share an IPC namespace; a Kubernetes pod's
//! containers do share it). Each then takes up to the whole limit less what the
//! cgroup's other processes already hold, so the sum of the caches still stays
//! within the limit, but the ranks that fill their caches first keep memory the
//! later ones would have had. Mounting one directory into every container and
//! naming it in `ZRING_REGISTRY_DIR` makes them count each other. A registry
//! that cannot be made, opened or locked counts one rank the same way; when a
//! person can fix why (the file system is full, read-only or refuses this
//! user, or `ZRING_REGISTRY_DIR` names a place that does not work), or
//! something not to be trusted is there, one warning on stderr says what and
//! names `ZRING_REGISTRY_DIR`.
//!
//! Without the registry the budgets still hold: each process also watches
//! its cgroup's usage against the limit and shrinks its record cache as the
//! usage nears it ([`crate::memory::budget`], "Usage"), so a rank that counts
//! itself alone is not OOM-killed; the registry only makes the split fair.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, TryLockError};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};

/// Slots in a registry file: the most ranks one cgroup counts.
const MAX_RANKS: u32 = 4096;

/// How often a newcomer starts again when the file it opened was removed
/// under it (each time means a rank left in that instant).
const ATTEMPTS: u32 = 8;

/// This process's registration.
struct Registered {
    pid: u32,
    /// The cgroup registered for ([`cgroup_id`]).
    cgroup: (u64, u64),
    rank: Option<Rank>,
}

static REGISTERED: Mutex<Option<Registered>> = Mutex::new(None);

/// Ranks registered for the cgroup whose limit is set by `limit_file`, this
/// process (registered on first call) included.
pub(crate) fn count(limit_file: &Path) -> u64 {
    let Some(cgroup) = cgroup_id(limit_file) else { return 1 };
    let mut g = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if g.as_ref().is_none_or(|r| r.pid != pid || r.cgroup != cgroup) {
        if let Some(old) = g.take() {
            // A forked child's copy of its parent's registration shares the
            // parent's lock: closing the copy is all the child may do.
            if old.pid == pid {
                if let Some(rank) = old.rank {
                    rank.leave();
                }
            }
        }
        let base = base();
        let rank = match Rank::join(&base, cgroup) {
            Ok(rank) => Some(rank),
            Err(Unusable::Refused(why)) => {
                warn_once(&warning(&why, crate::env::registry_dir().is_some(), true));
                None
            }
            Err(Unusable::Failed(why)) => {
                warn_once(&warning(&why, crate::env::registry_dir().is_some(), false));
                None
            }
            Err(Unusable::Unavailable) => None,
        };
        *g = Some(Registered { pid, cgroup, rank });
        leave_at_exit();
    }
    match g.as_ref().and_then(|r| r.rank.as_ref()) {
        Some(rank) => 1 + rank.others(),
        None => 1,
    }
}

/// The identity of the cgroup whose limit is set by `limit_file`: device and
/// inode number of its directory.
fn cgroup_id(limit_file: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(limit_file.parent()?).ok()?;
    Some((m.dev(), m.ino()))
}

/// Where the users' registry directories are (module docs).
fn base() -> PathBuf {
    if let Some(dir) = crate::env::registry_dir() {
        return dir;
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Why a process counts itself alone.
#[derive(Debug)]
enum Unusable {
    /// Something not to be trusted is where the registry should be (says what).
    Refused(String),
    /// The registry could not be made where it should be, for a reason a
    /// person can fix: the file system is full or refuses this user (says
    /// what).
    Failed(String),
    /// The registry cannot be made or locked here (no such directory, no OFD
    /// locks): nothing to warn about.
    Unavailable,
}

/// Whether an error making the registry is one to tell about ([`Unusable::Failed`]).
fn worth_telling(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    matches!(e, Errno::NOSPC | Errno::DQUOT | Errno::ACCESS | Errno::PERM | Errno::ROFS)
}

/// An error making `path` under the registry's `base`: `Failed` when a
/// person can fix it ([`worth_telling`]), or always when `ZRING_REGISTRY_DIR`
/// named the place.
fn failed(path: &Path, e: rustix::io::Errno) -> Unusable {
    if worth_telling(e) || crate::env::registry_dir().is_some() {
        Unusable::Failed(format!("{} cannot be made: {}", path.display(), std::io::Error::from(e)))
    } else {
        Unusable::Unavailable
    }
}

/// The warning of a process that counts itself alone because of `why`;
/// `named` when `ZRING_REGISTRY_DIR` chose the place, `refused` when
/// something is in the way there ([`Unusable::Refused`]) rather than the
/// place failing ([`Unusable::Failed`]).
fn warning(why: &str, named: bool, refused: bool) -> String {
    let place =
        if named { "set ZRING_REGISTRY_DIR to another directory" } else { "set ZRING_REGISTRY_DIR to a directory" };
    let other = if refused {
        "have the path above removed (by its owner or an administrator)"
    } else {
        "make room or write access there"
    };
    format!(
        "zring: the rank registry is unusable: {why}. The processes that share this memory limit cannot count \
         each other, so their record caches are not split fairly (each still shrinks its cache as the cgroup's \
         usage nears its limit). To fix it, {place} that this user owns and can write, the same for every rank \
         of the job (e.g. ZRING_REGISTRY_DIR=$HOME/.cache/zring), or {other}."
    )
}

fn warn_once(text: &str) {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| eprintln!("{text}"));
}

/// This process's slot in its cgroup's registry file.
struct Rank {
    /// The user's registry directory, checked ([`user_dir`]).
    dir: OwnedFd,
    name: String,
    file: File,
}

impl Rank {
    /// Registers in the registry of `cgroup` under `base` (module docs).
    fn join(base: &Path, cgroup: (u64, u64)) -> Result<Rank, Unusable> {
        let name = format!("ranks-{:x}-{:x}", cgroup.0, cgroup.1);
        let dir = user_dir(base)?;
        sweep(&dir, &name);
        for _ in 0..ATTEMPTS {
            let fd = rustix::fs::openat(
                &dir,
                name.as_str(),
                OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| failed(Path::new(&shown(base, &name)), e))?;
            let st = rustix::fs::fstat(&fd).map_err(|_| Unusable::Unavailable)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                return Err(Unusable::Refused(format!("{} is not a regular file", shown(base, &name))));
            }
            let file = File::from(fd);
            if !take_slot(&file).map_err(|_| Unusable::Unavailable)? {
                return Err(Unusable::Unavailable);
            }
            if linked(&dir, &name, &file) {
                return Ok(Rank { dir, name, file });
            }
        }
        Err(Unusable::Unavailable)
    }

    /// Other ranks registered in this rank's file.
    fn others(&self) -> u64 {
        held(&self.file)
    }

    /// Unregisters; the last rank to leave removes the file (module docs).
    fn leave(self) {
        if matches!(lock(&self.file, libc::F_SETLK, libc::F_WRLCK, 0, 0), Ok(true))
            && linked(&self.dir, &self.name, &self.file)
        {
            let _ = rustix::fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// `name` in the registry directory of this user under `base`, for messages.
fn shown(base: &Path, name: &str) -> String {
    base.join(format!("zring-{}", rustix::process::geteuid().as_raw())).join(name).display().to_string()
}

/// Opens (making it if needed) this user's registry directory under `base`,
/// and checks that only this user can enter it (module docs).
fn user_dir(base: &Path) -> Result<OwnedFd, Unusable> {
    let uid = rustix::process::geteuid().as_raw();
    let name = format!("zring-{uid}");
    let path = base.join(&name);
    let base = rustix::fs::openat(CWD, base, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| failed(base, e))?;
    match rustix::fs::mkdirat(&base, name.as_str(), Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(failed(&path, e)),
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = match rustix::fs::openat(&base, name.as_str(), flags, Mode::empty()) {
        Ok(dir) => dir,
        // O_NOFOLLOW on a symlink; O_DIRECTORY on anything else.
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return Err(Unusable::Refused(format!("{} is not a directory", path.display())))
        }
        Err(rustix::io::Errno::ACCESS) => {
            return Err(Unusable::Refused(format!("{} is not this user's to open", path.display())))
        }
        Err(_) => return Err(Unusable::Unavailable),
    };
    let st = rustix::fs::fstat(&dir).map_err(|_| Unusable::Unavailable)?;
    if st.st_uid != uid {
        return Err(Unusable::Refused(format!("{} belongs to uid {}, not {uid}", path.display(), st.st_uid)));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(Unusable::Refused(format!(
            "{} has mode {:o}: others may enter it",
            path.display(),
            st.st_mode & 0o7777
        )));
    }
    Ok(dir)
}

/// Whether `name` in `dir` is still the file `file` is open on (a rank that
/// left may have removed it after `file` was opened).
fn linked(dir: &OwnedFd, name: &str, file: &File) -> bool {
    match (rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW), rustix::fs::fstat(file)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

/// Removes the registry files in `dir` other than `keep` that no rank holds
/// (their ranks were killed before they could leave).
fn sweep(dir: &OwnedFd, keep: &str) {
    let Ok(list) = rustix::fs::Dir::read_from(dir) else { return };
    for entry in list.flatten() {
        let name = entry.file_name().to_string_lossy();
        if !name.starts_with("ranks-") || name == keep {
            continue;
        }
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let Ok(fd) = rustix::fs::openat(dir, name.as_ref(), flags, Mode::empty()) else { continue };
        let file = File::from(fd);
        if matches!(lock(&file, libc::F_SETLK, libc::F_WRLCK, 0, 0), Ok(true)) && linked(dir, &name, &file) {
            let _ = rustix::fs::unlinkat(dir, name.as_ref(), AtFlags::empty());
        }
    }
}

/// Takes the lowest free slot of `file`; `false` when every slot is taken.
fn take_slot(file: &File) -> std::io::Result<bool> {
    let mut slot = 0;
    // Each pass either moves past a held slot or meets one freed since the
    // failed attempt; the bound only guards against endless churn.
    for _ in 0..2 * MAX_RANKS {
        if slot >= MAX_RANKS {
            return Ok(false);
        }
        if lock(file, libc::F_SETLK, libc::F_WRLCK, slot, 1)? {
            return Ok(true);
        }
        let l = query(file, slot, 1)?;
        if l.l_type == libc::F_UNLCK as i16 {
            continue;
        }
        if l.l_len == 0 {
            // The whole file: a rank leaving, about to remove it. Waiting for
            // it gives a slot in a file the caller then finds unlinked.
            lock(file, libc::F_SETLKW, libc::F_WRLCK, slot, 1)?;
            return Ok(true);
        }
        slot += 1;
    }
    Ok(false)
}

/// Locks other descriptions hold on the slots of `file` (this process's own
/// never conflict, so are not counted).
fn held(file: &File) -> u64 {
    let mut n = 0;
    let mut ranges = vec![(0u32, MAX_RANKS)];
    let mut calls = 2 * MAX_RANKS + 1;
    while let Some((start, end)) = ranges.pop() {
        if start >= end || calls == 0 {
            continue;
        }
        calls -= 1;
        let Ok(l) = query(file, start, end - start) else { continue };
        if l.l_type == libc::F_UNLCK as i16 {
            continue;
        }
        n += 1;
        let from = u32::try_from(l.l_start.max(i64::from(start))).unwrap_or(end);
        let to = if l.l_len == 0 { end } else { u32::try_from(l.l_start + l.l_len).unwrap_or(end).min(end) };
        ranges.push((start, from));
        ranges.push((to, end));
    }
    n
}

/// The first lock another description holds that conflicts with a write
/// lock on `len` bytes from `start` ([`crate::io::locks::query`]).
fn query(file: &File, start: u32, len: u32) -> std::io::Result<libc::flock> {
    crate::io::locks::query(file, start, len)
}

/// Takes an OFD lock of `kind` on `len` bytes from `start` (0: to the end and
/// beyond) with `cmd` (`F_SETLK` for at once, `F_SETLKW` to wait): `Ok(false)`
/// when another description holds a conflicting lock and `cmd` does not wait.
fn lock(file: &File, cmd: libc::c_int, kind: libc::c_int, start: u32, len: u32) -> std::io::Result<bool> {
    crate::io::locks::lock(file, kind, start, len, cmd == libc::F_SETLKW)
}

/// Registers (once per process) the exit handler that unregisters this
/// process, so the last rank to exit removes its cgroup's file.
fn leave_at_exit() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        crate::io::process::at_exit(on_exit);
    });
}

extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(|| {
        // Another thread may hold the registration as the process exits:
        // leaving is a courtesy, never worth a hang at exit.
        let mut g = match REGISTERED.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let pid = std::process::id();
        if let Some(rank) = g.take_if(|r| r.pid == pid).and_then(|r| r.rank) {
            rank.leave();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn cgroup(dir: &tempfile::TempDir) -> (u64, u64) {
        cgroup_id(&dir.path().join("memory.max")).unwrap()
    }

    fn files(base: &Path) -> Vec<String> {
        let dir = base.join(format!("zring-{}", rustix::process::geteuid().as_raw()));
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn each_rank_holds_a_slot_and_the_last_to_leave_removes_the_file() {
        let base = tempfile::tempdir().unwrap();
        let cg = tempfile::tempdir().unwrap();
        let key = cgroup(&cg);
        // Every rank a description of its own, as every process has.
        let a = Rank::join(base.path(), key).unwrap();
        assert_eq!(a.others(), 0);
        let b = Rank::join(base.path(), key).unwrap();
        let c = Rank::join(base.path(), key).unwrap();
        let d = Rank::join(base.path(), key).unwrap();
        assert_eq!((a.others(), b.others(), d.others()), (3, 3, 3));
        // A rank that dies (its description closes) is not counted; a
        // newcomer takes its slot, and a gap below others' slots counts right.
        drop(b);
        assert_eq!(a.others(), 2);
        let e = Rank::join(base.path(), key).unwrap();
        assert_eq!(a.others(), 3);
        drop(c);
        assert_eq!((a.others(), e.others()), (2, 2));
        let user = base.path().join(format!("zring-{}", rustix::process::geteuid().as_raw()));
        let meta = std::fs::symlink_metadata(&user).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
        assert_eq!(files(base.path()), vec![format!("ranks-{:x}-{:x}", key.0, key.1)]);
        let file = user.join(&files(base.path())[0]);
        assert_eq!(std::fs::symlink_metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        // Leaving while others are registered keeps the file; the last removes it.
        e.leave();
        d.leave();
        assert_eq!(files(base.path()).len(), 1);
        assert_eq!(a.others(), 0);
        a.leave();
        assert!(files(base.path()).is_empty());
        // The user's directory stays (its name is not left for others to take).
        assert!(user.is_dir());
    }

    #[test]
    fn a_newcomer_never_registers_in_a_removed_file() {
        let base = tempfile::tempdir().unwrap();
        let cg = tempfile::tempdir().unwrap();
        let key = cgroup(&cg);
        let leaver = Rank::join(base.path(), key).unwrap();
        // The leaver's first step: the whole file, which no other rank holds.
        assert!(lock(&leaver.file, libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap());
        let b = base.path().to_path_buf();
        let newcomer = std::thread::spawn(move || Rank::join(&b, key).unwrap());
        leaver.leave();
        let newcomer = newcomer.join().unwrap();
        assert!(linked(&newcomer.dir, &newcomer.name, &newcomer.file));
        let third = Rank::join(base.path(), key).unwrap();
        assert_eq!(third.others(), 1);
    }

    #[test]
    fn files_of_killed_ranks_are_swept_by_the_next_rank() {
        let base = tempfile::tempdir().unwrap();
        let (cg1, cg2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let killed = Rank::join(base.path(), cgroup(&cg1)).unwrap();
        let alive = Rank::join(base.path(), cgroup(&cg1)).unwrap();
        drop(killed); // closed without leaving, as a killed process's
        let _other = Rank::join(base.path(), cgroup(&cg2)).unwrap();
        assert_eq!(files(base.path()).len(), 2, "a file a rank still holds stays");
        drop(alive);
        let _other = Rank::join(base.path(), cgroup(&cg2)).unwrap();
        let key = cgroup(&cg2);
        assert_eq!(files(base.path()), vec![format!("ranks-{:x}-{:x}", key.0, key.1)]);
    }

    #[test]
    fn a_registry_directory_others_can_reach_is_refused() {
        let uid = rustix::process::geteuid().as_raw();
        let cg = tempfile::tempdir().unwrap();
        let key = cgroup(&cg);
        // Open to others.
        let base = tempfile::tempdir().unwrap();
        let user = base.path().join(format!("zring-{uid}"));
        std::fs::create_dir(&user).unwrap();
        std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = Rank::join(base.path(), key).err().expect("refused");
        assert!(matches!(&e, Unusable::Refused(why) if why.contains("mode 755")), "{e:?}");
        assert!(std::fs::read_dir(&user).unwrap().next().is_none(), "nothing made in it");
        // A symlink to a private directory: not followed.
        let base = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(target.path(), base.path().join(format!("zring-{uid}"))).unwrap();
        let e = Rank::join(base.path(), key).err().expect("refused");
        assert!(matches!(&e, Unusable::Refused(why) if why.contains("not a directory")), "{e:?}");
        assert!(std::fs::read_dir(target.path()).unwrap().next().is_none(), "nothing made in the target");
        // A file.
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join(format!("zring-{uid}")), b"x").unwrap();
        assert!(matches!(Rank::join(base.path(), key), Err(Unusable::Refused(_))));
    }

    /// A full tmpfs (ENOSPC) used to turn the registry off silently; another
    /// user's directory at the name told root to remove it and named nothing
    /// else to do.
    #[test]
    fn a_registry_that_cannot_be_used_is_told_with_what_to_do() {
        let dir = Path::new("/dev/shm/zring-0");
        let full = failed(dir, rustix::io::Errno::NOSPC);
        let Unusable::Failed(why) = &full else { panic!("{full:?}") };
        assert_eq!(why, "/dev/shm/zring-0 cannot be made: No space left on device (os error 28)");
        for e in [rustix::io::Errno::DQUOT, rustix::io::Errno::ACCESS, rustix::io::Errno::ROFS] {
            assert!(matches!(failed(dir, e), Unusable::Failed(_)), "{e:?}");
        }
        let text = warning(why, false, false);
        assert!(text.contains("No space left on device"), "{text}");
        assert!(text.contains("set ZRING_REGISTRY_DIR to a directory that this user owns and can write"), "{text}");
        assert!(text.contains("shrinks its cache as the cgroup's usage nears its limit"), "{text}");
        assert!(text.ends_with("or make room or write access there."), "{text}");
        // Something not to be trusted at the place named.
        let base = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        std::fs::create_dir(base.path().join(format!("zring-{uid}"))).unwrap();
        std::fs::set_permissions(base.path().join(format!("zring-{uid}")), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let cg = tempfile::tempdir().unwrap();
        let Err(Unusable::Refused(why)) = Rank::join(base.path(), cgroup(&cg)) else { panic!("not refused") };
        let text = warning(&why, true, true);
        assert!(text.contains("mode 777") && text.contains("ZRING_REGISTRY_DIR to another directory"), "{text}");
        assert!(text.ends_with("removed (by its owner or an administrator)."), "{text}");
    }

    #[test]
    fn a_process_counts_itself() {
        let cg = tempfile::tempdir().unwrap();
        assert_eq!(count(&cg.path().join("memory.max")), 1);
    }
}
