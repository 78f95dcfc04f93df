//! The memory budget, and the read policy that follows from it.
//!
//! A store read at random either fits in memory or it does not, and the two
//! cases want opposite machinery. While the data fits, the kernel's page cache
//! keeps all of it after one pass and buffered reads (or copies from the
//! mapped chunks) are the cheapest thing there is. Once it does not fit, the
//! page cache stops helping: on an epoch of a random permutation its
//! (approximately LRU) replacement evicts almost every page before it is read
//! again, and it still costs a copy and the kernel's bookkeeping per page. Then
//! reads should bypass it (O_DIRECT) and the memory should hold a fixed subset
//! of the records instead ([`crate::memory::cache`]), which serves exactly its share of
//! every epoch. This module decides which case a store is in.
//!
//! # The budget ([`Budget`], [`detect`])
//!
//! The memory this process may fill with the store's data, from the first
//! source that applies:
//!
//! 1. an explicit setting (the builder);
//! 2. `ZRING_CACHE_BYTES`: plain bytes or a number with a binary unit (`512M`,
//!    `8G`, `1.5GiB`; K, M, G, T, P with or without `i`/`B`, any case, all
//!    powers of 1024: memory sizes written this way (Docker, the JVM, Slurm)
//!    almost always mean the binary ones). An empty value counts as unset, as
//!    shells write `VAR= cmd` for "no value". A value that does not parse is
//!    [`Error::InvalidArgument`] naming the variable: silently falling back to
//!    a detected budget would hide the typo behind a plausible number. A
//!    stated amount is taken at face value (see the policy below): `8G` lets
//!    the data fill 8 GiB of page cache or record cache, and `0` caches
//!    nothing and reads any non-empty store with O_DIRECT;
//! 3. the cgroup memory limit (v2 `memory.max`, else v1
//!    `memory.limit_in_bytes`; the smallest limit of the process's cgroup and
//!    its ancestors, since every one of them is enforced) less the other
//!    processes' memory (below) and less the memory
//!    this process already has resident (`VmRSS` of `/proc/self/status`:
//!    anonymous memory and its mapped files). The mapped files are mostly the
//!    program's own code (the interpreter, NumPy, this library: some 40 MiB
//!    for a Python process), which it runs on every step: a record cache that
//!    took their room would have them evicted and faulted back over and over.
//!    The rest of the cgroup's page cache is reclaimable
//!    and is what the budget is for; the pages of chunk mappings of stores
//!    already open are counted too, a conservative error. Memory the record
//!    cache already holds is not subtracted either, so detecting again while
//!    the cache is full gives the same budget. A limit at or above the
//!    machine's `MemTotal` does not bind and is skipped;
//! 4. `MemAvailable` of `/proc/meminfo` (the kernel's estimate of what new
//!    allocations can get without swapping, page cache included) plus what
//!    the record cache holds;
//! 5. nothing found (no `/proc`): [`BudgetSource::Unknown`], an unbounded
//!    budget, so reads stay buffered as they were before budgets existed.
//!
//! The cgroup is shared: a host runs one process per accelerator (4-8 ranks)
//! in one cgroup; a rank that sized its record caches as if the limit were
//! its own would commit about ranks × the limit and be OOM-killed. So the
//! cgroup source also subtracts the anonymous memory of
//! the cgroup's *other* processes (`memory.stat` of the cgroup that sets the
//! limit: v2 `anon`, v1 `total_rss`; their record caches are anonymous), which
//! keeps the sum of every rank's caches within the limit, and takes at most
//! `limit / ranks` less the process's own memory, `ranks` being the zring
//! processes registered for that limit ([`crate::memory::ranks`]), so that ranks that
//! started first do not keep what later ones need: ranks of one job are alike,
//! and at equal shares each serves the same fraction of its reads from memory.
//!
//! # Usage: what keeps a rank alive without the registry
//!
//! The split above needs the ranks to count each other, which they cannot
//! when the registry is unusable (another user took its name, a full tmpfs,
//! ranks of different users or containers that do not share `/dev/shm`).
//! Counting itself alone, each rank would size its cache from the whole
//! limit: four mode-3 ranks in a 1 GiB cgroup had three OOM-killed. So every
//! look at the budget also reads the usage of the cgroup that sets the limit
//! ([`Pressure`]: v2 `memory.current`, v1 `memory.usage_in_bytes`, less the
//! inactive page cache of `memory.stat`, which the kernel reclaims first) and
//! the processes in it (`cgroup.procs`). The record caches may hold at most
//! what they held plus a process's part of the room left below the limit less
//! a margin ([`pressure_margin`]: `limit / 16`, at least 32 MiB): when the
//! usage comes within the margin of the limit, the cache shrinks by what it
//! is over (evicting the farthest-needed records), and every process of the
//! cgroup growing at once still takes no more than the room. This holds for
//! stated budgets too: a cgroup limit is not a statement, it is enforced. The
//! cgroup's usage is read at most once per [`CHECK_MILLIS`] (the reader is
//! injectable, [`Files`], for tests).
//!
//! What the reads hold beside the record caches counts in the budget too
//! ([`Budget::io`]): the pool of freed slabs with the record arenas' free
//! slots (48 MiB together) and the block reads in
//! flight (32 MiB), or an eighth of a smaller budget, to which their limits
//! then shrink ([`crate::io::slab::set_limits`]); the gathers' scratch
//! buffers kept between gathers count against the same share
//! ([`crate::io::slab::keep_scratch`]). The record cache charges each
//! record the slab it is kept in ([`crate::memory::cache`]).
//!
//! Detection reads a handful of small files each time (the limits along the
//! hierarchy, the cgroup's `memory.stat`, `/proc/meminfo`,
//! `/proc/self/status`), some tens of microseconds, which is nothing next to
//! opening a store; reading them afresh keeps the budget true when the
//! process or its neighbours have grown or a limit changed. Where the cgroups
//! are (`/proc/self/cgroup`, `/proc/self/mountinfo`) is found once per process. These reads go
//! through `std::fs`, not the fault-injection seam of [`crate::io::fs`]: they are
//! not store I/O, and counting them would shift every injected fault.
//!

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable that states a budget.
pub(crate) const ENV_VAR: &str = "ZRING_CACHE_BYTES";

