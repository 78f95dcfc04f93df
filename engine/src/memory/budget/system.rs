//! What the system says of memory, read from its files under a root (`/`,
//! or a test's tree): `/proc/meminfo` and `/proc/self/status`, where the
//! cgroups are mounted and which limit binds this process, and a cgroup's
//! `memory.stat` (module docs of [`crate::memory::budget`]).

use std::path::{Path, PathBuf};

/// Cgroup limits at or above this are "no limit": v1 writes `PAGE_COUNTER_MAX`
/// pages (9223372036854771712 with 4 KiB pages) for unlimited, and no machine
/// has 4 EiB of memory.
pub(super) const UNLIMITED_FROM: u64 = 1 << 62;

/// Reads the files of a cgroup: the real ones under a root, or a test's.
pub(crate) trait Files {
    /// The text of `path` (absolute), `None` when it cannot be read.
    fn read(&self, path: &Path) -> Option<String>;
}

/// The files of the tree at a root (standing for `/`).
pub(crate) struct Under<'a>(pub &'a Path);

impl Files for Under<'_> {
    fn read(&self, path: &Path) -> Option<String> {
        read(self.0, path)
    }
}

/// The value of `key` in a `memory.stat` (`key value` lines).
pub(super) fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `path` (absolute) inside the tree at `root`.
pub(super) fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

pub(super) fn read(root: &Path, path: &Path) -> Option<String> {
    std::fs::read_to_string(under(root, path)).ok()
}

/// Resident memory of this process, its mapped files included (`VmRSS` of
/// `/proc/self/status`; module docs: why the mapped files count).
pub(crate) fn process_rss(root: &Path) -> Option<u64> {
    let status = read(root, Path::new("/proc/self/status"))?;
    kib_field(&status, "VmRSS:")
}

/// A `Name:   123 kB` line of a /proc file, in bytes.
pub(super) fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What `/proc/meminfo` says, in bytes.
pub(super) struct MemInfo {
    pub(super) total: Option<u64>,
    pub(super) available: Option<u64>,
}

pub(super) fn meminfo(root: &Path) -> MemInfo {
    let text = read(root, Path::new("/proc/meminfo")).unwrap_or_default();
    MemInfo { total: kib_field(&text, "MemTotal:"), available: kib_field(&text, "MemAvailable:") }
}

/// Anonymous memory of every process in the cgroup that sets the limit `l`
/// (its `memory.stat`: `anon` on v2, `total_rss` on v1, both counting the
/// cgroups below it).
pub(super) fn cgroup_anon(root: &Path, l: &CgroupLimit) -> Option<u64> {
    let stat = read(root, &l.file.parent()?.join("memory.stat"))?;
    stat_field(&stat, if l.version == 2 { "anon" } else { "total_rss" })
}

/// The binding cgroup memory limit of this process.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CgroupLimit {
    /// 2 or 1.
    pub version: u8,
    pub limit: u64,
    /// The file that set it, as an absolute path (outside `root`).
    pub file: PathBuf,
}

/// One cgroup file system mount: where it is mounted, and which directory of
/// the hierarchy appears there (not `/` when a container sees a subtree).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Mount {
    point: PathBuf,
    root: String,
}

/// Finds the smallest memory limit of this process's cgroup and its
/// ancestors: v2 first, then v1 (a hybrid host mounts v2 without the memory
/// controller, whose files then exist only under v1).
pub(super) fn cgroup_limit(root: &Path) -> Option<CgroupLimit> {
    // The process's cgroups and their mounts are found once per process
    // (mountinfo can run to thousands of lines in a container host); the
    // limits are read afresh at every look.
    static PLACES: std::sync::OnceLock<Vec<(u8, Mount, String)>> = std::sync::OnceLock::new();
    let found;
    let places = if root == Path::new("/") {
        PLACES.get_or_init(|| cgroup_places(root))
    } else {
        found = cgroup_places(root);
        &found
    };
    places.iter().find_map(|(version, mount, path)| {
        let file = if *version == 2 { "memory.max" } else { "memory.limit_in_bytes" };
        let (limit, file) = smallest_limit(root, mount, path, file)?;
        Some(CgroupLimit { version: *version, limit, file })
    })
}

/// Where this process's memory cgroups are: (version, mount, path in the
/// hierarchy), v2 first, then v1 (a hybrid host mounts v2 without the memory
/// controller, whose files then exist only under v1).
pub(super) fn cgroup_places(root: &Path) -> Vec<(u8, Mount, String)> {
    let Some(cgroups) = read(root, Path::new("/proc/self/cgroup")) else { return Vec::new() };
    let mountinfo = read(root, Path::new("/proc/self/mountinfo")).unwrap_or_default();
    let mut v2 = None;
    let mut v1 = None;
    for line in cgroups.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else { continue };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    let mut out = Vec::new();
    if let Some(path) = v2 {
        let mount = find_mount(&mountinfo, path, |fstype, _| fstype == "cgroup2")
            .unwrap_or_else(|| Mount { point: "/sys/fs/cgroup".into(), root: "/".into() });
        out.push((2, mount, path.to_string()));
    }
    if let Some(path) = v1 {
        let mount =
            find_mount(&mountinfo, path, |fstype, opts| fstype == "cgroup" && opts.split(',').any(|o| o == "memory"))
                .unwrap_or_else(|| Mount { point: "/sys/fs/cgroup/memory".into(), root: "/".into() });
        out.push((1, mount, path.to_string()));
    }
    out
}

/// The mount in `mountinfo` of a cgroup file system `wanted(fstype,
/// super_options)` whose root contains `path`, or failing that the first one.
/// mountinfo lines are `id parent major:minor root point options [optional
/// fields] - fstype source super_options`.
pub(super) fn find_mount(mountinfo: &str, path: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<Mount> {
    let mut first = None;
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else { continue };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 || !wanted(post[0], post[2]) {
            continue;
        }
        let m = Mount { point: unescape(pre[4]).into(), root: unescape(pre[3]) };
        if within(path, &m.root).is_some() {
            return Some(m);
        }
        first.get_or_insert(m);
    }
    first
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
pub(super) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` relative to the mount's `root` if it lies inside it.
pub(super) fn within<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
}

/// The smallest limit in `file` from the process's cgroup directory up to the
/// mount point, and the file that holds it. Directories that do not exist (a
/// container whose cgroup path names a directory it cannot see) are skipped on
/// the way up; `None` when no level has a limit.
pub(super) fn smallest_limit(root: &Path, mount: &Mount, path: &str, file: &str) -> Option<(u64, PathBuf)> {
    // A path outside the mount's root (a mount made in another cgroup
    // namespace) can only be judged from the mount point itself.
    let rel = within(path, &mount.root).unwrap_or("");
    let mut dir = mount.point.join(rel);
    let mut best: Option<(u64, PathBuf)> = None;
    loop {
        let f = dir.join(file);
        if let Some(limit) = read(root, &f).and_then(|s| parse_limit(&s)) {
            if best.as_ref().is_none_or(|(b, _)| limit < *b) {
                best = Some((limit, f));
            }
        }
        if dir == mount.point || !dir.pop() || !dir.starts_with(&mount.point) {
            break;
        }
    }
    best
}

/// A limit file's value; `None` for "max" (v2), for the huge values v1 writes
/// for no limit, and for anything unreadable.
pub(super) fn parse_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < UNLIMITED_FROM).then_some(v)
}
