"""Cold reads against the disk's ceiling, interleaved in one run.

Each round, with the page cache emptied before every measurement (``sync``
and drop_caches):

  1. fio: random 12 KiB O_DIRECT reads of the store's largest chunk file at
     queue depth ``--depth`` (default 128), the disk's ceiling for this access
     pattern;
  2. bare gathers: ``Dataset.__getitems__`` of 256 uniform random indices,
     one batch after another on one thread, with the major page faults each
     batch took (the table's pages faulted in on the gather's critical path);
  3. the DataLoader: batch 256, mode 2 (every record once per pass),
     ``--workers`` workers (default 4), ``--prefetch`` steps ahead (default 4).

Each zring measurement runs in a fresh process, inside a fresh memory cgroup of
``--cgroup-mib`` when given (so the record cache and the page cache share one
limit, as on a training host), for ``--secs`` or until it has read a
quarter of the store's records (the gather, whose random draws repeat) or
one pass (the loader), whichever ends first, so that few records are served
from memory.
The figures are whole-run MiB/s (every batch, the first one's table faults
included), their ratio to the same round's fio, and the process's CPU
(user + system, every thread, from before the store opens) per GiB delivered.

With ``--mode 3`` each round instead measures, page cache dropped before
each: fio's random 1 MiB O_DIRECT reads at queue depth 32 on the largest
chunk file (the disk's large-read rate), the DataLoader in mode 2 and the
DataLoader in mode 3 (blocked: each window of 1 MiB blocks read whole into
the record cache), both batch 256, ``--workers`` workers, one pass at most.

The quick check a developer runs after changing the read path:

    python benches/cold.py --quick        # a 1 GiB store, one round, ~20 s
    python benches/cold.py --quick --mode 3

The full run (the figures in bench-results/cold.md):

    python benches/cold.py --gib 5.4 --rounds 3 --secs 5 --cgroup-mib 1536
    python benches/cold.py --gib 5.4 --rounds 3 --secs 5 --cgroup-mib 1536 --mode 3
    python benches/cold.py --gib 5.4 --rounds 3 --secs 5 --cgroup-mib 1536 --mode 3 --mix DIR

As root (drop_caches, cgroups), in the project venv with zring built by
``make develop-bench``. Data goes to $ZRING_BENCH_DIR/cold (default
``bench-data/cold``; never /tmp, which may be memory) and is reused.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import resource
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget  # noqa: E402  (its store builder and child process helpers)
import common  # noqa: E402
from common import REPO, Cgroups, drop_caches, fio_randread, linked_copies, note, notes, shown  # noqa: E402

RECORD = budget.RECORD
BATCH = 256
MIX_WEIGHTS = (0.5, 0.3, 0.2)
MIB = 1 << 20


def cpu_seconds() -> float:
    """User plus system CPU-seconds of this process so far, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def child(spec: dict) -> None:
    """One measurement in this (fresh) process; prints ``RESULT {json}``."""
    cg = spec.get("cgroup")
    if cg:
        Path(cg, "cgroup.procs").write_text(str(os.getpid()))
    import numpy as np

    import zring

    # CPU time of the whole process (every thread: the loader's workers, the
    # store's pool, the window thread) from before the store opens.
    cpu0 = cpu_seconds()
    ds = zring.Dataset(spec["path"]) if spec["kind"] != "mix" else None
    n = len(ds) if ds is not None else 0
    secs = float(spec["secs"])
    faults = []
    if spec["kind"] == "gather":
        rng = np.random.default_rng(spec["seed"])
        get = ds.__getitems__

        def step() -> None:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
            get(rng.integers(0, n, size=BATCH, dtype=np.int64))
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0)
    elif spec["kind"] == "mix":
        # The same records three times over (hard-linked copies: three
        # stores to zring), mixed 0.5/0.3/0.2.
        streams = zring.mix([{"data": zring.Dataset(p)} for p in spec["paths"]], MIX_WEIGHTS)
        n = sum(len(zring.Dataset(p)) for p in spec["paths"])
        dl = zring.DataLoader(streams, batch_size=BATCH, mode=spec.get("mode", 3), seed=spec["seed"],
                              num_workers=spec["workers"], prefetch_size=spec.get("prefetch", 4))

        def step() -> None:
            next(dl)
    else:
        dl = zring.DataLoader({"data": ds}, batch_size=BATCH, mode=spec.get("mode", 2), seed=spec["seed"],
                              num_workers=spec["workers"], prefetch_size=spec.get("prefetch", 4))

        def step() -> None:
            next(dl)
    lat = []
    # Cold reads only: the loader (mode 2) reads each record once per pass,
    # so one pass at most; the gather's draws repeat, so a quarter of the
    # store at most, where few are served from memory.
    most = max(4, n // BATCH // (4 if spec["kind"] == "gather" else 1))
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter()
        step()
        lat.append(time.perf_counter() - t)
        if time.perf_counter() - t0 >= secs or len(lat) >= most:
            break
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    delivered_gib = len(lat) * BATCH * RECORD / (1 << 30)
    stats = ds.stats() if hasattr(ds, "stats") else {}
    res = {
        "mib_s": len(lat) * BATCH * RECORD / MIB / wall,
        "batches": len(lat),
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": sorted(lat)[int(0.99 * (len(lat) - 1))] * 1e3,
        "cpu_s_per_gib": cpu / delivered_gib,
        "majflt_per_batch": statistics.mean(faults) if faults else None,
        "majflt_first": faults[0] if faults else None,
        "policy": str(stats.get("read_policy", stats.get("policy", ""))),
    }
    if spec["kind"] == "mix":
        res["reads"] = {k: {f: v[f] for f in ("hit_rate", "bytes_read", "cache_capacity") if f in v}
                        for k, v in (dl.stats().get("reads") or {}).items()}
        res["blocks"] = (dl.state().get("mixture") or {}).get("blocks")
    if spec["kind"] == "loader":
        sampler = dl.state()["sampler"]
        res["blocks"] = sampler.get("blocks")
        reads = dl.stats().get("reads") or {}
        res["reads"] = {k: v for k, v in (next(iter(reads.values()), {}) or {}).items()
                        if k in ("policy", "hit_rate", "bytes_read", "bytes_from_cache", "cache_capacity")}
    print("RESULT " + json.dumps(res, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)


def measure(cgs: Cgroups | None, seq: int, spec: dict, limit: int | None, env: dict) -> dict | None:
    drop_caches()
    res, _ = budget.measure_in_cgroup(Path(__file__), cgs, f"zring-cold-{os.getpid()}-{seq}", spec, limit, env,
                                      spec["secs"] + 120, spec["kind"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 1 GiB store, one round of 3 s runs")
    ap.add_argument("--gib", type=float, default=None, help="store size in GiB (default 5.4, --quick 1)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, --quick 1)")
    ap.add_argument("--secs", type=float, default=None, help="seconds per measurement (default 5, --quick 3)")
    ap.add_argument("--depth", type=int, default=128, help="fio queue depth (default 128)")
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader num_workers (default: the DataLoader's own, the CPUs, at most 4)")
    ap.add_argument("--prefetch", type=int, default=4, help="DataLoader prefetch_size (default 4)")
    ap.add_argument("--also", action="append", default=[], metavar="W/P[:direct]",
                    help="mode 2: also measure the DataLoader with W workers and prefetch P in every round "
                         "(repeatable), beside --workers/--prefetch; ':direct' forces O_DIRECT without the "
                         "record cache (ZRING_DIRECT=1) for that one")
    ap.add_argument("--cgroup-mib", type=int, default=None, help="memory cgroup limit of each zring process")
    ap.add_argument("--direct", choices=("0", "1"), default=None, help="ZRING_DIRECT for the zring processes")
    ap.add_argument("--mode", type=int, choices=(2, 3), default=2,
                    help="3: fio 1 MiB QD32 against the DataLoader in modes 2 and 3 (default 2: the runs above)")
    ap.add_argument("--mix", type=Path, default=None,
                    help="with --mode 3: also a 3-source mixture in mode 3, its sources hard-linked copies of the "
                         "store made in this directory (same file system as the data)")
    ap.add_argument("--data", type=Path, default=None, help="data directory (default $ZRING_BENCH_DIR/cold)")
    ap.add_argument("--out", type=Path, default=None, help="report file (default bench-results/cold.md; "
                                                            "--quick prints only)")
    ap.add_argument("--hog", action="store_true",
                    help="run `taskset -c 1 yes > /dev/null` for the whole run (a contender for the CPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workers is None:
        args.workers = common.default_workers()
    if args.child:
        child(json.loads(args.child))
        return
    gib = args.gib if args.gib is not None else (1.0 if args.quick else 5.4)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    secs = args.secs if args.secs is not None else (3.0 if args.quick else 5.0)
    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "cold"
    if str(data.resolve()).startswith("/tmp"):
        raise SystemExit("the benchmark data must not live in /tmp (it may be memory)")
    if os.geteuid() != 0:
        raise SystemExit("cold.py drops the page cache and sets cgroup limits: run it as root")
    cgs = None
    if args.cgroup_mib:
        cgs = Cgroups()
        atexit.register(cgs.cleanup)
    signal.signal(signal.SIGTERM, lambda s, _f: sys.exit(128 + s))
    if args.hog:
        # Killed at exit (atexit also runs on SIGTERM's sys.exit and on errors).
        hog = contextlib.ExitStack()
        hog.enter_context(common.cpu_hog())
        atexit.register(hog.close)
        note("a CPU hog (`taskset -c 1 yes > /dev/null`) kept core 1 busy for the whole run")

    paths, n = budget.ensure_data(data, gib, libs=("zring",))
    store = paths["zring"]
    env = budget.child_env(args.direct)
    limit = args.cgroup_mib * MIB if args.cgroup_mib else None
    if args.mode == 3:
        blocked(args, cgs, store, n, rounds, secs, env, limit, data)
        return
    rows = []
    seq = 0
    # Extra DataLoader configurations, by their label.
    also = {}
    for x in args.also:
        shape, _, how = x.partition(":")
        w, p = shape.split("/")
        also[f"loader {x}"] = (int(w), int(p), how)
    for r in range(rounds):
        drop_caches()
        fio = fio_randread(store, secs, args.depth)
        row = {"fio": fio["mib_s"] if fio else None}
        for kind in ("gather", "loader", *also):
            seq += 1
            workers, prefetch, how = also.get(kind, (args.workers, args.prefetch, ""))
            spec = {"kind": "loader" if kind in also else kind, "path": str(store), "secs": secs, "seed": 100 + r,
                    "workers": workers, "prefetch": prefetch}
            row[kind] = measure(cgs, seq, spec, limit, dict(env, ZRING_DIRECT="1") if how == "direct" else env)
        rows.append(row)
        g, ld = row["gather"] or {}, row["loader"] or {}
        print(f"  round {r + 1}: fio {row['fio'] or 0:.0f} MiB/s, gather {g.get('mib_s', 0):.0f} "
              f"({g.get('majflt_per_batch') or 0:.1f} major faults/batch), loader {ld.get('mib_s', 0):.0f}",
              file=sys.stderr, flush=True)

    def ratios(kind: str) -> list[float]:
        return [row[kind]["mib_s"] / row["fio"] for row in rows if row[kind] and row["fio"]]

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    fio_med = med([row["fio"] for row in rows if row["fio"]])
    lines = [
        f"## Cold reads against fio, interleaved ({rounds} rounds of {secs:g} s, page cache dropped before each)",
        "",
        f"Machine: {common.machine(data)}. Versions: {common.versions(('numpy', 'zring'))}.",
        "",
        f"Store: {n} × 12 KiB random records, codec raw, {n * RECORD / (1 << 30):.2f} GiB. "
        f"zring processes: {'a ' + str(args.cgroup_mib) + ' MiB memory cgroup each' if limit else 'no cgroup'}, "
        f"ZRING_DIRECT={args.direct if args.direct else 'unset (the read policy chooses)'}. "
        f"fio: random 12 KiB O_DIRECT reads at queue depth {args.depth} on the largest chunk file.",
        "",
        "| measurement | MiB/s (median) | ÷ fio, median of rounds (range) | CPU-s per GiB | p50 / p99 ms per batch "
        "| major faults per batch |",
        "|---|---:|---:|---:|---:|---:|",
        f"| fio 12 KiB random, QD{args.depth} | {fio_med:.0f} | 1.00 | | | |",
    ]
    for kind, label in (("gather", "bare gather of 256 (one thread)"),
                        ("loader", f"DataLoader, batch 256, mode 2, {args.workers} workers, prefetch {args.prefetch}"),
                        *((k, f"DataLoader, batch 256, mode 2, {w} workers, prefetch {p}"
                              + (", forced O_DIRECT without the record cache (ZRING_DIRECT=1)" if how == "direct" else ""))
                          for k, (w, p, how) in also.items())):
        ok = [row[kind] for row in rows if row[kind]]
        rs = ratios(kind)
        rng = f" ({min(rs):.2f}–{max(rs):.2f})" if len(rs) > 1 else ""
        mf = med([x["majflt_per_batch"] for x in ok if x.get("majflt_per_batch") is not None])
        lines.append(f"| {label} | {med([x['mib_s'] for x in ok]):.0f} | **{med(rs):.2f}**{rng} | "
                     f"{med([x['cpu_s_per_gib'] for x in ok]):.2f} | "
                     f"{med([x['p50_ms'] for x in ok]):.1f} / {med([x['p99_ms'] for x in ok]):.1f} | "
                     f"{f'{mf:.1f}' if kind == 'gather' else ''} |")
    argv = " ".join(sys.argv[1:])
    lines += ["", f"Command: `python benches/cold.py{(' ' + argv) if argv else ''}`. "
              f"Data: {shown(store)}."]
    lines += [f"- note: {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick or args.out:
        write_cold(args.out or REPO / "bench-results" / "cold.md", text, mode3=False)


MODE3_BEGIN, MODE3_END = "<!-- mode3:begin -->", "<!-- mode3:end -->"
SHARDS_BEGIN, SHARDS_END = "<!-- shard-reads:begin -->", "<!-- shard-reads:end -->"


def write_cold(path: Path, text: str, mode3: bool) -> None:
    """Writes the mode 2 report (``mode3=False``) or the mode 3 section of
    ``path``, keeping the other and everything below the kept-line marker."""
    old = path.read_text() if path.exists() else ""
    head = old.split(common.KEEP, 1)[0]
    section = ""
    if MODE3_BEGIN in head and MODE3_END in head:
        before, rest = head.split(MODE3_BEGIN, 1)
        section, after = rest.split(MODE3_END, 1)
        head = before + after
    # The section benches/shard_reads.py writes is kept as it is.
    shards = ""
    if SHARDS_BEGIN in head and SHARDS_END in head:
        before, rest = head.split(SHARDS_BEGIN, 1)
        shards, after = rest.split(SHARDS_END, 1)
        head = before.rstrip("\n") + "\n" + after.lstrip("\n")
    if mode3:
        section = "\n" + text.strip("\n") + "\n"
    else:
        head = text
    body = head.rstrip("\n") + "\n"
    if section:
        body += f"\n{MODE3_BEGIN}{section}{MODE3_END}\n"
    if shards:
        body += f"\n{SHARDS_BEGIN}{shards}{SHARDS_END}\n"
    common.write_result(path, body)


def blocked(args: argparse.Namespace, cgs: Cgroups | None, store: Path, n: int, rounds: int, secs: float,
            env: dict, limit: int | None, data: Path) -> None:
    """``--mode 3``: fio 1 MiB QD32, the DataLoader in mode 2, in mode 3 (and with ``--mix``
    over a mixture of three sources in mode 3); interleaved."""
    rows = []
    seq = 0
    mix_paths = [str(p) for p in linked_copies(store, args.mix, 3)] if args.mix else []
    for r in range(rounds):
        drop_caches()
        fio = fio_randread(store, secs, 32, "1m")
        row: dict = {"fio": fio["mib_s"] if fio else None}
        for mode in (2, 3):
            seq += 1
            spec = {"kind": "loader", "mode": mode, "path": str(store), "secs": secs, "seed": 100 + r,
                    "workers": args.workers, "prefetch": args.prefetch}
            row[mode] = measure(cgs, seq, spec, limit, env)
        if mix_paths:
            seq += 1
            spec = {"kind": "mix", "mode": 3, "path": str(store), "paths": mix_paths, "secs": secs,
                    "seed": 100 + r, "workers": args.workers, "prefetch": args.prefetch}
            row["mix"] = measure(cgs, seq, spec, limit, env)
        rows.append(row)
        m2, m3 = row[2] or {}, row[3] or {}
        print(f"  round {r + 1}: fio 1 MiB QD32 {row['fio'] or 0:.0f} MiB/s, mode 2 {m2.get('mib_s', 0):.0f}, "
              f"mode 3 {m3.get('mib_s', 0):.0f} ({m3.get('reads')})", file=sys.stderr, flush=True)

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    def shown_range(xs: list[float]) -> str:
        return f"**{med(xs):.2f}**" + (f" ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else "")

    ok = [row for row in rows if row[2] and row[3] and row["fio"]]
    speedup = [row[3]["mib_s"] / row[2]["mib_s"] for row in ok]
    of_fio3 = [row[3]["mib_s"] / row["fio"] for row in ok]
    of_fio2 = [row[2]["mib_s"] / row["fio"] for row in ok]
    shape = next((row[3].get("blocks") for row in rows if row[3]), None)
    lines = [
        f"## Mode 3 (blocked) against mode 2 and fio 1 MiB, cold, interleaved ({rounds} rounds of {secs:g} s)",
        "",
        f"Machine: {common.machine(data)}. Versions: {common.versions(('numpy', 'zring'))}.",
        "",
        f"Store: {n} × 12 KiB random records, codec raw, {n * RECORD / (1 << 30):.2f} GiB. "
        f"Each measurement in a fresh process"
        f"{', in a ' + str(args.cgroup_mib) + ' MiB memory cgroup' if limit else ''}, page cache dropped before it. "
        f"DataLoader: batch 256, {args.workers} workers, prefetch {args.prefetch}, one pass at most. "
        f"Mode 3's shape (chosen by default from the record size and the record cache): {shape}. "
        f"fio: random 1 MiB O_DIRECT reads at queue depth 32 (io_uring) on the largest chunk file.",
        "",
        "| measurement | MiB/s (median) | ÷ fio 1 MiB QD32 (range) | CPU-s per GiB | p50 / p99 ms per batch |",
        "|---|---:|---:|---:|---:|",
        f"| fio 1 MiB random, QD32 | {med([row['fio'] for row in rows if row['fio']]):.0f} | 1.00 | | |",
    ]
    for mode, ratios in ((2, of_fio2), (3, of_fio3)):
        xs = [row[mode] for row in rows if row[mode]]
        lines.append(f"| DataLoader mode {mode} | {med([x['mib_s'] for x in xs]):.0f} | {shown_range(ratios)} | "
                     f"{med([x['cpu_s_per_gib'] for x in xs]):.2f} | "
                     f"{med([x['p50_ms'] for x in xs]):.1f} / {med([x['p99_ms'] for x in xs]):.1f} |")
    if mix_paths:
        mixed = [row["mix"] for row in rows if row.get("mix")]
        lines.append(f"| DataLoader mode 3, zring.mix of 3 sources (0.5/0.3/0.2) | "
                     f"{med([x['mib_s'] for x in mixed]):.0f} | "
                     f"{shown_range([row['mix']['mib_s'] / row['fio'] for row in ok if row.get('mix')])} | "
                     f"{med([x['cpu_s_per_gib'] for x in mixed]):.2f} | "
                     f"{med([x['p50_ms'] for x in mixed]):.1f} / {med([x['p99_ms'] for x in mixed]):.1f} |")
        mix_ratio = [row["mix"]["mib_s"] / row[3]["mib_s"] for row in ok if row.get("mix")]
        lines += ["", f"Mixture of 3 sources ÷ plain mode 3, per round: {shown_range(mix_ratio)} (each source a "
                      "hard-linked copy of the store, so three stores to zring, the same bytes on disk). "
                      f"Mixture reads (last round): {rows[-1].get('mix', {}) and rows[-1]['mix'].get('reads')}."]
    lines += ["", f"Mode 3 ÷ mode 2, per round: {shown_range(speedup)}.",
              "", "Per round: " + "; ".join(
                  f"fio {row['fio'] or 0:.0f}, mode 2 {(row[2] or {}).get('mib_s', 0):.0f}, "
                  f"mode 3 {(row[3] or {}).get('mib_s', 0):.0f} MiB/s"
                  + (f", mixture {row['mix']['mib_s']:.0f} MiB/s ({row['mix']['mib_s'] / row[3]['mib_s']:.2f}× mode "
                     f"3; CPU-s per GiB {row['mix']['cpu_s_per_gib']:.2f} against {row[3]['cpu_s_per_gib']:.2f})"
                     if row.get("mix") and row[3] else "") for row in rows) + ".",
              "", f"Mode 3 reads (last round): {rows[-1][3].get('reads') if rows[-1][3] else None}."]
    argv = " ".join(sys.argv[1:])
    lines += ["", f"Command: `python benches/cold.py{(' ' + argv) if argv else ''}`. Data: {shown(store)}."]
    lines += [f"- note: {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick or args.out:
        write_cold(args.out or REPO / "bench-results" / "cold.md", text, mode3=True)


if __name__ == "__main__":
    main()
