"""CPU-seconds per GiB delivered on the read path, against the floor, and
one build against another, interleaved in one run.

Each measurement runs in a fresh process (as benches/cold.py does: page cache
dropped before it, inside a fresh memory cgroup of ``--cgroup-mib``) and
reports MiB/s and the process's CPU (user + system, every thread, from before
the store opens) per GiB delivered; for a DataLoader also the CPU its own
threads report in ``stats()["cpu_s"]``. The paths:

* ``mode2``: the cold DataLoader, batch 256, mode 2 (12 KiB O_DIRECT reads);
* ``mode2-nocache``: the same with the record cache off (``ZRING_CACHE_BYTES=0``):
  the read path alone, without the copies into the cache as it fills;
* ``mode3``: the cold DataLoader in mode 3 (1 MiB blocks);
* ``hot``: the hot DataLoader (the store in the page cache), mode 2;
* ``mixture``: the cold DataLoader in mode 3 over ``zring.mix`` of three
  sources (0.5/0.3/0.2), each a copy of the store whose chunk files are hard
  links to its own (three stores to zring, the same bytes on disk);
* ``packed2`` / ``packed3``: the cold DataLoader over ``zring.pack(docs,
  2048)`` (concat, batch 32) in mode 2 / mode 3, ``docs`` a store of
  ``--gib`` GiB of uint16 token documents of 50..4,000 tokens (written once
  to $ZRING_BENCH_DIR/tokens); delivered bytes are the ``tokens`` column's;
* ``packedmix3``: the same in mode 3 over ``zring.pack(zring.mix([a, b],
  [0.7, 0.3]), 2048)``, ``a`` and ``b`` copies of ``docs`` whose chunk files
  are hard links to its own;
* ``fio``: fio's own random 12 KiB O_DIRECT reads at queue depth 128
  (io_uring, ``common.fio_randread``), its job thread's CPU per GiB: what the
  kernel and a lean reader cost for these reads on this disk (the same for
  every build).

The floor is one copy into the batch plus the checksum: memcpy and CRC-32C
in one pass on one thread (``zring._zring.ceiling``, in a build with the
bench feature; ``make develop-bench``), and memcpy alone (NumPy), as
CPU-seconds per GiB.

``--perf-stat`` runs each process under ``perf stat`` and adds its system
calls, ``io_uring_enter`` calls, context switches and page faults per GiB.

``--build NAME=DIR`` (repeatable) puts DIR first on the children's
``PYTHONPATH``, so two builds of zring (a directory holding the ``zring``
package each) alternate within every round; without it, the installed zring.

    python benches/cpu.py --paths mode2 --rounds 3 --secs 4 --cgroup-mib 1536 \\
        --build before=DIR_A --build after=DIR_B

As root (drop_caches, cgroups). Data: $ZRING_BENCH_DIR/cold (benches/cold.py's
store of 12 KiB records), reused; the mixture's links in $ZRING_BENCH_DIR/cold/mix,
the token store in $ZRING_BENCH_DIR/tokens.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget  # noqa: E402
import common  # noqa: E402
from common import REPO, Cgroups, drop_caches, note, shown  # noqa: E402

RECORD = budget.RECORD
BATCH = 256
MIB = 1 << 20
GIB = 1 << 30


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def user_sys() -> tuple[float, float]:
    """User and system CPU-seconds of this process so far, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def floor() -> dict:
    """CPU-seconds per GiB of the floor's parts, on one thread."""
    import numpy as np

    import zring

    out = {}
    src = np.random.default_rng(0).integers(0, 255, size=64 * MIB, dtype=np.uint8)
    dst = np.empty_like(src)
    reps, t = 0, time.thread_time()
    while time.thread_time() - t < 1.0:
        np.copyto(dst, src)
        reps += 1
    out["memcpy"] = (time.thread_time() - t) / (reps * src.nbytes / GIB)
    fn = getattr(zring._zring, "ceiling", None)
    if fn is not None:
        for kind in ("crc", "memcpy+crc"):
            # The ceiling reports wall-clock MiB/s of its one thread; scaled by
            # the share of a core the process got meanwhile (a shared
            # machine's other work slows the wall clock, not the CPU time).
            c0, t0 = cpu_seconds(), time.perf_counter()
            mib_s = fn(kind, src[: 4096 * RECORD], RECORD, 1)
            share = min(1.0, (cpu_seconds() - c0) / (time.perf_counter() - t0))
            out[kind] = 1024.0 / mib_s * share
    return out