/// A fraction: numerator, denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ratio(pub u64, pub u64);

impl Ratio {
    /// `x * self`, rounded down, saturating at `u64::MAX`.
    pub fn of(self, x: u64) -> u64 {
        let v = u128::from(x) * u128::from(self.0) / u128::from(self.1.max(1));
        u64::try_from(v).unwrap_or(u64::MAX)
    }

    pub(crate) fn percent(self) -> u64 {
        self.0 * 100 / self.1.max(1)
    }
}

/// Share of a measured budget the store's data may fill and still be read
/// through the page cache (module docs: room for the process's later growth).
pub(crate) const FIT: Ratio = Ratio(4, 5);
/// Least memory a measured budget keeps out of the record cache (module docs:
/// what the reserve is for).
pub(crate) const RESERVE_MIN: u64 = 32 << 20;
/// Share of a measured budget kept out of the record cache, when more than
/// [`RESERVE_MIN`].
pub(crate) const RESERVE_SHARE: Ratio = Ratio(1, 16);
/// Share of a small budget the slab pool and the reads in flight may hold
/// ([`Budget::io`]).
pub(crate) const IO_SHARE: Ratio = Ratio(1, 8);
/// Cgroup limits at or above this are "no limit": v1 writes `PAGE_COUNTER_MAX`
/// pages (9223372036854771712 with 4 KiB pages) for unlimited, and no machine
/// has 4 EiB of memory.
const UNLIMITED_FROM: u64 = 1 << 62;

/// How much memory the store's data may take in this process, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// The budget in bytes (`u64::MAX` when unknown).
    pub bytes: u64,
    /// Where the number came from.
    pub source: BudgetSource,
    /// The usage of the cgroup that sets the binding limit, when there is
    /// one: it bounds the record caches whatever the budget says (module
    /// docs, "Usage").
    pub pressure: Option<Pressure>,
}

/// What a cgroup's usage leaves the record caches of this process (module
/// docs, "Usage").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pressure {
    /// The cgroup's limit.
    pub limit: u64,
    /// Its usage less the page cache the kernel reclaims first.
    pub used: u64,
    /// Processes in the cgroup (at least 1).
    pub procs: u64,
    /// Bytes this process's record caches charged when `used` was read.
    pub held: u64,
    /// The limit's file.
    pub file: PathBuf,
}

/// The room a cgroup's usage keeps below its limit: `limit / 16`, at least
/// [`RESERVE_MIN`] (the time between two looks, the kernel's own memory, and
/// what the processes allocate meanwhile).
pub(crate) fn pressure_margin(limit: u64) -> u64 {
    RESERVE_MIN.max(limit / 16)
}

impl Pressure {
    /// The most the record caches of this process may hold: less than they
    /// held by what the usage is above the margin below the limit, or more by
    /// a process's part of the room left (each process of the cgroup may take
    /// as much at the same instant).
    pub fn cap(&self) -> u64 {
        let margin = pressure_margin(self.limit);
        let room = self.limit.saturating_sub(self.used);
        if room < margin {
            self.held.saturating_sub(margin - room)
        } else {
            self.held.saturating_add((room - margin) / self.procs.max(1))
        }
    }
}

/// Where a [`Budget`] came from, with the numbers that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BudgetSource {
    /// Set by the program (the store's builder).
    Explicit,
    /// Set by `ZRING_CACHE_BYTES`.
    Env {
        /// The variable's value as written.
        value: String,
    },
    /// A cgroup v2 `memory.max` less what the processes in it use.
    CgroupV2 {
        /// The smallest limit on the way to the root of the hierarchy.
        limit: u64,
        /// Memory of this process outside its record caches, and the
        /// anonymous memory of the cgroup's other processes.
        used: u64,
        /// zring processes registered in the cgroup ([`crate::memory::ranks`]).
        ranks: u64,
        /// The most this process's record caches may hold: its share of the
        /// limit, `limit / ranks`, less its own memory (module docs). The page
        /// cache is shared by the ranks; the record caches are not.
        share: u64,
        /// The `memory.max` file that set the limit.
        file: PathBuf,
    },
    /// A cgroup v1 `memory.limit_in_bytes` less what the processes in it use.
    CgroupV1 {
        /// The smallest limit on the way to the root of the hierarchy.
        limit: u64,
        /// Memory of this process outside its record caches, and the
        /// anonymous memory of the cgroup's other processes.
        used: u64,
        /// zring processes registered in the cgroup ([`crate::memory::ranks`]).
        ranks: u64,
        /// The most this process's record caches may hold: its share of the
        /// limit, `limit / ranks`, less its own memory (module docs). The page
        /// cache is shared by the ranks; the record caches are not.
        share: u64,
        /// The `memory.limit_in_bytes` file that set the limit.
        file: PathBuf,
    },
    /// `MemAvailable` of `/proc/meminfo` plus what the record cache holds.
    MemAvailable {
        /// `MemAvailable` in bytes.
        available: u64,
        /// Bytes the record cache held (and could keep).
        cached: u64,
    },
    /// No limit could be found; the budget is unbounded.
    Unknown,
}

