"""Memory-budget benchmark: zring and loaderx under a memory cgroup limit.

For each ratio dataset/budget in 0.5, 1.5, 3 and 10 the memory budget is set
with a memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``), and
every measurement runs in a fresh subprocess that moves itself into a fresh
cgroup with that limit before it imports numpy or touches the data. Before
each run the page cache is emptied (``sync``, then ``3`` into drop_caches), so
every run starts cold; a run lasts ``--secs`` and reports its steady state,
the second half. Measured per budget:

  1. random gathers, 256 uniform random indices per batch
     (``Dataset.__getitems__``), MiB/s;
  2. the DataLoader end to end, batch 256, 2 workers, prefetch 4, mode 2
     (cyclic: every record once per pass), MiB/s;
  3. the same DataLoader in mode 1 (iid draws with replacement), where the
     loader looks ahead at the draws to come and the record cache keeps the
     records drawn again soonest, MiB/s;

each for zring's default (no ``ZRING_DIRECT``), forced buffered reads
(``ZRING_DIRECT=0``), forced O_DIRECT (``ZRING_DIRECT=1``) and loaderx 0.7.3,
plus the hit rate and read policy of zring's default run when its stats expose
them, and fio's random 12 KiB O_DIRECT reads on the store's largest chunk file
as the disk's ceiling for this access pattern.

A run that the cgroup's OOM killer ends is reported as ``OOM`` in its cell.
The cgroups are removed at the end, also on errors and on SIGTERM/SIGINT.

Usage (as root, in the project venv, with zring built by
``maturin develop --release``):

    python benches/budget.py [--quick] [--gib N] [--secs S] [--data DIR] [--out DIR]
                             [--ratios R,R,...] [--kinds gather,loader,loader_iid]

The stores (raw codec, 12 KiB records of random bytes, one zring and one
loaderx) go to $ZRING_BENCH_DIR/budget (default ``bench-data/budget``; never
/tmp, which may be memory) and are reused when present and complete. Tables go
to stdout and ``bench-results/budget.md`` (the README's results table links
there). Without root or a memory cgroup controller the script
says so and exits 0 without measuring.
"""

from __future__ import annotations

