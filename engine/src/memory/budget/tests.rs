use super::system::{under, unescape};
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
    let share =
        Budget::new(GIB, BudgetSource::CgroupV1 { limit: GIB, used: 0, ranks: 4, share: 256 * MIB, file: "/x".into() });
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