/// ", shared by 4 zring processes" when several ranks share the limit.
fn ranks_note(ranks: u64) -> String {
    if ranks > 1 {
        format!(", shared by {ranks} zring processes")
    } else {
        String::new()
    }
}

impl BudgetSource {
    /// What set the budget, for logs: "cgroup v2 memory.max 3.0 GiB
    /// (/sys/fs/cgroup/job/memory.max) less 210 MiB this process uses".
    pub fn describe(&self) -> String {
        match self {
            BudgetSource::Explicit => "set explicitly".into(),
            BudgetSource::Env { value } => format!("{ENV_VAR}={value}"),
            BudgetSource::CgroupV2 { limit, used, ranks, file, .. } => format!(
                "cgroup v2 memory.max {} ({}) less {} in use{}",
                human(*limit),
                file.display(),
                human(*used),
                ranks_note(*ranks)
            ),
            BudgetSource::CgroupV1 { limit, used, ranks, file, .. } => format!(
                "cgroup v1 memory.limit_in_bytes {} ({}) less {} in use{}",
                human(*limit),
                file.display(),
                human(*used),
                ranks_note(*ranks)
            ),
            BudgetSource::MemAvailable { available, cached } if *cached > 0 => format!(
                "MemAvailable {} plus {} the record cache holds (no binding cgroup memory limit)",
                human(*available),
                human(*cached)
            ),
            BudgetSource::MemAvailable { available, .. } => {
                format!("MemAvailable {} (no binding cgroup memory limit)", human(*available))
            }
            BudgetSource::Unknown => "no memory limit found (no cgroup limit, no /proc/meminfo)".into(),
        }
    }

    /// Whether a person stated the number (taken at face value) rather than
    /// the engine measuring it (discounted by [`FIT`] and the reserve).
    pub fn is_stated(&self) -> bool {
        matches!(self, BudgetSource::Explicit | BudgetSource::Env { .. })
    }
}

impl Budget {
    /// A budget with no cgroup usage looked at.
    pub fn new(bytes: u64, source: BudgetSource) -> Budget {
        Budget { bytes, source, pressure: None }
    }

    /// The budget and its source, for logs: "2.8 GiB from cgroup v2 ...",
    /// and the cgroup's usage when that is what bounds the record caches.
    pub fn describe(&self) -> String {
        let mut s = format!("{} from {}", human(self.bytes), self.source.describe());
        if let Some(p) = self.pressure.as_ref().filter(|p| p.cap() < self.unpressed()) {
            s += &format!(
                "; the cgroup's usage {} of {} ({}) holds the record caches to {}",
                human(p.used),
                human(p.limit),
                p.file.display(),
                human(p.cap())
            );
        }
        s
    }

    /// The share the data may fill and still be read buffered.
    pub(crate) fn fit(&self) -> Ratio {
        if self.source.is_stated() {
            Ratio(1, 1)
        } else {
            FIT
        }
    }

    /// What the record caches may hold: the budget (a measured one less its
    /// reserve, and at most the process's share of a cgroup) less what the
    /// reads hold beside them ([`Budget::io`]), and no more than the cgroup's
    /// usage leaves ([`Pressure::cap`]; module docs).
    pub fn for_caches(&self) -> u64 {
        let unpressed = self.unpressed();
        self.pressure.as_ref().map_or(unpressed, |p| unpressed.min(p.cap()))
    }

    /// [`Budget::for_caches`] before the cgroup's usage is looked at.
    fn unpressed(&self) -> u64 {
        self.bytes.min(self.share()).saturating_sub(self.reserve()).saturating_sub(self.io())
    }

    /// The process's share of a cgroup's limit; unbounded for other sources.
    fn share(&self) -> u64 {
        match self.source {
            BudgetSource::CgroupV2 { share, .. } | BudgetSource::CgroupV1 { share, .. } => share,
            _ => u64::MAX,
        }
    }

    /// What the reads hold beside the record caches, counted in the budget:
    /// the pool of freed slabs and record slots, and the block reads in flight
    /// ([`crate::io::slab::set_limits`]), 80 MiB, or an eighth of a smaller
    /// budget (module docs).
    pub fn io(&self) -> u64 {
        let full = crate::io::slab::POOL_BYTES as u64 + crate::io::slab::IN_FLIGHT_BYTES;
        IO_SHARE.of(self.bytes.min(self.share())).min(full)
    }

    /// The part of a measured budget kept out of the record cache.
    pub(crate) fn reserve(&self) -> u64 {
        if self.source.is_stated() {
            0
        } else {
            RESERVE_MIN.max(RESERVE_SHARE.of(self.bytes))
        }
    }
}

/// How often, at most, a store whose record cache holds memory looks at the
/// budget again, whatever it read meanwhile: the budget also
/// falls when *other* processes of the cgroup grow (ranks starting up next
/// to one that filled its cache first), which this process's reads do not
/// show; a look costs tens of microseconds, 20 a second nothing
/// (bench-results/engine-notes.md).
pub(crate) const CHECK_MILLIS: u64 = 50;

/// The budget of this process: `explicit` if given, else `ZRING_CACHE_BYTES`,
/// else detected (module docs); `cached` is what the process's record caches
/// hold now. Fails only on a malformed `ZRING_CACHE_BYTES`.
pub(crate) fn detect(explicit: Option<u64>, cached: u64) -> Result<Budget> {
    let env =
        match crate::env::cache_bytes() {
            None => None,
            Some(v) => Some(v.into_string().map_err(|v| {
                Error::InvalidArgument(format!("{ENV_VAR}={v:?} is not a size: the value is not UTF-8"))
            })?),
        };
    let root = Path::new("/");
    detect_in(root, explicit, env.as_deref(), process_rss(root).unwrap_or(0), cached)
}

