"""Host benchmark: several ranks in one memory cgroup, several stores in one process.

A training host runs one process per accelerator in one memory cgroup, each
reading one or several stores. This benchmark measures that shape:

* ``ranks``: N processes (2, 4, 8), each a DataLoader (iid draws, batch 256,
  its own shard of every step) over the same raw store, all in one fresh
  memory cgroup whose limit is ``budget/dataset`` times the store's bytes.
* ``stores``: one process reading K stores at once (2, 4: K DataLoaders over
  K stores of 1/K of the data each, called in turn, as the sources of a
  mixture are), in a cgroup of the same limits.

Each configuration runs with zring's default read policy, forced buffered
(``ZRING_DIRECT=0``) and forced O_DIRECT (``ZRING_DIRECT=1``), the page cache
dropped before each run. Reported per run: the ranks' summed steady-state
MiB/s (second half of the run), the slowest single ``next()`` of any rank, and
OOM kills. Needs root (cgroups, drop_caches); the data lives in
``$ZRING_BENCH_DIR/host`` (never /tmp).

    python benches/host.py --gib 6 --secs 20
"""

# Only the standard library at module level (a child joins its cgroup first).
import argparse
import atexit
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget  # noqa: E402  (the budget benchmark's child helpers)
import common  # noqa: E402  (cgroups, drop_caches, fio, notes)

REPO = common.REPO
RECORD = budget.RECORD
RECORD_SHAPE = budget.RECORD_SHAPE
BATCH = 256
LOADER = dict(num_workers=2, batch_size=BATCH, prefetch_size=4, mode=1, seed=1)
RANKS = (2, 4, 8)
STORES = (2, 4)
BUDGETS = (0.5, 0.33, 1.5)  # budget / dataset
SLOW_STEP_S = 1.0
MIB = 1 << 20
GIB = 1 << 30
COLUMNS = {"default": None, "buffered": "0", "direct": "1"}


def child(spec: dict) -> None:
    cg = spec["cgroup"]
    Path(cg, "cgroup.procs").write_text(str(os.getpid()))
    # Every rank starts together: the parent opens the gate once all joined.
    gate = spec["gate"]
    while not Path(gate).exists():
        time.sleep(0.005)
    import zring

    paths, rank, ranks = spec["paths"], spec["rank"], spec["ranks"]
    if spec.get("mix"):
        # One loader over a mixture of the stores (benches/mix.py).
        sources = [{"x": zring.Dataset(p)} for p in paths]
        loaders = [zring.DataLoader(zring.mix(sources, spec["mix"]), **LOADER, shard=(rank, ranks))]
    else:
        loaders = [zring.DataLoader({"x": zring.Dataset(p)}, **LOADER, shard=(rank, ranks)) for p in paths]
    secs = float(spec["secs"])
    per_step = BATCH // ranks * RECORD
    worst = 0.0
    done = 0
    mid = None
    t0 = time.perf_counter()
    while True:
        for dl in loaders:
            s = time.perf_counter()
            next(dl)
            worst = max(worst, time.perf_counter() - s)
            done += 1
        t = time.perf_counter() - t0
        if mid is None and t >= secs / 2:
            mid = (t, done)
        if t >= secs:
            break
    stats = [dl.stats() for dl in loaders]
    res = {
        "mib_s": (done - mid[1]) * per_step / MIB / (t - mid[0]),
        "worst_step_s": worst,
        "steps": done,
        "stats": stats,
    }
    print("RESULT " + json.dumps(res, default=str), flush=True)
    os._exit(0)


def ensure_data(root: Path, gib: float, parts: int) -> list[Path]:
    """`parts` raw stores of 12 KiB records holding `gib` GiB between them."""
    import numpy as np
    import zring

    n = int(gib * GIB) // RECORD // parts
    out = []
    rng = np.random.default_rng(7)
    for k in range(parts):
        p = root / f"raw-{n}-{k}-of-{parts}"
        marker = root / f"{p.name}.complete"
        out.append(p)
        if p.is_dir() and marker.is_file():
            continue
        root.mkdir(parents=True, exist_ok=True)
        print(f"  writing {p.name} ({n * RECORD / GIB:.2f} GiB) ...", file=sys.stderr, flush=True)
        arr = np.frombuffer(rng.bytes(n * RECORD), dtype=np.uint8).reshape(n, *RECORD_SHAPE)
        zring.write_dataset(str(p), arr, codec="raw", overwrite=True)
        os.sync()
        marker.write_text("ok")
        del arr
    return out


def spawn(spec: dict, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, cwd=REPO)


def run(cgs, seq: int, paths: list[Path], ranks: int, limit: int, col: str, secs: float,
        mix: list[float] | None = None) -> dict:
    """One configuration in a fresh cgroup; with ``mix``, each rank reads one
    DataLoader over ``zring.mix`` of the stores with these weights."""
    common.drop_caches()
    cg, limit_set = cgs.create(f"zring-host-{os.getpid()}-{seq}", limit)
    gate = Path(cg).parent / f"zring-host-{os.getpid()}-{seq}.go"
    gate_file = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / f".gate-{os.getpid()}-{seq}"
    env = budget.child_env(COLUMNS[col])
    procs = []
    try:
        for r in range(ranks):
            spec = {"cgroup": str(cg), "gate": str(gate_file), "paths": [str(p) for p in paths],
                    "rank": r, "ranks": ranks, "secs": secs, "mix": mix}
            procs.append(spawn(spec, env))
        time.sleep(0.5)
        gate_file.write_text("go")
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=secs + budget.CHILD_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
        ooms = cgs.oom_kills(cg)
        peak = cgs.peak(cg)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        gate_file.unlink(missing_ok=True)
        del gate
        cgs.remove(cg)
    results = [budget.parse_result(o) if rc == 0 else None for rc, o, _ in outs]
    failed = [(rc, e) for (rc, _, e), r in zip(outs, results) if r is None]
    for rc, e in failed[:2]:
        common.note(f"{col}, {ranks} ranks, limit {limit_set / MIB:.0f} MiB: exit {rc}: "
                    f"{' | '.join(e.strip().splitlines()[-2:])}")
    ok = [r for r in results if r]
    return {
        "col": col, "limit": limit_set, "ooms": ooms, "peak": peak, "failed": len(failed),
        "mib_s": sum(r["mib_s"] for r in ok) if not failed else None,
        "worst_step_s": max((r["worst_step_s"] for r in ok), default=None),
        "stats": [r["stats"] for r in ok],
    }