def child(spec: dict) -> None:
    cg = spec.get("cgroup")
    if cg:
        Path(cg, "cgroup.procs").write_text(str(os.getpid()))
    import numpy as np  # noqa: F401

    import zring

    if spec["kind"] == "floor":
        print("RESULT " + json.dumps(floor()), flush=True)
        os._exit(0)
    cpu0, us0 = cpu_seconds(), user_sys()
    mode, kind = spec["mode"], spec["kind"]
    batch, step_bytes = BATCH, BATCH * RECORD
    if kind.startswith("packed"):
        docs = zring.RaggedDataset(spec["path"])
        batch = PACK_BATCH
        step_bytes = PACK_BATCH * PACK_LEN * docs.dtype.itemsize
        if kind == "packedmix3":
            linked = zring.mix([zring.RaggedDataset(p) for p in spec["paths"]], [0.7, 0.3])
            streams = zring.pack(linked, PACK_LEN)
        else:
            streams = zring.pack(docs, PACK_LEN)
        # Rows of the packed stream in one pass over the documents.
        n = docs.stats()["logical_bytes"] // (PACK_LEN * docs.dtype.itemsize)
    elif kind == "mixture":
        streams = zring.mix([{"data": zring.Dataset(p)} for p in spec["paths"]], MIX_WEIGHTS)
        n = sum(len(zring.Dataset(p)) for p in spec["paths"]) // len(spec["paths"])
    else:
        ds = zring.Dataset(spec["path"])
        streams, n = {"data": ds}, len(ds)
    dl = zring.DataLoader(streams, batch_size=batch, mode=mode, seed=spec["seed"],
                          num_workers=spec["workers"], prefetch_size=spec["prefetch"])
    if spec["hot"]:
        for _ in range(10):
            next(dl)
        cpu0, us0 = cpu_seconds(), user_sys()
        s0 = dl.stats()
    most = max(4, n // batch)
    done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < spec["secs"] and done < most:
        next(dl)
        done += 1
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    user, system = (b - a for a, b in zip(us0, user_sys()))
    st = dl.stats()
    gib = done * step_bytes / GIB
    loader_cpu = st.get("cpu_s")
    if loader_cpu is not None and spec["hot"]:
        loader_cpu -= s0.get("cpu_s", 0.0)
    res = {"mib_s": gib * 1024 / wall, "cpu_s_per_gib": cpu / gib, "gib": gib,
           "user_s_per_gib": user / gib, "sys_s_per_gib": system / gib,
           "loader_cpu_s_per_gib": None if loader_cpu is None else loader_cpu / gib,
           "version": getattr(zring, "__file__", "")}
    print("RESULT " + json.dumps(res), flush=True)
    os._exit(0)


#: Counted by ``perf stat`` around each child with ``--perf-stat``, per GiB delivered.
EVENTS = {"raw_syscalls:sys_enter": "system calls", "syscalls:sys_enter_io_uring_enter": "io_uring_enter",
          "context-switches": "context switches", "page-faults": "page faults"}


def spawn_counted(spec: dict, env: dict, timeout: float) -> tuple[int | None, str, str, dict]:
    """The child under ``perf stat``: its result and the events' counts
    (the whole process, from its start)."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".csv") as f:
        cmd = ["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-o", f.name, sys.executable,
               str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
        counts = {}
        for line in f.read().splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[0].replace(".", "").isdigit():
                counts[parts[2]] = float(parts[0])
    return p.returncode, p.stdout, p.stderr, counts


def run(cgs: Cgroups | None, seq: int, spec: dict, limit: int | None, env: dict, perf: bool = False) -> dict | None:
    if not spec.get("hot"):
        drop_caches()
    timeout = spec["secs"] + 120
    spawner = (lambda s: spawn_counted(s, env, timeout)) if perf else None
    res, counts = budget.measure_in_cgroup(Path(__file__), cgs, f"zring-cpu-{os.getpid()}-{seq}", spec, limit, env,
                                           timeout, spec["kind"], spawner)
    if res is not None and counts and res.get("gib"):
        res["per_gib"] = {EVENTS[k]: v / res["gib"] for k, v in counts.items() if k in EVENTS}
    return res


PATHS = {
    "mode2": ("DataLoader mode 2, cold (12 KiB O_DIRECT reads)", 2, False),
    "mode2-nocache": ("DataLoader mode 2, cold, no record cache (ZRING_CACHE_BYTES=0)", 2, False),
    "mode3": ("DataLoader mode 3, cold (1 MiB blocks)", 3, False),
    "hot": ("DataLoader mode 2, hot (page cache)", 2, True),
    "fio": ("fio, random 12 KiB O_DIRECT reads, QD128 (its job thread)", 0, False),
    "mixture": ("DataLoader mode 3, cold, zring.mix of 3 sources (0.5/0.3/0.2)", 3, False),
    "packed2": ("DataLoader of zring.pack(docs, 2048), cold, mode 2 (tokens delivered)", 2, False),
    "packed3": ("DataLoader of zring.pack(docs, 2048), cold, mode 3 (tokens delivered)", 3, False),
    "packedmix3": ("DataLoader of zring.pack(zring.mix of 2 sources (0.7/0.3), 2048), cold, mode 3", 3, False),
}

#: The mixture's weights (as benches/cold.py --mix).
MIX_WEIGHTS = [0.5, 0.3, 0.2]
#: Packed rows: ``seq_len`` and rows per batch.
PACK_LEN, PACK_BATCH = 2048, 32


def token_store(where: Path, gib: float) -> Path:
    """A store of ``gib`` GiB of uint16 token documents of 50..4,000 tokens
    (uniform, seed 0), raw, written once in ``where``."""
    import numpy as np

    import zring

    path = where / f"docs-u16-{gib:g}gib"
    if path.exists():
        return path
    note(f"writing {gib:g} GiB of token documents to {shown(path)} (once)")
    rng, target = np.random.default_rng(0), int(gib * GIB)

    def docs():
        total = 0
        while total < target:
            lens = rng.integers(50, 4001, size=4096)
            toks = rng.integers(0, 50257, size=int(lens.sum()), dtype=np.uint16)
            yield from np.split(toks, np.cumsum(lens)[:-1])
            total += toks.nbytes

    where.mkdir(parents=True, exist_ok=True)
    zring.write_ragged(path, docs(), codec="raw", progress=False)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="mode2,mode3", help="comma-separated: " + ",".join(PATHS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader num_workers (default: the DataLoader's own, the CPUs, at most 4)")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--cgroup-mib", type=int, default=None)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--gib", type=float, default=5.4)
    ap.add_argument("--out", type=Path, default=None, help="report file (default: print only)")
    ap.add_argument("--perf-stat", action="store_true",
                    help="count system calls, io_uring_enter calls, context switches and page faults per GiB "
                         "(perf stat around each process; its start and the store's open included)")
    ap.add_argument("--hog", action="store_true",
                    help="run `taskset -c 1 yes > /dev/null` for the whole run (a contender for the CPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workers is None:
        args.workers = common.default_workers()
    if args.child:
        child(json.loads(args.child))
        return
    if os.geteuid() != 0:
        raise SystemExit("cpu.py drops the page cache and sets cgroup limits: run it as root")
    if args.hog:
        # Killed at exit (atexit also runs on SIGTERM's sys.exit and on errors).
        hog = contextlib.ExitStack()
        hog.enter_context(common.cpu_hog())
        atexit.register(hog.close)
        note("a CPU hog (`taskset -c 1 yes > /dev/null`) kept core 1 busy for the whole run")
    data = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "cold"
    paths, n = budget.ensure_data(data, args.gib, libs=("zring",))
    store = paths["zring"]
    cgs = None
    if args.cgroup_mib:
        cgs = Cgroups()
        atexit.register(cgs.cleanup)
    limit = args.cgroup_mib * MIB if args.cgroup_mib else None
    builds = dict(b.split("=", 1) for b in args.build) or {"installed": ""}
    envs = {}
    for name, d in builds.items():
        env = budget.child_env(None)
        if d:
            env["PYTHONPATH"] = str(Path(d).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
        envs[name] = env
    kinds = [k.strip() for k in args.paths.split(",") if k.strip()]
    res: dict[tuple[str, str], list[dict]] = {}
    floors: dict[str, list[float]] = {}
    seq = 0
    for r in range(args.rounds):
        fl = run(None, 0, {"kind": "floor", "secs": 10, "hot": True}, None, envs[next(iter(envs))])
        for k, v in (fl or {}).items():
            floors.setdefault(k, []).append(v)
        for kind in kinds:
            label, mode, hot = PATHS[kind]
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            if kind == "fio":
                drop_caches()
                f = common.fio_randread(store, args.secs, 128)
                x = {k: f[k] for k in ("mib_s", "cpu_s_per_gib", "user_s_per_gib", "sys_s_per_gib")} if f else {}
                for name in builds:
                    res.setdefault((kind, name), []).append(x)
                print(f"  round {r + 1} fio: {json.dumps(x)}", file=sys.stderr, flush=True)
                continue
            for name in order:
                seq += 1
                spec = {"kind": kind, "mode": mode, "hot": hot, "path": str(store), "secs": args.secs,
                        "seed": 100 + r, "workers": args.workers, "prefetch": args.prefetch}
                if hot:
                    # The hot path reads what the page cache holds: a store
                    # that fits, warmed by one untimed pass.
                    spec["path"] = str(hot_store(data))
                elif kind == "mixture":
                    spec["paths"] = [str(p) for p in common.linked_copies(store, data / "mix", 3)]
                elif kind.startswith("packed"):
                    spec["path"] = str(token_store(data.parent / "tokens", args.gib))
                    if kind == "packedmix3":
                        links = data.parent / "tokens" / "mix"
                        spec["paths"] = [str(p) for p in common.linked_copies(Path(spec["path"]), links, 2)]
                env = envs[name]
                if kind.endswith("-nocache"):
                    env = dict(env, ZRING_CACHE_BYTES="0")
                x = run(cgs if not hot else None, seq, spec, limit, env, args.perf_stat)
                res.setdefault((kind, name), []).append(x or {})
                print(f"  round {r + 1} {kind} {name}: {json.dumps(x)}", file=sys.stderr, flush=True)

    def med(xs: list) -> float:
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else float("nan")

    fl_med = {k: med(v) for k, v in floors.items()}
    floor_total = fl_med.get("memcpy+crc", float("nan"))
    lines = [f"## CPU-seconds per GiB delivered ({args.rounds} interleaved rounds of {args.secs:g} s)", "",
             f"Machine: {common.machine(data)}.", "",
             f"Store: {n} × 12 KiB records, raw, {n * RECORD / GIB:.2f} GiB; cold paths: page cache dropped before "
             f"each, each in a fresh process{', in a ' + str(args.cgroup_mib) + ' MiB memory cgroup' if limit else ''};"
             f" DataLoader batch 256, {args.workers} workers, prefetch {args.prefetch}.", "",
             *([f"Packed paths: `zring.pack(docs, {PACK_LEN})`, batch {PACK_BATCH}, over {args.gib:g} GiB of uint16 "
                "token documents of 50..4,000 tokens (raw, $ZRING_BENCH_DIR/tokens); MiB/s and CPU per GiB count "
                "the `tokens` column delivered (the loader also writes `segment_ids` and `positions`, 4 bytes a "
                "token each).", ""] if any(k.startswith("packed") for k in kinds) else []),
             "Floor, one thread: " + ", ".join(f"{k} {v:.3f}" for k, v in fl_med.items()) + " CPU-s per GiB.", "",
             "| read path | build | MiB/s (median) | CPU-s per GiB, process (range) | user / sys | of which the "
             "loader's threads (`stats()`) | ÷ floor (memcpy+crc) |"
             + ("".join(f" {v} per GiB |" for v in EVENTS.values()) if args.perf_stat else ""),
             "|---|---|---:|---:|---:|---:|---:|" + ("---:|" * len(EVENTS) if args.perf_stat else "")]
    for kind in kinds:
        for name in builds if kind != "fio" else list(builds)[:1]:
            xs = res[(kind, name)]
            c = [x.get("cpu_s_per_gib") for x in xs if x]
            c = [v for v in c if v is not None]
            rng = f" ({min(c):.2f}–{max(c):.2f})" if len(c) > 1 else ""
            lc = med([x.get("loader_cpu_s_per_gib") for x in xs if x])
            counted = "".join(f" {med([(x.get('per_gib') or {}).get(v) for x in xs if x]):,.0f} |"
                              for v in EVENTS.values()) if args.perf_stat else ""
            shown_name = name if kind != "fio" else "-"
            lines.append(f"| {PATHS[kind][0]} | {shown_name} | {med([x.get('mib_s') for x in xs if x]):.0f} | "
                         f"**{med(c):.2f}**{rng} | {med([x.get('user_s_per_gib') for x in xs if x]):.2f} / "
                         f"{med([x.get('sys_s_per_gib') for x in xs if x]):.2f} | "
                         f"{'' if lc != lc else f'{lc:.2f}'} | {med(c) / floor_total:.1f} |"
                         + counted)
        if len(builds) == 2 and kind != "fio":
            a, b = list(builds)
            pa = [x.get("cpu_s_per_gib") for x in res[(kind, a)]]
            pb = [x.get("cpu_s_per_gib") for x in res[(kind, b)]]
            ratios = [y / x for x, y in zip(pa, pb) if x and y]
            sa = [x.get("mib_s") for x in res[(kind, a)]]
            sb = [x.get("mib_s") for x in res[(kind, b)]]
            speed = [y / x for x, y in zip(sa, sb) if x and y]
            if ratios:
                lines.append(f"| {PATHS[kind][0]} | {b} ÷ {a}, round by round | {med(speed):.2f} | "
                             f"{med(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | | | |"
                             + (" |" * len(EVENTS) if args.perf_stat else ""))
    argv = " ".join(a.split("=", 1)[0] + "=DIR" if "=/" in a else a for a in sys.argv[1:])
    lines += ["", f"Command: `python benches/cpu.py {argv}`. Data: {shown(store)}."]
    lines += [f"- note: {x}" for x in common.notes]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        common.write_result(args.out, text)


def hot_store(data: Path) -> Path:
    """The 1 GiB store of benches/cold.py --quick, for the hot path (it fits
    the page cache), read whole so that it is there."""
    paths, _ = budget.ensure_data(data, 1.0, libs=("zring",))
    for f in sorted(p for p in paths["zring"].rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(8 * MIB):
                pass
    return paths["zring"]


if __name__ == "__main__":
    main()