/// [`detect`], done at most once per [`CHECK_MILLIS`] by
/// the whole process for the same `explicit`: every caching store looks at
/// the budget on its own schedule, and a mixture of a hundred stores would
/// otherwise read the cgroup's files thousands of times a second for one
/// answer.
///
/// A budget stated by the caller or in `ZRING_CACHE_BYTES` reads no file and is
/// taken afresh every time, so a change of it is followed at once.
pub(crate) fn detect_recent(explicit: Option<u64>, cached: u64) -> Result<Budget> {
    if explicit.is_some() || crate::env::cache_bytes().is_some() {
        return detect(explicit, cached);
    }
    recent(explicit, |e| detect(e, cached))
}

/// [`detect_recent`] with `detect` doing the detection.
fn recent(explicit: Option<u64>, detect: impl FnOnce(Option<u64>) -> Result<Budget>) -> Result<Budget> {
    type Recent = Vec<(Option<u64>, std::time::Instant, Budget)>;
    static RECENT: std::sync::Mutex<Recent> = std::sync::Mutex::new(Vec::new());
    let fresh = std::time::Duration::from_millis(CHECK_MILLIS);
    let mut recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
    recent.retain(|(_, at, _)| at.elapsed() < fresh);
    if let Some((_, _, b)) = recent.iter().find(|(e, _, _)| *e == explicit) {
        return Ok(b.clone());
    }
    let b = detect(explicit)?;
    recent.push((explicit, std::time::Instant::now(), b.clone()));
    Ok(b)
}

/// [`detect`] against the tree at `root` (standing for `/`): `env` is the
/// value of `ZRING_CACHE_BYTES`, `rss` the resident memory of the process
/// ([`process_rss`]), `cached` the bytes the record cache charges, which are
/// part of `rss` but count toward the budget, not against it.
pub(crate) fn detect_in(
    root: &Path,
    explicit: Option<u64>,
    env: Option<&str>,
    rss: u64,
    cached: u64,
) -> Result<Budget> {
    let mut b = source_in(root, explicit, env, rss, cached)?;
    b.pressure = pressure(root, cached);
    Ok(b)
}

/// The budget and its source, before the cgroup's usage is looked at.
fn source_in(root: &Path, explicit: Option<u64>, env: Option<&str>, rss: u64, cached: u64) -> Result<Budget> {
    if let Some(bytes) = explicit {
        return Ok(Budget::new(bytes, BudgetSource::Explicit));
    }
    if let Some(value) = env.filter(|v| !v.trim().is_empty()) {
        let bytes = parse_size(value).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{ENV_VAR}={value:?} is not a size: expected bytes or a number with a binary unit, \
                 e.g. 1073741824, 512M, 8G or 1.5GiB"
            ))
        })?;
        return Ok(Budget::new(bytes, BudgetSource::Env { value: value.to_string() }));
    }
    let mem = meminfo(root);
    let own = rss.saturating_sub(cached);
    if let Some(l) = cgroup_limit(root).filter(|l| mem.total.is_none_or(|t| l.limit < t)) {
        // Every process of the cgroup is charged to the limit: the others'
        // anonymous memory (record caches included) is not ours to fill.
        let own_anon = read(root, Path::new("/proc/self/status")).and_then(|s| kib_field(&s, "RssAnon:"));
        let others = match (cgroup_anon(root, &l), own_anon) {
            (Some(all), Some(mine)) => all.saturating_sub(mine),
            _ => 0,
        };
        // Ranks of one job are alike: each may fill its share of the limit
        // less its own memory (module docs).
        let ranks = if root == Path::new("/") { crate::memory::ranks::count(&l.file) } else { 1 };
        let share = (l.limit / ranks.max(1)).saturating_sub(own);
        let bytes = l.limit.saturating_sub(others).saturating_sub(own);
        let used = own + others;
        let source = match l.version {
            2 => BudgetSource::CgroupV2 { limit: l.limit, used, ranks, share, file: l.file },
            _ => BudgetSource::CgroupV1 { limit: l.limit, used, ranks, share, file: l.file },
        };
        return Ok(Budget::new(bytes, source));
    }
    if let Some(available) = mem.available {
        return Ok(Budget::new(available.saturating_add(cached), BudgetSource::MemAvailable { available, cached }));
    }
    Ok(Budget::new(u64::MAX, BudgetSource::Unknown))
}

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

/// The cgroup's usage now ([`Pressure`]) for the process whose record caches
/// charge `cached`; `None` without a binding cgroup limit. The real system's is
/// measured at most once per [`CHECK_MILLIS`] (it is looked at near the read
/// path, for stated budgets too).
fn pressure(root: &Path, cached: u64) -> Option<Pressure> {
    let measure = || {
        let l = cgroup_limit(root)?;
        let total = meminfo(root).total;
        if total.is_some_and(|t| l.limit >= t) {
            return None;
        }
        pressure_in(&Under(root), &l, cached)
    };
    if root != Path::new("/") {
        return measure();
    }
    type Last = Option<(std::time::Instant, Option<Pressure>)>;
    static LAST: std::sync::Mutex<Last> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, p)) = last.as_ref() {
        if at.elapsed() < std::time::Duration::from_millis(CHECK_MILLIS) {
            return p.clone();
        }
    }
    let p = measure();
    *last = Some((std::time::Instant::now(), p.clone()));
    p
}