def cell(r: dict) -> str:
    if r["mib_s"] is None and not r["failed"]:
        return "-"
    if r["failed"]:
        return f"{r['failed']} failed" + (f", {r['ooms']} OOM" if r["ooms"] else "")
    return f"{r['mib_s']:.0f}"


def policy(r: dict) -> str:
    pols = set()
    for rank in r["stats"]:
        for s in rank:
            for st in (s.get("reads") or {}).values():
                if isinstance(st, dict) and st.get("policy"):
                    pols.add(st["policy"])
    return "/".join(sorted(pols)) or "-"


def table(rows: list[tuple[str, float, dict]], fio: float | None) -> str:
    lines = ["| setup | budget/dataset | limit MiB | default | forced buffered | forced O_DIRECT | "
             "default ÷ O_DIRECT | default ÷ buffered | slowest step s (default) | OOM kills (default) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    missing = {"col": "-", "limit": 0, "ooms": 0, "peak": None, "failed": 0, "mib_s": None, "worst_step_s": None}
    for setup, ratio, res in rows:
        d, b, o = (res.get(c, dict(missing, col=c)) for c in ("default", "buffered", "direct"))

        def div(x, y):
            return f"{x['mib_s'] / y['mib_s']:.2f}" if x["mib_s"] and y["mib_s"] else "-"

        lines.append(f"| {setup} | {ratio:g} | {d['limit'] / MIB:.0f} | {cell(d)} | {cell(b)} | {cell(o)} | "
                     f"{div(d, o)} | {div(d, b)} | "
                     f"{'-' if d['worst_step_s'] is None else format(d['worst_step_s'], '.2f')} | {d['ooms']} |")
    if fio:
        lines.append(f"\nCells: the ranks' summed steady-state MiB/s. Disk ceiling (fio, random 12 KiB O_DIRECT, "
                     f"queue depth 32): **{fio:.0f} MiB/s**.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=20.0)
    ap.add_argument("--gib", type=float, default=6.0, help="data in GiB (default 6)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    ap.add_argument("--stores", default=",".join(map(str, STORES)), help="store counts of the one-process rows ('' for none)")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="budget/dataset ratios")
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("host.py: skipped: it sets memory cgroup limits and drops the page cache, which needs root",
              file=sys.stderr)
        return
    data = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "host"
    if str(data.resolve()).startswith("/tmp"):
        raise SystemExit("the benchmark data must not live in /tmp (it may be memory)")
    cgs = common.Cgroups()
    atexit.register(cgs.cleanup)
    signal.signal(signal.SIGTERM, lambda s, f: (cgs.cleanup(), sys.exit(128 + s)))
    ranks = [int(x) for x in args.ranks.split(",") if x]
    stores = [int(x) for x in args.stores.split(",") if x]
    budgets = [float(x) for x in args.budgets.split(",") if x]
    for c in list(COLUMNS):
        if c not in args.columns.split(","):
            del COLUMNS[c]
    one = ensure_data(data, args.gib, 1)
    data_bytes = int(args.gib * GIB) // RECORD * RECORD
    common.drop_caches()
    fio = common.fio_randread(one[0], 5)
    fio_mib = fio["mib_s"] if fio else None
    rows = []
    seq = 0
    setups = [(f"{n} ranks, 1 store", one, n) for n in ranks]
    setups += [(f"1 process, {k} stores", ensure_data(data, args.gib, k), 1) for k in stores]
    t0 = time.perf_counter()
    for setup, paths, n in setups:
        for ratio in budgets:
            res = {}
            for col in COLUMNS:
                seq += 1
                res[col] = run(cgs, seq, paths, n, int(data_bytes * ratio), col, args.secs)
                print(f"  {setup}, budget/dataset {ratio:g}, {col}: {cell(res[col])} MiB/s, "
                      f"slowest step {res[col]['worst_step_s']}, policy {policy(res[col])}", file=sys.stderr,
                      flush=True)
            rows.append((setup, ratio, res))
    body = table(rows, fio_mib)
    head = (f"## Host: ranks and stores in one memory cgroup\n\n"
            f"`python benches/host.py --gib {args.gib:g} --secs {args.secs:g}` on {platform.node() and 'this machine'}: "
            f"{os.cpu_count()} cores, {common.Cgroups.describe(cgs)}; "
            f"{data_bytes / GIB:.2f} GiB of 12 KiB raw records; each rank a DataLoader "
            f"(iid, batch {BATCH} split over the ranks, 2 workers, prefetch 4); {args.secs:g} s per run, "
            f"page cache dropped before each; {time.perf_counter() - t0:.0f} s in all.\n\n")
    notes = "".join(f"- {n}\n" for n in common.notes)
    text = head + body + ("\n\nNotes:\n" + notes if notes else "") + "\n"
    print(text)
    common.write_result(args.out / "host.md", text)
    (args.out / "host.json").write_text(json.dumps([(s, r, res) for s, r, res in rows], default=str, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
