"""Budgets that hold without the rank registry: ranks in one memory cgroup,
and the record cache's RSS against its budget.

``--ranks`` mode (the default): ``--count`` mode-3 DataLoaders
(``zring.DataLoader(..., mode=3, shard=(k, count))``), each in a process of
its own, share one memory cgroup of ``--limit-mib`` (v1
``memory.limit_in_bytes`` or v2 ``memory.max``) on a store of ``--gib`` GiB of
raw 12 KiB records (larger than the limit, so every rank reads with O_DIRECT
and a record cache). Each rank joins the cgroup before it imports NumPy or
zring, then reads its shard for ``--secs`` seconds or ``--passes`` passes. The page cache
is emptied before each scenario (``sync``, then ``3`` into drop_caches).
Scenarios, each with the registry (``ZRING_REGISTRY_DIR``) in a fresh
directory:

  working   a private, shared registry: the ranks count each other;
  squatted  uid 65534 made the registry directory's ``zring-<uid>`` first (the
            ranks refuse it and count themselves alone);
  full      the registry's place is a tmpfs with no inode left (ENOSPC);
  apart     each rank has a registry directory of its own (ranks of
            containers that do not share ``/dev/shm``).

Reported per scenario: the cgroup's OOM kills (``memory.oom_control`` /
``memory.events``), ``memory.failcnt`` (v1), its peak usage, each rank's exit
code, the ranks' summed MiB/s and record-cache hit rate, and what the first
rank said on stderr (the registry's warning).

``--rss`` mode: one process, a stated budget of ``--budget-mib``
(``Dataset(cache_bytes=...)``) and a store of records of ``--record`` bytes
(65,537 by default: one byte past 64 KiB, the worst case of the slab classes)
twice the budget, read in random batches until the record cache is full;
reports the peak RSS (``VmHWM``) against the budget, and the RSS added by
the reads (peak less the RSS before the first read).

Usage (as root, in the project venv; ``--ranks`` reports a throughput, so
build with ``maturin develop --release``):

    python benches/ranks.py --ranks [--gib 3.2] [--count 4] [--limit-mib 1024] [--secs 20]
                            [--passes 1] [--rounds 1] [--scenarios working,squatted,full,apart]
    python benches/ranks.py --rss [--record 65537] [--budget-mib 512]

Stores go to $ZRING_BENCH_DIR (default ``bench-data/``; never /tmp, which may
be memory) and are reused.
"""

from __future__ import annotations

# Only the standard library at module level: a rank joins its cgroup before it
# imports NumPy or zring, so all of their memory is charged.
import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import REPO, Cgroups, drop_caches  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
BATCH = 256
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def data_root() -> Path:
    return Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data"))


# --------------------------------------------------------------------------
# children
# --------------------------------------------------------------------------