/// The usage of the cgroup that sets the limit `l`, read through `files`:
/// v2 `memory.current`, v1 `memory.usage_in_bytes`, less the page cache the
/// kernel reclaims first (`inactive_file` of `memory.stat`, v1
/// `total_inactive_file`), and its processes (`cgroup.procs`).
pub(crate) fn pressure_in(files: &dyn Files, l: &CgroupLimit, cached: u64) -> Option<Pressure> {
    let dir = l.file.parent()?;
    let (usage, key) = if l.version == 2 {
        ("memory.current", "inactive_file")
    } else {
        ("memory.usage_in_bytes", "total_inactive_file")
    };
    let usage: u64 = files.read(&dir.join(usage))?.trim().parse().ok()?;
    let stat = files.read(&dir.join("memory.stat")).unwrap_or_default();
    let inactive = stat_field(&stat, key).unwrap_or(0);
    let procs =
        files.read(&dir.join("cgroup.procs")).map_or(1, |t| t.lines().filter(|l| !l.trim().is_empty()).count()) as u64;
    Some(Pressure {
        limit: l.limit,
        used: usage.saturating_sub(inactive),
        procs: procs.max(1),
        held: cached,
        file: l.file.clone(),
    })
}

/// The value of `key` in a `memory.stat` (`key value` lines).
fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Parses a size: plain bytes (`1073741824`) or a number, possibly with a
/// fraction, and a binary unit (`512M`, `8 GiB`, `1.5gb`, `64k`). `None` for
/// anything else, a fraction of a byte, or more than `u64::MAX` bytes.
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "ki" | "kib" => 10,
        "m" | "mb" | "mi" | "mib" => 20,
        "g" | "gb" | "gi" | "gib" => 30,
        "t" | "tb" | "ti" | "tib" => 40,
        "p" | "pb" | "pi" | "pib" => 50,
        _ => return None,
    };
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let well_formed = if num.contains('.') {
        // A fraction needs a unit: a fraction of a byte means nothing.
        shift > 0 && (int.is_empty() || digits(int)) && digits(frac)
    } else {
        digits(int)
    };
    if !well_formed {
        return None;
    }
    let unit = 1u128 << shift;
    let whole = if int.is_empty() { 0 } else { int.parse::<u128>().ok()? };
    // At most 18 fraction digits count: 10^18 * 2^50 still fits a u128.
    let frac = &frac[..frac.len().min(18)];
    let part = if frac.is_empty() { 0 } else { frac.parse::<u128>().ok()? * unit / 10u128.pow(frac.len() as u32) };
    u64::try_from(whole.checked_mul(unit)?.checked_add(part)?).ok()
}

/// Bytes for people: "512 B", "3.0 GiB", "210 MiB" (one decimal below 10 units).
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 9.95 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.0} {}", UNITS[u])
    }
}

/// `path` (absolute) inside the tree at `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn read(root: &Path, path: &Path) -> Option<String> {
    std::fs::read_to_string(under(root, path)).ok()
}

/// Resident memory of this process, its mapped files included (`VmRSS` of
/// `/proc/self/status`; module docs: why the mapped files count).
pub(crate) fn process_rss(root: &Path) -> Option<u64> {
    let status = read(root, Path::new("/proc/self/status"))?;
    kib_field(&status, "VmRSS:")
}

/// A `Name:   123 kB` line of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What `/proc/meminfo` says, in bytes.
struct MemInfo {
    total: Option<u64>,
    available: Option<u64>,
}

fn meminfo(root: &Path) -> MemInfo {
    let text = read(root, Path::new("/proc/meminfo")).unwrap_or_default();
    MemInfo { total: kib_field(&text, "MemTotal:"), available: kib_field(&text, "MemAvailable:") }
}

