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
//! ([`crate::io::scratch::keep_scratch`]). The record cache charges each
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

mod system;

use std::path::{Path, PathBuf};

use self::system::{cgroup_anon, cgroup_limit, kib_field, meminfo, read, stat_field};
pub(crate) use self::system::{process_rss, CgroupLimit, Files, Under};
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

#[cfg(test)]
mod tests;