def rank_child(spec: dict) -> None:
    """One rank: joins the cgroup, reads its shard, prints ``RESULT {json}``."""
    Path(spec["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
    import numpy as np  # noqa: F401

    import zring

    k, n = spec["shard"]
    ds = zring.Dataset(spec["path"])
    dl = zring.DataLoader({"x": ds}, batch_size=BATCH, mode=3, seed=1, shard=(k, n),
                          num_workers=spec["workers"], prefetch_size=4)
    steps = spec["passes"] * len(ds) // n // BATCH  # whole passes of the shard
    t0 = time.perf_counter()
    done = 0
    while done < steps and time.perf_counter() - t0 < spec["secs"]:
        next(dl)
        done += 1
    wall = time.perf_counter() - t0
    r = next(iter(dl.stats()["reads"].values()))
    out = {
        "steps": done,
        "mib_s": done * BATCH * spec["record"] / MIB / wall,
        "hit_rate": r["hit_rate"],
        "policy": r["policy"],
        "cache_capacity": r["cache_capacity"],
        "budget_source": r["budget_source"],
        "hwm": _status("VmHWM"),
    }
    dl.close()
    ds.close()
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)


def rss_child(spec: dict) -> None:
    import numpy as np

    import zring

    ds = zring.Dataset(spec["path"], cache_bytes=spec["budget"])
    rng = np.random.default_rng(3)
    n = len(ds)
    ds[np.arange(4, dtype=np.uint64)]
    before = _status("VmRSS")
    for _ in range(3 * n // 64):
        ds[rng.integers(0, n, size=64, dtype=np.int64)]
    r = ds.read_stats()
    out = {"before": before, "hwm": _status("VmHWM"), "rss": _status("VmRSS"), "policy": r["policy"],
           "cache_capacity": r["cache_capacity"], "cache_held": r["cache_held"],
           "cache_entries": r["cache_entries"], "budget": r["budget_bytes"]}
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------
# ranks
# --------------------------------------------------------------------------

def fresh_shared_dir() -> Path:
    """A directory like /dev/shm: sticky, everyone may create in it."""
    d = Path(tempfile.mkdtemp(prefix="zring-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    os.chmod(d, 0o1777)
    return d


def full_tmpfs() -> Path:
    """A tmpfs with no inode left: making anything in it fails with ENOSPC."""
    d = Path(tempfile.mkdtemp(prefix="zring-bench-full-", dir=data_root()))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=16,mode=1777", "tmpfs", str(d)], check=True)
    atexit.register(lambda: subprocess.run(["umount", str(d)]) and None)
    for i in range(64):
        try:
            (d / f"fill-{i}").touch()
        except OSError:
            break
    return d


def registries(scenario: str, count: int) -> list[Path]:
    uid = os.geteuid()
    if scenario == "working":
        return [fresh_shared_dir()] * count
    if scenario == "squatted":
        d = fresh_shared_dir()
        r = subprocess.run([*NOBODY, sys.executable, "-c", f"import os; os.mkdir({str(d / f'zring-{uid}')!r}, 0o700)"],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"uid 65534 could not make the registry directory: {r.stderr}")
        return [d] * count
    if scenario == "full":
        return [full_tmpfs()] * count
    if scenario == "apart":
        return [fresh_shared_dir() for _ in range(count)]
    raise ValueError(scenario)


def cg_file(cgs: Cgroups, p: Path, v1: str, v2: str) -> int | None:
    try:
        return int((p / (v1 if cgs.version == 1 else v2)).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run_scenario(cgs: Cgroups, store: Path, record: int, scenario: str, args) -> dict:
    regs = registries(scenario, args.count)
    drop_caches()
    cg, limit = cgs.create(f"zring-ranks-{os.getpid()}-{scenario}", args.limit_mib * MIB)
    procs = []
    try:
        for k in range(args.count):
            env = {k2: v for k2, v in os.environ.items() if k2 not in ("ZRING_CACHE_BYTES", "ZRING_DIRECT")}
            env["ZRING_REGISTRY_DIR"] = str(regs[k])
            spec = {"cgroup": str(cg), "path": str(store), "shard": [k, args.count], "secs": args.secs,
                    "workers": args.workers, "record": record, "passes": args.passes}
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child-rank",
                                           json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True, cwd=REPO))
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=args.secs + 180)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
        res = {
            "scenario": scenario,
            "limit": limit,
            "oom_kills": cgs.oom_kills(cg),
            "failcnt": cg_file(cgs, cg, "memory.failcnt", "memory.events.local"),
            "peak": cgs.peak(cg),
            "exit_codes": [rc for rc, _, _ in outs],
            "ranks": [],
            "stderr": "",
        }
        for rc, out, err in outs:
            r = None
            for line in reversed(out.splitlines()):
                if line.startswith("RESULT "):
                    r = json.loads(line[7:])
                    break
            res["ranks"].append(r)
            if not res["stderr"] and err.strip():
                res["stderr"] = err.strip().splitlines()[-1][:400]
        ok = [r for r in res["ranks"] if r]
        res["mib_s"] = sum(r["mib_s"] for r in ok)
        res["hit_rate"] = sum(r["hit_rate"] for r in ok) / len(ok) if ok else None
        return res
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        cgs.remove(cg)
        for d in set(regs):
            if d.parent == Path("/dev/shm") or str(d).startswith("/dev/shm/"):
                shutil.rmtree(d, ignore_errors=True)


def ranks_main(args) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import budget

    paths, n = budget.ensure_data(data_root() / "m3", args.gib, ("zring",))
    store = paths["zring"]
    cgs = Cgroups()
    atexit.register(cgs.cleanup)
    print(f"# {args.count} mode-3 ranks in one {cgs.describe()}, limit {args.limit_mib} MiB; store {n} x 12 KiB "
          f"raw records ({n * budget.RECORD / GIB:.2f} GiB); {args.workers} workers a rank; {args.secs:.0f} s or "
          f"{args.passes} pass(es) of the shard; page cache dropped before each scenario\n")
    print("| registry | OOM kills | failcnt | peak usage MiB | exit codes | MiB/s (sum) | hit rate | "
          "budget source (rank 0) |")
    print("|---|---|---|---|---|---|---|---|")
    for scenario in [s for _ in range(args.rounds) for s in args.scenarios.split(",")]:
        r = run_scenario(cgs, store, budget.RECORD, scenario, args)
        src = (r["ranks"][0] or {}).get("budget_source", "-") if r["ranks"] else "-"
        peak = f"{r['peak'] / MIB:.0f}" if r["peak"] else "-"
        hit = f"{r['hit_rate']:.2f}" if r["hit_rate"] is not None else "-"
        print(f"| {scenario} | {r['oom_kills']} | {r['failcnt']} | {peak} | {r['exit_codes']} | "
              f"{r['mib_s']:.0f} | {hit} | {src} |", flush=True)
        if r["stderr"]:
            print(f"|  ↳ stderr | {r['stderr']} |||||||", flush=True)


# --------------------------------------------------------------------------
# RSS
# --------------------------------------------------------------------------

def rss_main(args) -> None:
    import numpy as np

    import zring

    budget = args.budget_mib * MIB
    n = 2 * budget // args.record
    path = data_root() / f"rss-{args.record}-{n}"
    marker = path.parent / (path.name + ".complete")
    if not marker.exists():
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(5)
        arr = np.frombuffer(rng.bytes(n * args.record), dtype=np.uint8).reshape(n, args.record)
        zring.write_dataset(str(path), arr, codec="raw")
        marker.write_text("ok")
        del arr
    env = {k: v for k, v in os.environ.items() if k not in ("ZRING_CACHE_BYTES", "ZRING_DIRECT")}
    spec = {"path": str(path), "budget": budget}
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-rss", json.dumps(spec)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"child failed ({p.returncode}): {p.stderr}")
    r = json.loads(line[7:])
    print(f"# records of {args.record} B, {n} of them ({n * args.record / GIB:.2f} GiB), stated budget "
          f"{args.budget_mib} MiB, {r['policy']} reads")
    print(f"record cache: capacity {r['cache_capacity'] / MIB:.0f} MiB, holds {r['cache_entries']} records "
          f"({r['cache_held'] / MIB:.0f} MiB of record bytes)")
    print(f"RSS before the reads {r['before'] / MIB:.0f} MiB, peak {r['hwm'] / MIB:.0f} MiB")
    print(f"peak RSS / budget = {r['hwm'] / budget:.3f}; (peak - before) / budget = "
          f"{(r['hwm'] - r['before']) / budget:.3f}")


def main() -> None:
    if "--child-rank" in sys.argv:
        rank_child(json.loads(sys.argv[sys.argv.index("--child-rank") + 1]))
        return
    if "--child-rss" in sys.argv:
        rss_child(json.loads(sys.argv[sys.argv.index("--child-rss") + 1]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", action="store_true")
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--gib", type=float, default=3.2)
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--secs", type=float, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scenarios", default="working,squatted,full,apart")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--record", type=int, default=65_537)
    ap.add_argument("--budget-mib", type=int, default=512)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (cgroups, drop_caches, another user, mounts): nothing measured")
        return
    common.notes.clear()
    if args.rss:
        rss_main(args)
    else:
        ranks_main(args)


if __name__ == "__main__":
    main()