# Only the standard library at module level: a measuring child joins its cgroup
# before it imports numpy, zring or loaderx, so all of their memory is charged.
import argparse
import atexit
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (the benches' shared helpers; standard library only)
from common import (  # noqa: E402
    REPO,
    Cgroups,
    drop_caches,
    fio_randread,
    note,
    notes,
    proc_read_bytes,
    shown,
)

RECORD_SHAPE = (3, 64, 64)  # uint8, 12 KiB
RECORD = 3 * 64 * 64
BATCH = 256
SEED = 7
RATIOS = (0.5, 1.5, 3.0, 10.0)  # dataset / budget
LOADER = dict(num_workers=2, batch_size=BATCH, prefetch_size=4, mode=2, seed=1)
FIO_SECS = 5
FIO_DEPTH = 32
CHILD_GRACE = 120  # seconds a child may take beyond --secs before it is killed
MIB = 1 << 20
GIB = 1 << 30
DATA_VERSION = 1  # bumped when the stored data changes, so older stores are rebuilt

# column key -> (header, library, ZRING_DIRECT value or None)
COLUMNS = {
    "default": ("zring default", "zring", None),
    "buffered": ("zring ZRING_DIRECT=0", "zring", "0"),
    "direct": ("zring ZRING_DIRECT=1", "zring", "1"),
    "loaderx": ("loaderx 0.7.3", "loaderx", None),
}
KINDS = {"gather": "Random gathers", "loader": "DataLoader end to end",
         "loader_iid": "DataLoader end to end, iid draws"}
WHAT = {
    "gather": "256 uniform random indices per batch, `Dataset.__getitems__`",
    "loader": "batch 256, 2 workers, prefetch 4, mode 2 (cyclic), seed 1; 1 batch = 3 MiB",
    "loader_iid": "as above in mode 1 (iid, with replacement): zring looks ahead at the draws to come",
}



# --------------------------------------------------------------------------
# cgroups
# --------------------------------------------------------------------------

# --------------------------------------------------------------------------
# the measuring child
# --------------------------------------------------------------------------

def flat(d, pre: str = "") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{pre}{k}."))
            else:
                out[f"{pre}{k}"] = v
    return out


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def major_faults() -> int:
    """Major page faults of this process so far (pages it had to read back
    from disk: its own code and mapped files, evicted under the limit)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def cgroup_stat(cg: str | None) -> dict:
    """Anonymous and page-cache bytes of the child's cgroup now."""
    if not cg:
        return {}
    try:
        kv = dict(line.split() for line in Path(cg, "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return {}
    if "total_rss" in kv:  # v1 (hierarchical totals)
        return {"anon": int(kv["total_rss"]), "cache": int(kv.get("total_cache", 0))}
    if "anon" in kv:  # v2
        return {"anon": int(kv["anon"]), "cache": int(kv.get("file", 0))}
    return {}


def child(spec: dict) -> None:
    cg = spec.get("cgroup")
    if cg:
        Path(cg, "cgroup.procs").write_text(str(os.getpid()))
    import numpy as np

    lib = importlib.import_module(spec["lib"])
    ds = lib.Dataset(spec["path"])
    n = len(ds)
    secs = float(spec["secs"])
    dl = None
    anon_peak = 0

    if spec["kind"] == "gather":
        rng = np.random.default_rng(SEED)
        get = ds.__getitems__

        def step() -> None:
            get(rng.integers(0, n, size=BATCH, dtype=np.int64))
    elif spec["kind"] in ("loader", "loader_iid"):
        dl = lib.DataLoader({"data": ds}, **dict(LOADER, mode=1 if spec["kind"] == "loader_iid" else 2))

        def step() -> None:
            next(dl)
    else:  # probe: the process's own footprint, no time limit, no cgroup
        rng = np.random.default_rng(SEED)
        for _ in range(20):
            ds.__getitems__(rng.integers(0, n, size=BATCH, dtype=np.int64))
            anon_peak = max(anon_peak, status_kib("RssAnon"))
        dl = lib.DataLoader({"data": ds}, **LOADER)
        for _ in range(40):
            next(dl)
            anon_peak = max(anon_peak, status_kib("RssAnon"))
        print("RESULT " + json.dumps({"anon": anon_peak * 1024, "libs": status_kib("VmLib") * 1024}), flush=True)
        os._exit(0)

    def snapshot() -> dict:
        out = {}
        for name, obj in (("dataset", ds), ("loader", dl)):
            fn = getattr(obj, "stats", None) if obj is not None else None
            if fn is not None:
                try:
                    out[name] = fn()
                except Exception as e:  # noqa: BLE001
                    out[name] = {"error": repr(e)}
        for name in ("_s", "_store"):  # the underlying store, if it has stats of its own
            obj = getattr(ds, name, None)
            fn = getattr(obj, "stats", None)
            if fn is not None and "store" not in out:
                try:
                    out["store"] = fn()
                except Exception:  # noqa: BLE001
                    pass
        return out

    start_stats = snapshot()
    done: list[float] = []
    mid = None
    t0 = time.perf_counter()
    io0 = proc_read_bytes()
    while True:
        step()
        t = time.perf_counter() - t0
        done.append(t)
        if mid is None and t >= secs / 2:
            mid = {"t": t, "k": len(done), "io": proc_read_bytes(), "majflt": major_faults(), "stats": snapshot()}
        if len(done) % 16 == 0:
            anon_peak = max(anon_peak, status_kib("RssAnon"))
        if t >= secs:
            break
    end = {"t": done[-1], "k": len(done), "io": proc_read_bytes(), "majflt": major_faults(), "stats": snapshot()}
    mem = cgroup_stat(cg)
    anon_peak = max(anon_peak, status_kib("RssAnon"))
    steady_batches = end["k"] - mid["k"]
    steady_secs = end["t"] - mid["t"]
    if steady_batches < 2 or steady_secs <= 0:  # slower than a batch per half run
        steady_batches, steady_secs = end["k"] - mid["k"] + 1, end["t"] - secs / 2
    steady_bytes = steady_batches * BATCH * RECORD
    res = {
        "batches": len(done),
        "secs": end["t"],
        "mib_s": steady_bytes / MIB / steady_secs if steady_secs > 0 else 0.0,
        "whole_mib_s": len(done) * BATCH * RECORD / MIB / end["t"],
        "first_batch_s": done[0],
        "steady_batches": steady_batches,
        "disk_per_delivered": (end["io"] - mid["io"]) / steady_bytes if steady_bytes else None,
        "disk_mib_whole": (end["io"] - io0) / MIB,
        "majflt_per_batch": (end["majflt"] - mid["majflt"]) / steady_batches,
        "anon_peak": anon_peak * 1024,
        "cgroup_end": mem,
        "stats_start": start_stats,
        "stats_mid": mid["stats"],
        "stats_end": end["stats"],
    }
    print("RESULT " + json.dumps(res, default=str), flush=True)
    # Skip interpreter teardown (loader threads, GC of the store): the result is out.
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------
# reading zring's stats (whatever keys the build exposes)
# --------------------------------------------------------------------------

def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def hit_rate(mid: dict, end: dict) -> tuple[float | None, str | None]:
    """Hit rate between two stats snapshots, from the first pair of keys named
    like ``*hits``/``*misses`` (or ``*hit``/``*miss``); cache-named keys first."""
    fm, fe = flat(mid), flat(end)

    def rank(k: str):
        return ("cache" not in k.lower(), k.count("."), k)

    for key in sorted(fe, key=rank):
        for h, m in (("hits", "misses"), ("hit", "miss"), ("Hits", "Misses")):
            if key.endswith(h):
                mkey = key[: len(key) - len(h)] + m
                if mkey in fe and _num(fe[key]) and _num(fe[mkey]):
                    h0, m0 = fm.get(key, 0), fm.get(mkey, 0)
                    dh = fe[key] - (h0 if _num(h0) else 0)
                    dm = fe[mkey] - (m0 if _num(m0) else 0)
                    if dh + dm <= 0:
                        return None, key
                    return dh / (dh + dm), key
    return None, None


def policy(stats: dict) -> str:
    f = flat(stats)
    for want in ("policy", "read_policy"):
        for key in sorted(f, key=lambda k: (k.count("."), k)):
            if key.rsplit(".", 1)[-1].lower() == want:
                v = f[key]
                return v if isinstance(v, str) else json.dumps(v, default=str)
        # a policy given as a dict flattens to <...>policy.<field>: show its fields
        for key in sorted(f, key=lambda k: (k.count("."), k)):
            parts = key.split(".")
            if len(parts) >= 2 and parts[-2].lower() == want:
                prefix = key.rsplit(".", 1)[0] + "."
                return ", ".join(f"{k[len(prefix):]}={v}" for k, v in f.items() if k.startswith(prefix))
    return "-"


def direct_flag(stats: dict) -> str:
    f = flat(stats)
    for key in sorted(f, key=lambda k: (k.count("."), k)):
        if key.rsplit(".", 1)[-1] == "direct":
            return "O_DIRECT" if f[key] else "buffered"
    return "-"


def budget_seen(stats: dict) -> str:
    f = flat(stats)
    for key in sorted(f, key=lambda k: (k.count("."), k)):
        leaf = key.rsplit(".", 1)[-1].lower()
        if "budget" in leaf and _num(f[key]):
            return f"{f[key] / MIB:.0f}"
    return "-"


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def ensure_data(root: Path, gib: float, libs: tuple[str, ...] = ("zring", "loaderx")) -> tuple[dict[str, Path], int]:
    import numpy as np

    n = int(gib * GIB) // RECORD
    paths = {lib: root / f"{lib}-raw-{n}" for lib in libs}
    stamp = {"records": n, "record_shape": list(RECORD_SHAPE), "version": DATA_VERSION, "codec": "raw"}
    todo = []
    for lib, p in paths.items():
        marker = root / f"{p.name}.complete"
        ok = False
        if p.is_dir() and marker.is_file():
            try:
                ok = json.loads(marker.read_text()) == stamp
            except ValueError:
                ok = False
        if not ok:
            todo.append(lib)
    if not todo:
        print(f"  reusing {n} records ({n * RECORD / GIB:.2f} GiB) per store in {shown(root)}", file=sys.stderr)
        return paths, n
    root.mkdir(parents=True, exist_ok=True)
    print(f"  writing {n} × 12 KiB random records ({n * RECORD / GIB:.2f} GiB) for {', '.join(todo)} ...",
          file=sys.stderr, flush=True)
    arr = np.empty((n, *RECORD_SHAPE), dtype=np.uint8)
    flat_arr = arr.reshape(-1)
    rng = np.random.default_rng(SEED)
    block = 64 * MIB
    for s in range(0, flat_arr.size, block):
        e = min(flat_arr.size, s + block)
        flat_arr[s:e] = np.frombuffer(rng.bytes(e - s), dtype=np.uint8)
    for lib in todo:
        p = paths[lib]
        marker = root / f"{p.name}.complete"
        marker.unlink(missing_ok=True)
        if p.exists():
            shutil.rmtree(p)
        t = time.perf_counter()
        importlib.import_module(lib).write_dataset(str(p), arr, codec="raw")
        os.sync()
        print(f"  {lib}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        marker.write_text(json.dumps(stamp))
    del arr, flat_arr
    return paths, n


def store_bytes(p: Path) -> int:
    """Bytes allocated on disk (loaderx preallocates sparse files)."""
    return sum(f.stat().st_blocks * 512 for f in p.rglob("*") if f.is_file())


# --------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------

def child_env(direct: str | None) -> dict:
    env = dict(os.environ)
    for k in ("ZRING_DIRECT", "ZRING_CACHE_BYTES"):
        env.pop(k, None)
    if direct is not None:
        env["ZRING_DIRECT"] = direct
    return env


def spawn(spec: dict, env: dict, timeout: float) -> tuple[int | None, str, str, bool]:
    return spawn_script(Path(__file__), spec, env, timeout)


def spawn_script(script: Path, spec: dict, env: dict, timeout: float) -> tuple[int | None, str, str, bool]:
    """Runs ``script --child SPEC`` in a new session; kills it after ``timeout``."""
    p = subprocess.Popen([sys.executable, str(script.resolve()), "--child", json.dumps(spec)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True, cwd=REPO)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    return p.returncode, out, err, timed_out


def measure_in_cgroup(script: Path, cgs: Cgroups | None, name: str, spec: dict, limit: int | None, env: dict,
                      timeout: float, what: str, spawner=None) -> tuple[dict | None, object]:
    """Runs ``script --child SPEC`` once, in a fresh memory cgroup ``name`` of
    ``limit`` bytes when ``cgs`` and ``limit`` are given (the child joins it,
    named by ``spec["cgroup"]``, before it imports anything), and removes the
    cgroup after. Returns the child's ``RESULT`` (``None``, with a note
    naming ``what``, its exit status and whether the OOM killer ended it,
    when there is none) and whatever else ``spawner`` returned.

    ``spawner(spec)`` runs the child and returns ``(returncode, stdout,
    stderr, extra)``; by default :func:`spawn_script` with ``env`` and
    ``timeout``."""
    cg = None
    if cgs is not None and limit:
        cg, _ = cgs.create(name, limit)
        spec = dict(spec, cgroup=str(cg))
    ooms = 0
    try:
        rc, out, err, extra = (spawner or (lambda s: spawn_script(script, s, env, timeout)))(spec)
        ooms = cgs.oom_kills(cg) if cg else 0
    finally:
        if cg:
            cgs.remove(cg)
    res = parse_result(out) if rc == 0 else None
    if res is None:
        note(f"{what}: exit {rc}{' (OOM)' if ooms else ''}: {' | '.join(err.strip().splitlines()[-3:])}")
    return res, extra


def parse_result(out: str) -> dict | None:
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def probe(paths: dict[str, Path]) -> dict:
    """Each library's own footprint (no cgroup): peak anonymous memory and
    mapped shared libraries, over 20 gathers and 40 loader batches."""
    out = {}
    for lib in ("zring", "loaderx"):
        rc, so, se, _ = spawn({"kind": "probe", "lib": lib, "path": str(paths[lib]), "secs": 0}, child_env(None), 300)
        r = parse_result(so) if rc == 0 else None
        if r is None:
            note(f"{lib} probe failed (rc {rc}): {se.strip().splitlines()[-1:] }")
        else:
            out[lib] = r
    return out


def run_one(cgs: Cgroups, seq: int, kind: str, col: str, path: Path, limit: int, secs: float) -> dict:
    header, lib, direct = COLUMNS[col]
    drop_caches()
    cg, limit_set = cgs.create(f"zring-bench-{os.getpid()}-{seq}", limit)
    try:
        spec = {"kind": kind, "lib": lib, "path": str(path), "secs": secs, "cgroup": str(cg)}
        t = time.perf_counter()
        rc, out, err, timed_out = spawn(spec, child_env(direct), secs + CHILD_GRACE)
        wall = time.perf_counter() - t
        ooms = cgs.oom_kills(cg)
        peak = cgs.peak(cg)
    finally:
        cgs.remove(cg)
    res = parse_result(out) if rc == 0 else None
    if res is not None:
        res["status"] = "ok"
    elif ooms > 0:
        res = {"status": "OOM"}
    elif timed_out:
        res = {"status": "timeout"}
        note(f"{KINDS[kind]}, {header}, limit {limit_set / MIB:.0f} MiB: no result within {secs + CHILD_GRACE:.0f} s")
    else:
        res = {"status": "error"}
        tail = " | ".join(err.strip().splitlines()[-3:])
        note(f"{KINDS[kind]}, {header}, limit {limit_set / MIB:.0f} MiB: exit {rc}: {tail}")
    res.update(limit=limit_set, peak=peak, ooms=ooms, rc=rc, wall=wall, kind=kind, col=col)
    return res


def run_fio(store: Path) -> dict | None:
    drop_caches()
    return fio_randread(store, FIO_SECS, FIO_DEPTH)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def fmt_ratio(r: float) -> str:
    return f"{r:g}"


def cell(res: dict | None, fio: float | None) -> str:
    if res is None:
        return "-"
    if res["status"] != "ok":
        return res["status"]
    v = res["mib_s"]
    return f"{v:.0f} ({v / fio:.2f})" if fio else f"{v:.0f}"


def val(res: dict | None) -> float | None:
    return res["mib_s"] if res and res.get("status") == "ok" else None


def div(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def tables(results: dict, fio: dict | None, data_bytes: int) -> str:
    f = fio["mib_s"] if fio else None
    parts = []
    for kind, title in KINDS.items():
        if not any(k == kind for _, k in results):
            continue
        what = WHAT[kind]
        parts.append(f"### {title}: steady-state MiB/s ({what})\n")
        heads = [h for h, _, _ in COLUMNS.values()]
        parts.append("| dataset/budget | budget/dataset | budget MiB | " + " | ".join(heads)
                     + " | default ÷ best forced | default ÷ forced O_DIRECT | hit rate (default) | policy (default) |")
        parts.append("|---:" * (len(heads) + 5) + "|---|---|")
        for ratio in RATIOS:
            row = results.get((ratio, kind), {})
            if not row:
                continue
            limit = next(iter(row.values()))["limit"]
            d, b, o = val(row.get("default")), val(row.get("buffered")), val(row.get("direct"))
            best = max((x for x in (b, o) if x is not None), default=None)
            dr = row.get("default") or {}
            hr = "-"
            pol = "-"
            if dr.get("status") == "ok":
                h, _ = hit_rate(dr["stats_mid"], dr["stats_end"])
                hr = f"{h:.1%}" if h is not None else "-"
                pol = policy(dr["stats_end"])
            parts.append(f"| {fmt_ratio(ratio)} | {1 / ratio:.3g} | {limit / MIB:.0f} | "
                         + " | ".join(cell(row.get(c), f) for c in COLUMNS)
                         + f" | {div(d, best)} | {div(d, o)} | {hr} | {pol} |")
        parts.append("")
    if f:
        parts.append(f"Cells: steady-state MiB/s (the second half of each run) and, in brackets, its ratio to the "
                     f"disk's ceiling for this access pattern, fio's random 12 KiB O_DIRECT reads at queue depth "
                     f"{FIO_DEPTH}: **{f:.0f} MiB/s** ({fio['iops']:.0f} IOPS). Above 1 the page cache or zring's "
                     f"record cache is serving part of the reads.\n")
    else:
        parts.append("Cells: steady-state MiB/s (the second half of each run); no fio ceiling (see notes).\n")
    return "\n".join(parts)


def diag_table(results: dict) -> str:
    lines = ["### Per run",
             "",
             "`disk ÷ delivered`: bytes the process read from the block device (its I/O accounting, `read_bytes`) per byte it "
             "delivered, in the steady state (above 1: pages read and evicted before use, i.e. thrashing; "
             "below 1: hits). `peak`: the cgroup's peak usage, page cache included. `anon`, `cache`: the "
             "cgroup's anonymous and page-cache bytes at the end. `direct`: zring's `direct` stat at the end. "
             "`zring budget`: a budget figure from zring's stats, if any. `major faults`: the process's major page "
             "faults per batch in the steady state (pages of its own code or mapped files read back from disk: "
             "above 0, the limit is squeezing the program itself).",
             "",
             "| dataset/budget | measurement | column | steady MiB/s | whole-run MiB/s | first batch s | disk ÷ delivered | peak MiB | anon MiB | cache MiB | direct | zring budget MiB | major faults | hit/miss keys |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for ratio in RATIOS:
        for kind in KINDS:
            for col, r in results.get((ratio, kind), {}).items():
                head = COLUMNS[col][0]
                if r["status"] != "ok":
                    lines.append(f"| {fmt_ratio(ratio)} | {kind} | {head} | {r['status']} | | | | "
                                 f"{(r['peak'] or 0) / MIB:.0f} | | | | | | |")
                    continue
                mem = r.get("cgroup_end") or {}
                dpd = r.get("disk_per_delivered")
                _, key = hit_rate(r["stats_mid"], r["stats_end"])
                lines.append(
                    f"| {fmt_ratio(ratio)} | {kind} | {head} | {r['mib_s']:.0f} | {r['whole_mib_s']:.0f} | "
                    f"{r['first_batch_s']:.3f} | {'-' if dpd is None else f'{dpd:.2f}'} | "
                    f"{(r['peak'] or 0) / MIB:.0f} | {mem.get('anon', 0) / MIB:.0f} | {mem.get('cache', 0) / MIB:.0f} | "
                    f"{direct_flag(r['stats_end']) if COLUMNS[col][1] == 'zring' else '-'} | "
                    f"{budget_seen(r['stats_end']) if COLUMNS[col][1] == 'zring' else '-'} | "
                    f"{r.get('majflt_per_batch', 0):.1f} | {key or '-'} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 s per run instead of 30")
    ap.add_argument("--secs", type=float, default=None, help="seconds per run (default 30, --quick 10)")
    ap.add_argument("--gib", type=float, default=2.0, help="store size in GiB (default 2)")
    ap.add_argument("--data", type=Path, default=None, help="data directory (default $ZRING_BENCH_DIR/budget)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    ap.add_argument("--ratios", default=None, help="dataset/budget ratios to run (default 0.5,1.5,3,10)")
    ap.add_argument("--kinds", default=None, help=f"measurements to run (default {','.join(KINDS)})")
    args = ap.parse_args()
    ratios = tuple(float(r) for r in args.ratios.split(",")) if args.ratios else RATIOS
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"--kinds: unknown measurement {k!r} (known: {', '.join(KINDS)})")
    secs = args.secs if args.secs is not None else (10.0 if args.quick else 30.0)
    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "budget"
    if str(data.resolve()).startswith("/tmp"):
        raise SystemExit("the benchmark data must not live in /tmp (it may be memory)")

    if os.geteuid() != 0:
        print("budget.py: skipped: it sets memory cgroup limits and drops the page cache, which needs root",
              file=sys.stderr)
        return
    try:
        cgs = Cgroups()
    except Exception as e:  # noqa: BLE001
        print(f"budget.py: skipped: no usable memory cgroup ({e})", file=sys.stderr)
        return
    atexit.register(cgs.cleanup)

    def on_signal(signum, _frame):
        cgs.cleanup()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    t_start = time.perf_counter()
    try:
        paths, n = ensure_data(data, args.gib)
        data_bytes = n * RECORD
        stored = {lib: store_bytes(p) for lib, p in paths.items()}
        print(f"  stores: {', '.join(f'{k} {v / MIB:.0f} MiB' for k, v in stored.items())}", file=sys.stderr)

        foot = probe(paths)
        fio = run_fio(paths["zring"])
        if fio:
            print(f"  fio ceiling: {fio['mib_s']:.0f} MiB/s", file=sys.stderr, flush=True)

        results: dict = {}
        seq = 0
        for ratio in ratios:
            limit = int(data_bytes / ratio)
            for kind in kinds:
                row = results.setdefault((ratio, kind), {})
                for col in COLUMNS:
                    seq += 1
                    r = run_one(cgs, seq, kind, col, paths[COLUMNS[col][1]], limit, secs)
                    row[col] = r
                    shown_v = f"{r['mib_s']:.0f} MiB/s" if r["status"] == "ok" else r["status"]
                    print(f"  ratio {ratio:g} ({r['limit'] / MIB:.0f} MiB) {kind:6} {COLUMNS[col][0]:22} {shown_v}",
                          file=sys.stderr, flush=True)
    finally:
        cgs.cleanup()

    # ---- report
    argv = " ".join(sys.argv[1:])
    cmd = f"python benches/budget.py{(' ' + argv) if argv else ''}"
    min_budget = int(data_bytes / max(RATIOS))
    floor_lines = []
    for lib, fp in foot.items():
        floor_lines.append(f"{lib} {fp['anon'] / MIB:.0f} MiB anonymous + {fp['libs'] / MIB:.0f} MiB of mapped libraries")
    floor = max((fp["anon"] + fp["libs"] for fp in foot.values()), default=0)
    out = [f"## Memory budgets: zring vs loaderx under a cgroup memory limit ({secs:g} s per run)", ""]
    out.append(f"Machine: {common.machine(data)}. Versions: {common.versions(('numpy', 'zring', 'loaderx'))}.")
    out.append("")
    out.append(f"Stores: {n} × 12 KiB random records, codec raw, {data_bytes / GIB:.2f} GiB of records "
               f"(allocated on disk: " + ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in stored.items()) + "). "
               f"Budget = records ÷ ratio, the cgroup limit as the kernel set it; it covers everything the "
               f"process charges: its own memory and the page cache it fills. {cgs.describe()}; before every "
               f"run `sync` and drop_caches = 3 (the kernel's page cache emptied), so every run starts cold, and the "
               f"steady state reported is the run's second half.")
    out.append("")
    if floor_lines:
        out.append(f"Each process's own footprint before any data (measured without a limit over 20 gathers and "
                   f"40 loader batches): {'; '.join(floor_lines)}. The smallest budget here is "
                   f"{min_budget / MIB:.0f} MiB"
                   + (f", {min_budget / floor:.1f}× that footprint." if floor else ".")
                   + (" **It is below the footprint: raise `--gib` for a meaningful ratio-10 row.**"
                      if floor and min_budget < 1.2 * floor else ""))
        out.append("")
    out.append(tables(results, fio, data_bytes))
    out.append("`hit rate (default)`: zring's own cache hits ÷ (hits + misses) over the default run's steady state, "
               "from the first `*hits`/`*misses` pair in `Dataset.stats()` / `DataLoader.stats()`; `policy`: a "
               "`policy`/`read_policy` entry of the same stats; `-` where this build exposes neither. "
               "`default ÷ best forced`: zring's default over the better of ZRING_DIRECT=0 and =1.")
    out.append("")
    if fio:
        out.append(f"fio ceiling command (after the same cache drop): `{fio['cmd']}`.")
        out.append("")
    if notes:
        out.append("Notes: " + " ".join(f"{m.rstrip('.')}." for m in notes))
        out.append("")
    out.append(f"Total run time {time.perf_counter() - t_start:.0f} s. Command: `{cmd}` (as root).")
    summary = "\n".join(out)
    full = summary + "\n\n" + diag_table(results) + "\n"
    print(full)
    common.write_result(args.out / "budget.md", full)
    print(f"  wrote {shown(args.out / 'budget.md')}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