/// Anonymous memory of every process in the cgroup that sets the limit `l`
/// (its `memory.stat`: `anon` on v2, `total_rss` on v1, both counting the
/// cgroups below it).
fn cgroup_anon(root: &Path, l: &CgroupLimit) -> Option<u64> {
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
struct Mount {
    point: PathBuf,
    root: String,
}

/// Finds the smallest memory limit of this process's cgroup and its
/// ancestors: v2 first, then v1 (a hybrid host mounts v2 without the memory
/// controller, whose files then exist only under v1).
fn cgroup_limit(root: &Path) -> Option<CgroupLimit> {
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
fn cgroup_places(root: &Path) -> Vec<(u8, Mount, String)> {
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
fn find_mount(mountinfo: &str, path: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<Mount> {
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
fn unescape(s: &str) -> String {
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
fn within<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
}

/// The smallest limit in `file` from the process's cgroup directory up to the
/// mount point, and the file that holds it. Directories that do not exist (a
/// container whose cgroup path names a directory it cannot see) are skipped on
/// the way up; `None` when no level has a limit.
fn smallest_limit(root: &Path, mount: &Mount, path: &str, file: &str) -> Option<(u64, PathBuf)> {
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
fn parse_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < UNLIMITED_FROM).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A hundred stores asking for the budget at once cause one detection.
    #[test]
    fn the_process_detects_its_budget_once_per_interval() {
        let explicit = Some(123_456_789);
        let mut made = 0;
        for _ in 0..100 {
            let b = recent(explicit, |e| {
                made += 1;
                detect(e, 0)
            });
            assert_eq!(b.unwrap().bytes, 123_456_789);
        }
        // A slow machine may see an interval pass.
        assert!((1..=2).contains(&made), "{made} detections for 100 asks");
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// A fake root: `files` are (absolute path, contents).
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = under(dir.path(), Path::new(path));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    const MEMINFO: &str = "MemTotal:       16777216 kB\nMemFree:         1048576 kB\nMemAvailable:    8388608 kB\n";
    const V2_MOUNTS: &str =
        "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n\
                             30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";
    /// The layout of a hybrid host: v1 controllers, v2 mounted without them.
    const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                             32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                             35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                             41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    fn budget(root: &Path, rss: u64) -> Budget {
        detect_in(root, None, None, rss, 0).unwrap()
    }

    #[test]
    fn v2_limit_less_what_the_process_uses() {
        let t = tree(&[
            ("/proc/self/cgroup", "0::/job/step\n"),
            ("/proc/self/mountinfo", V2_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/job/step/memory.max", &(3 * GIB).to_string()),
            ("/sys/fs/cgroup/job/memory.max", "max\n"),
        ]);
        let b = budget(t.path(), 210 * MIB);
        assert_eq!(b.bytes, 3 * GIB - 210 * MIB);
        assert_eq!(
            b.source,
            BudgetSource::CgroupV2 {
                limit: 3 * GIB,
                used: 210 * MIB,
                ranks: 1,
                share: 3 * GIB - 210 * MIB,
                file: "/sys/fs/cgroup/job/step/memory.max".into()
            }
        );
        assert_eq!(
            b.source.describe(),
            "cgroup v2 memory.max 3.0 GiB (/sys/fs/cgroup/job/step/memory.max) less 210 MiB in use"
        );
    }

    /// Four ranks in one cgroup each sized their record cache from the whole
    /// limit less their own memory, committed about four times the limit
    /// between them and were OOM-killed. The budget now also subtracts the
    /// other processes' anonymous memory (their caches included).
    #[test]
    fn other_processes_of_the_cgroup_count_against_the_budget() {
        for (v, limit_file, stat) in [
            (2, "memory.max", "anon 1073741824\nfile 99999\n"),
            (1, "memory.limit_in_bytes", "cache 99999\nrss 1\ntotal_cache 5\ntotal_rss 1073741824\n"),
        ] {
            let (cg, mounts) = if v == 2 { ("0::/job\n", V2_MOUNTS) } else { ("4:memory:/job\n0::/\n", V1_MOUNTS) };
            let dir = if v == 2 { "/sys/fs/cgroup/job" } else { "/sys/fs/cgroup/memory/job" };
            let t = tree(&[
                ("/proc/self/cgroup", cg),
                ("/proc/self/mountinfo", mounts),
                ("/proc/meminfo", MEMINFO),
                ("/proc/self/status", "VmRSS:\t  307200 kB\nRssAnon:\t  102400 kB\n"),
                (&format!("{dir}/{limit_file}"), &(3 * GIB).to_string()),
                (&format!("{dir}/memory.stat"), stat),
            ]);
            // 1 GiB anonymous in the cgroup, 100 MiB of it this process's:
            // the others hold 924 MiB.
            let b = detect_in(t.path(), None, None, 300 * MIB, 0).unwrap();
            assert_eq!(b.bytes, 3 * GIB - 300 * MIB - 924 * MIB, "v{v}");
            assert!(b.describe().contains("less 1.2 GiB in use"), "{}", b.describe());
        }
    }

    /// A cgroup's files that a test changes between looks.
    struct FakeCgroup(std::cell::RefCell<std::collections::HashMap<PathBuf, String>>);

    impl FakeCgroup {
        fn new(dir: &str, usage_file: &str, usage: u64, stat: &str, procs: u64) -> FakeCgroup {
            let f = FakeCgroup(Default::default());
            f.set(&format!("{dir}/{usage_file}"), &usage.to_string());
            f.set(&format!("{dir}/memory.stat"), stat);
            f.set(&format!("{dir}/cgroup.procs"), &(0..procs).map(|p| format!("{}\n", 100 + p)).collect::<String>());
            f
        }

        fn set(&self, path: &str, text: &str) {
            self.0.borrow_mut().insert(PathBuf::from(path), text.to_string());
        }
    }

    impl Files for FakeCgroup {
        fn read(&self, path: &Path) -> Option<String> {
            self.0.borrow().get(path).cloned()
        }
    }

    /// Four ranks that cannot count each other (the registry is unusable)
    /// each shrink their cache as the cgroup's usage nears the limit, and grow
    /// into a quarter of the room left at most.
    #[test]
    fn usage_near_the_limit_shrinks_the_cache_whatever_the_budget() {
        for (v, file, usage_file, inactive) in [
            (2, "/sys/fs/cgroup/job/memory.max", "memory.current", "inactive_file"),
            (1, "/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ] {
            let l = CgroupLimit { version: v, limit: GIB, file: file.into() };
            let dir = Path::new(file).parent().unwrap().to_str().unwrap().to_string();
            // 1000 MiB in use, 100 MiB of it inactive page cache: 124 MiB of
            // room, 64 MiB of margin; four processes take 15 MiB each at most.
            let stat = format!("cache 104857600\n{inactive} 104857600\nanon 1\n");
            let f = FakeCgroup::new(&dir, usage_file, 1000 * MIB, &stat, 4);
            let p = pressure_in(&f, &l, 300 * MIB).unwrap();
            assert_eq!((p.used, p.procs, p.held), (900 * MIB, 4, 300 * MIB), "v{v}");
            assert_eq!(p.cap(), 315 * MIB, "v{v}");
            // The others grew: usage 1010 MiB and no page cache left. The cache
            // must give back what the usage is into the margin: 50 MiB.
            f.set(&format!("{dir}/{usage_file}"), &(1010 * MIB).to_string());
            f.set(&format!("{dir}/memory.stat"), &format!("{inactive} 0\n"));
            let p = pressure_in(&f, &l, 300 * MIB).unwrap();
            assert_eq!(p.cap(), 250 * MIB, "v{v}");
            // Even a stated budget of the whole limit is held to it.
            let mut b = Budget::new(GIB, BudgetSource::Explicit);
            assert_eq!(b.for_caches(), GIB - 80 * MIB, "the slab pool and the reads in flight count");
            b.pressure = Some(p);
            assert_eq!(b.for_caches(), 250 * MIB);
            assert!(
                b.describe().contains(&format!(
                    "the cgroup's usage 1010 MiB of 1.0 GiB ({file}) holds the record caches to 250 MiB"
                )),
                "{}",
                b.describe()
            );
            // Over the limit by more than the cache holds: nothing cached.
            f.set(&format!("{dir}/{usage_file}"), &(1100 * MIB).to_string());
            assert_eq!(pressure_in(&f, &l, 30 * MIB).unwrap().cap(), 0);
            // No usage file: nothing known, nothing bounded.
            f.0.borrow_mut().remove(&PathBuf::from(format!("{dir}/{usage_file}")));
            assert!(pressure_in(&f, &l, 0).is_none());
        }
    }

    #[test]
    fn detection_reads_the_usage_of_the_limiting_cgroup() {
        let t = tree(&[
            ("/proc/self/cgroup", "4:memory:/job\n0::/\n"),
            ("/proc/self/mountinfo", V1_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", &GIB.to_string()),
            ("/sys/fs/cgroup/memory/job/memory.usage_in_bytes", &(1000 * MIB).to_string()),
            ("/sys/fs/cgroup/memory/job/memory.stat", "total_rss 943718400\ntotal_inactive_file 0\n"),
            ("/sys/fs/cgroup/memory/job/cgroup.procs", "7\n8\n"),
        ]);
        // The stated budget would let the caches take 1.9 GiB; the usage is
        // 40 MiB into the margin of 64 MiB below the limit, so this process
        // keeps 40 MiB less than the 200 MiB it holds.
        let b = detect_in(t.path(), Some(2 * GIB), None, 250 * MIB, 200 * MIB).unwrap();
        assert_eq!(b.pressure.as_ref().map(|p| (p.used, p.procs)), Some((1000 * MIB, 2)));
        assert_eq!(b.for_caches(), 160 * MIB);
        // No limit, no usage looked at.
        let t = tree(&[("/proc/meminfo", MEMINFO)]);
        assert!(detect_in(t.path(), Some(GIB), None, 0, 0).unwrap().pressure.is_none());
    }

    /// What the reads hold beside the caches comes out of the budget: 80 MiB,
    /// or an eighth of a smaller budget, or of a cgroup share.
    #[test]
    fn the_slab_pool_and_reads_in_flight_count_against_the_budget() {
        assert_eq!(Budget::new(4 * GIB, BudgetSource::Explicit).for_caches(), 4 * GIB - 80 * MIB);
        assert_eq!(Budget::new(8 * MIB, BudgetSource::Explicit).for_caches(), 7 * MIB);
        let m = Budget::new(2 * GIB, BudgetSource::MemAvailable { available: 2 * GIB, cached: 0 });
        assert_eq!(m.for_caches(), 2 * GIB - 128 * MIB - 80 * MIB);
        let share = Budget::new(
            GIB,
            BudgetSource::CgroupV1 { limit: GIB, used: 0, ranks: 4, share: 256 * MIB, file: "/x".into() },
        );
        assert_eq!(share.io(), 32 * MIB);
        assert_eq!(share.for_caches(), 256 * MIB - 64 * MIB - 32 * MIB);
    }

    #[test]
    fn v2_max_takes_the_smallest_ancestor_limit() {
        let t = tree(&[
            ("/proc/self/cgroup", "0::/a/b/c\n"),
            ("/proc/self/mountinfo", V2_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/a/b/c/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/b/memory.max", &(6 * GIB).to_string()),
            ("/sys/fs/cgroup/a/memory.max", &(4 * GIB).to_string()),
        ]);
        let b = budget(t.path(), 0);
        assert_eq!(b.bytes, 4 * GIB);
        assert!(
            matches!(&b.source, BudgetSource::CgroupV2 { file, .. } if file == Path::new("/sys/fs/cgroup/a/memory.max"))
        );
    }

    #[test]
    fn v2_mount_root_of_a_container_is_stripped() {
        // Without a cgroup namespace a container sees its host path in
        // /proc/self/cgroup while the mount shows that directory at its point.
        let t = tree(&[
            ("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
            ("/proc/self/mountinfo", "50 40 0:30 /kubepods/pod1/ctr /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/memory.max", &(2 * GIB).to_string()),
        ]);
        assert_eq!(budget(t.path(), 0).bytes, 2 * GIB);
    }

    #[test]
    fn v1_limit_with_a_missing_leaf_directory() {
        let t = tree(&[
            ("/proc/self/cgroup", "9:name=systemd:/\n4:memory:/jobs/ae8d\n1:cpu,cpuacct:/\n0::/\n"),
            ("/proc/self/mountinfo", V1_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            // v2 is mounted but has no memory controller: no memory.max.
            ("/sys/fs/cgroup/unified/cgroup.controllers", "cpu\n"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", &(5 * GIB).to_string()),
        ]);
        let b = budget(t.path(), GIB);
        assert_eq!(b.bytes, 4 * GIB);
        assert!(matches!(&b.source, BudgetSource::CgroupV1 { limit, .. } if *limit == 5 * GIB));
        assert!(b.describe().starts_with("4.0 GiB from cgroup v1 memory.limit_in_bytes 5.0 GiB"), "{}", b.describe());
    }

    #[test]
    fn v1_unlimited_falls_back_to_mem_available() {
        let t = tree(&[
            ("/proc/self/cgroup", "4:memory:/jobs/x\n0::/\n"),
            ("/proc/self/mountinfo", V1_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/jobs/x/memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        let b = detect_in(t.path(), None, None, GIB, 256 * MIB).unwrap();
        // MemAvailable does not include what the cache holds; the budget does.
        assert_eq!(b.bytes, 8 * GIB + 256 * MIB);
        assert_eq!(b.source, BudgetSource::MemAvailable { available: 8 * GIB, cached: 256 * MIB });
    }

    #[test]
    fn a_limit_above_the_machine_does_not_bind() {
        let t = tree(&[
            ("/proc/self/cgroup", "0::/big\n"),
            ("/proc/self/mountinfo", V2_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/big/memory.max", &(64 * GIB).to_string()),
        ]);
        assert!(matches!(budget(t.path(), 0).source, BudgetSource::MemAvailable { .. }));
    }

    #[test]
    fn no_mountinfo_uses_the_usual_mount_points() {
        let t = tree(&[
            ("/proc/self/cgroup", "0::/j\n"),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/j/memory.max", &GIB.to_string()),
        ]);
        assert_eq!(budget(t.path(), 0).bytes, GIB);
    }

    #[test]
    fn nothing_found_is_unbounded_and_buffered() {
        let t = tree(&[]);
        let b = budget(t.path(), 0);
        assert_eq!(b, Budget::new(u64::MAX, BudgetSource::Unknown));
        assert_eq!(crate::memory::policy::choose(&b, u64::MAX / 2).mode, crate::memory::policy::ReadMode::Buffered);
    }

    #[test]
    fn explicit_wins_then_env_wins_over_cgroup() {
        let t = tree(&[
            ("/proc/self/cgroup", "0::/j\n"),
            ("/proc/self/mountinfo", V2_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/j/memory.max", &GIB.to_string()),
        ]);
        let b = detect_in(t.path(), Some(123), Some("8G"), 0, 0).unwrap();
        assert_eq!(b, Budget::new(123, BudgetSource::Explicit));
        let b = detect_in(t.path(), None, Some("8G"), 0, 0).unwrap();
        assert_eq!(b, Budget::new(8 * GIB, BudgetSource::Env { value: "8G".into() }));
        assert_eq!(b.describe(), "8.0 GiB from ZRING_CACHE_BYTES=8G");
        // An empty value is unset.
        assert_eq!(detect_in(t.path(), None, Some(" "), 0, 0).unwrap().bytes, GIB);
    }

    #[test]
    fn a_bad_env_value_is_an_error_naming_the_variable() {
        let t = tree(&[("/proc/meminfo", MEMINFO)]);
        for bad in ["abc", "-1", "8X", "1.5", "1e9", "99999999999999P", "8G8", ".", "1..5G"] {
            match detect_in(t.path(), None, Some(bad), 0, 0) {
                Err(Error::InvalidArgument(msg)) => assert!(msg.contains("ZRING_CACHE_BYTES"), "{msg}"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1073741824"), Some(GIB));
        assert_eq!(parse_size("512M"), Some(512 * MIB));
        assert_eq!(parse_size("8G"), Some(8 * GIB));
        assert_eq!(parse_size("8g"), Some(8 * GIB));
        assert_eq!(parse_size("1.5GiB"), Some(3 * GIB / 2));
        assert_eq!(parse_size("2 GB"), Some(2 * GIB));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size(".5M"), Some(MIB / 2));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("16EiB"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn rss_counts_mapped_files_too_and_subtraction_saturates() {
        let t = tree(&[(
            "/proc/self/status",
            "Name:\tx\nVmRSS:\t  900000 kB\nRssAnon:\t  200000 kB\nRssFile:\t  690000 kB\nRssShmem:\t   10000 kB\n",
        )]);
        assert_eq!(process_rss(t.path()), Some(900_000 * 1024));
        let old = tree(&[("/proc/self/status", "VmRSS:\t  1000 kB\n")]);
        assert_eq!(process_rss(old.path()), Some(1000 * 1024));

        let t = tree(&[
            ("/proc/self/cgroup", "0::/j\n"),
            ("/proc/self/mountinfo", V2_MOUNTS),
            ("/proc/meminfo", MEMINFO),
            ("/sys/fs/cgroup/j/memory.max", &GIB.to_string()),
        ]);
        assert_eq!(budget(t.path(), 3 * GIB).bytes, 0);
        // What the record cache holds counts toward the budget, not against it.
        assert_eq!(detect_in(t.path(), None, None, 600 * MIB, 500 * MIB).unwrap().bytes, GIB - 100 * MIB);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/mnt/my\040cgroup"), "/mnt/my cgroup");
        assert_eq!(unescape(r"/a\\b"), r"/a\\b");
        assert_eq!(unescape(r"/a\134b"), r"/a\b");
    }

    #[test]
    fn the_real_system_gives_a_budget() {
        let b = detect(None, 0).unwrap();
        assert!(b.bytes > 0, "{}", b.describe());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 * GIB), "3.0 GiB");
        assert_eq!(human(210 * MIB), "210 MiB");
        assert_eq!(human(u64::MAX), "16 EiB");
    }
}
