"""What the Python benchmarks share: notes, the fio disk ceiling, machine and
version lines, the report writer, and memory cgroups.

Only the standard library at module level: a measuring child of budget.py or
host.py joins its cgroup before it imports NumPy or zring, so that all of
their memory is charged.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

notes: list[str] = []


def note(msg: str) -> None:
    """Records a note for the report and says it on stderr."""
    notes.append(msg)
    print(f"  note: {msg}", file=sys.stderr, flush=True)


def proc_read_bytes() -> int:
    """Bytes this process has read from block devices so far (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def drop_caches() -> None:
    """Empties the kernel's page cache (root only)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def shown(p: Path) -> str:
    """A path as printed: relative to the repository when inside it."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return "$ZRING_BENCH_DIR/" + Path(p).name if os.environ.get("ZRING_BENCH_DIR") else Path(p).name


def fio_randread(store: Path, secs: float, depth: int = 32, bs: str = "12k") -> dict | None:
    """The disk's ceiling for random reads of ``bs`` (12 KiB by default):
    fio with io_uring and O_DIRECT at queue depth ``depth`` on the store's
    largest chunk file, for ``secs`` seconds. The caller empties the page cache first if it wants.
    ``None`` (with a note) when fio is missing or fails."""
    if shutil.which("fio") is None:
        note("fio not installed (apt-get install -y fio): no disk ceiling")
        return None
    chunks = sorted((f for f in Path(store).rglob("*.zr") if f.is_file()), key=lambda f: f.stat().st_size)
    if not chunks:
        note(f"no chunk file in {shown(store)} for fio")
        return None
    target = chunks[-1]
    cmd = ["fio", "--name=ceiling", f"--filename={target}", "--ioengine=io_uring", "--direct=1", "--rw=randread",
           f"--bs={bs}", f"--iodepth={depth}", "--readonly", f"--runtime={secs:g}", "--time_based",
           "--output-format=json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=secs + 60).stdout
        job = json.loads(out[out.index("{"):])["jobs"][0]
        rd = job["read"]
        clat = rd["clat_ns"]["percentile"]
        # fio's job thread's CPU (percent of its run time), per GiB read.
        gib = rd["io_bytes"] / (1 << 30)
        run_s = job["job_runtime"] / 1e3
        user, system = (job[k] / 100 * run_s / gib if gib else None for k in ("usr_cpu", "sys_cpu"))
        return {
            "mib_s": rd["bw_bytes"] / (1 << 20), "iops": rd["iops"], "ios": rd["total_ios"],
            "secs": rd["runtime"] / 1e3,
            "clat_p50_ms": clat.get("50.000000", 0) / 1e6, "clat_p99_ms": clat.get("99.000000", 0) / 1e6,
            "clat_p999_ms": clat.get("99.900000", 0) / 1e6,
            "user_s_per_gib": user, "sys_s_per_gib": system,
            "cpu_s_per_gib": None if user is None else user + system,
            "cmd": " ".join(cmd).replace(str(target), shown(target)),
        }
    except Exception as e:  # noqa: BLE001
        note(f"fio failed: {e}")
        return None


@contextlib.contextmanager
def cpu_hog(on: bool = True, cpu: int = 1):
    """While the block runs, ``taskset -c CPU yes > /dev/null`` keeps core
    ``cpu`` busy (a contender for the CPU, as another job on the host would
    be); it is killed when the block ends, also on errors. Does nothing when
    ``on`` is false."""
    if not on:
        yield None
        return
    p = subprocess.Popen(["taskset", "-c", str(cpu), "yes"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def machine(data: Path, extra: str = "") -> str:
    """Cores, memory, kernel, Python (and ``extra``), and the disk holding ``data``."""
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")), "0")
    try:
        disk = subprocess.run(["df", "-h", str(data)], capture_output=True, text=True).stdout.splitlines()[-1]
    except Exception:  # noqa: BLE001
        disk = "?"
    disk = " ".join(disk.split())
    return (f"{os.cpu_count()} cpus, {int(mem) / (1 << 20):.1f} GiB memory, Linux {platform.release()}, "
            f"Python {platform.python_version()}{extra}; data on `{disk}`")


def versions(modules: tuple[str, ...], dists: dict[str, str] | None = None) -> str:
    """"name version" of each module, "(missing)" where it does not import."""
    from importlib.metadata import version

    out = []
    for m in modules:
        try:
            mod = __import__(m)
            v = getattr(mod, "__version__", None) or version((dists or {}).get(m, m))
            out.append(f"{m} {v}")
        except Exception:  # noqa: BLE001
            out.append(f"{m} (missing)")
    return ", ".join(out)


KEEP = "<!-- kept across runs: the text below is written by hand -->"


def write_result(path: Path, text: str) -> None:
    """Writes a run's report to ``path``, keeping any hand-written analysis
    that follows the :data:`KEEP` marker in the file already there (a rerun
    replaces the figures, not what was written about them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if path.exists():
        old = path.read_text()
        if KEEP in old:
            kept = "\n" + KEEP + old.split(KEEP, 1)[1]
    path.write_text(text.rstrip("\n") + "\n" + kept)


class Cgroups:
    """Creates limited memory cgroups (v2 if the unified hierarchy has the
    memory controller, else v1) and removes every one it made."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        root = Path("/sys/fs/cgroup")
        if (root / "cgroup.controllers").exists():
            self.version = 2
            self.mount = root
            self.home = root / self._own_path(lambda ctrls: ctrls == "")
            # v2 forbids processes in a cgroup whose children have controllers
            # (except the root), so the run cgroups hang off the root.
            self.base = root
            if "memory" not in (root / "cgroup.controllers").read_text().split():
                raise RuntimeError("cgroup v2 without the memory controller")
            sub = root / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
        else:
            self.version = 1
            self.mount = self._v1_mount()
            own = self._own_path(lambda ctrls: "memory" in ctrls.split(","))
            # Nested under this process's own memory cgroup when there is one,
            # so the runs stay inside whatever hierarchy started us.
            cand = self.mount / own
            self.base = cand if cand.is_dir() and os.access(cand, os.W_OK) else self.mount
            self.home = cand if cand.is_dir() else self.mount
        probe = self.base / f"zring-bench-{os.getpid()}-probe"
        probe.mkdir()
        self.created.append(probe)
        self.remove(probe)

    @staticmethod
    def _own_path(pick) -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if pick(ctrls):
                return path.lstrip("/")
        return ""

    @staticmethod
    def _v1_mount() -> Path:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fields, tail = pre.split(), post.split()
            if len(tail) >= 3 and tail[0] == "cgroup" and "memory" in tail[2].split(","):
                return Path(fields[4])
        raise RuntimeError("no memory cgroup controller mounted")

    def describe(self) -> str:
        where = "under the benchmark's own memory cgroup" if self.base != self.mount else "under the hierarchy's root"
        limit = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        return f"cgroup v{self.version}, one fresh cgroup per run {where}, limit set with `{limit}`"

    def create(self, name: str, limit: int) -> tuple[Path, int]:
        p = self.base / name
        p.mkdir()
        self.created.append(p)
        if self.version == 1:
            (p / "memory.limit_in_bytes").write_text(str(limit))
            got = int((p / "memory.limit_in_bytes").read_text())
        else:
            (p / "memory.max").write_text(str(limit))
            if (p / "memory.swap.max").exists():
                (p / "memory.swap.max").write_text("0")
            got = int((p / "memory.max").read_text())
        return p, got

    def oom_kills(self, p: Path) -> int:
        f = p / ("memory.oom_control" if self.version == 1 else "memory.events")
        try:
            for line in f.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except OSError:
            pass
        return 0

    def peak(self, p: Path) -> int | None:
        f = p / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        try:
            return int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self, p: Path) -> None:
        if not p.exists():
            if p in self.created:
                self.created.remove(p)
            return
        for _ in range(100):
            try:
                pids = (p / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:  # move leftovers out first (rmdir fails while it has tasks)
                try:
                    (self.home / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            try:
                p.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
        else:
            print(f"  warning: could not remove cgroup {p}", file=sys.stderr)
            return
        if p in self.created:
            self.created.remove(p)

    def cleanup(self) -> None:
        for p in list(reversed(self.created)):
            self.remove(p)


def default_workers() -> int:
    """The DataLoader's default ``num_workers``: the CPUs this process may run
    on, at most 4 (as ``zring.DataLoader`` computes it)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def linked_copies(store: Path, where: Path, count: int) -> list[Path]:
    """``count`` copies of ``store`` in ``where`` whose chunk files are hard
    links to its own (no data written; ``where`` must be on its file
    system); small files are copied."""
    out = []
    for k in range(count):
        d = where / f"{store.name}-link{k}"
        if not d.exists():
            tmp = where / f".{store.name}-link{k}.part"
            tmp.mkdir(parents=True, exist_ok=True)
            for f in store.iterdir():
                target = tmp / f.name
                if target.exists():
                    continue
                if f.name.startswith("chunk-"):
                    os.link(f, target)
                else:
                    target.write_bytes(f.read_bytes())
            tmp.rename(d)
        out.append(d)
    return out
