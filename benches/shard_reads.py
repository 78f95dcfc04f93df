"""Mode 3 with ``shard=``: the bytes each rank reads from disk against its share.

Each of ``--ranks`` ranks (default 8) runs in turn, as a fresh process in a
fresh memory cgroup of ``--cgroup-mib``, page cache dropped before it: a
DataLoader in mode 3 over the cold store, batch 256, ``shard=(k, ranks)``,
for ``--cycles`` whole cycles of the sampler (``len // 256`` steps each;
default 3). A rank's share of the data is the store's bytes over the rank
count, per cycle. Reported per rank: the bytes the store's reads asked for
(the loader's read counters) and the bytes the process read from the block
device (``read_bytes`` of ``/proc/self/io``), each over ``cycles × share``.

Cycles split for the shard count (what a new run does) are compared with
unsplit ones (how mode 3 read before, and how a state saved before the split
resumes): the unsplit ranks run one cycle each, ranks ``0 ..
--unsplit-ranks`` only (each reads the whole store, so they are slow).

    python benches/shard_reads.py --cgroup-mib 1536

As root (drop_caches, cgroups), in the project venv with zring built by
``make develop-bench``. Data: $ZRING_BENCH_DIR/cold (reused, see cold.py).
Writes its section of bench-results/cold.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget  # noqa: E402
import common  # noqa: E402
from common import REPO, Cgroups, drop_caches, notes, shown  # noqa: E402

RECORD = budget.RECORD
BATCH = 256
MIB = 1 << 20
BEGIN, END = "<!-- shard-reads:begin -->", "<!-- shard-reads:end -->"


def io_read_bytes() -> int:
    """Bytes this process has read from the block device so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def child(spec: dict) -> None:
    """One rank in this (fresh) process; prints ``RESULT {json}``."""
    cg = spec.get("cgroup")
    if cg:
        Path(cg, "cgroup.procs").write_text(str(os.getpid()))
    import zring

    io0 = io_read_bytes()
    ds = zring.Dataset(spec["path"])
    n = len(ds)
    shard = (spec["rank"], spec["ranks"])
    state = None
    if not spec["split"]:
        # A state of an unsharded run: unsplit cycles, which any shard
        # count resumes (as a state saved before the split does).
        one = zring.DataLoader({"data": ds}, batch_size=BATCH, mode=3, seed=spec["seed"], num_workers=1)
        state = one.state()
        one.close()
    kw = dict(state=state) if state else dict(batch_size=BATCH, mode=3, seed=spec["seed"])
    dl = zring.DataLoader({"data": ds}, num_workers=spec["workers"], prefetch_size=spec["prefetch"], shard=shard,
                          **kw)
    steps = spec["cycles"] * (n // BATCH)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(dl)
    wall = time.perf_counter() - t0
    reads = next(iter((dl.stats().get("reads") or {}).values()), {}) or {}
    res = {
        "steps": steps,
        "delivered": steps * (BATCH // spec["ranks"]) * RECORD,
        "store_bytes": n * RECORD,
        "bytes_read": reads.get("bytes_read"),
        "disk_bytes": io_read_bytes() - io0,
        "mib_s": steps * (BATCH // spec["ranks"]) * RECORD / MIB / wall,
        "blocks": dl.state()["sampler"].get("blocks"),
    }
    dl.close()
    print("RESULT " + json.dumps(res), flush=True)
    os._exit(0)


def run(cgs: Cgroups | None, spec: dict, limit: int | None, env: dict) -> dict | None:
    drop_caches()
    res, _ = budget.measure_in_cgroup(Path(__file__), cgs, f"zring-shards-{os.getpid()}-{spec['split']}-{spec['rank']}",
                                      spec, limit, env, 600, f"rank {spec['rank']}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=3, help="whole cycles each split rank runs (default 3)")
    ap.add_argument("--unsplit-ranks", type=int, default=2, help="unsplit ranks run, one cycle each (default 2)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--gib", type=float, default=5.4)
    ap.add_argument("--cgroup-mib", type=int, default=None)
    ap.add_argument("--data", type=Path, default=None, help="data directory (default $ZRING_BENCH_DIR/cold)")
    ap.add_argument("--out", type=Path, default=None, help="default bench-results/cold.md")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if os.geteuid() != 0:
        raise SystemExit("shard_reads.py drops the page cache and sets cgroup limits: run it as root")
    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "cold"
    cgs = None
    if args.cgroup_mib:
        cgs = Cgroups()
        atexit.register(cgs.cleanup)
    signal.signal(signal.SIGTERM, lambda s, _f: sys.exit(128 + s))
    paths, n = budget.ensure_data(data, args.gib, libs=("zring",))
    store = paths["zring"]
    env = budget.child_env(None)
    limit = args.cgroup_mib * MIB if args.cgroup_mib else None
    rows = []
    for split, ranks, cycles in ((True, range(args.ranks), args.cycles), (False, range(args.unsplit_ranks), 1)):
        for k in ranks:
            spec = {"path": str(store), "rank": k, "ranks": args.ranks, "split": split, "cycles": cycles,
                    "seed": 7, "workers": args.workers, "prefetch": args.prefetch}
            res = run(cgs, spec, limit, env)
            if res:
                share = cycles * res["store_bytes"] / args.ranks
                res.update(rank=k, split=split, cycles=cycles, share=share,
                           engine_x=(res["bytes_read"] or 0) / share, disk_x=res["disk_bytes"] / share)
                rows.append(res)
                print(f"  {'split' if split else 'unsplit'} rank {k}: engine {res['engine_x']:.2f}x, "
                      f"disk {res['disk_x']:.2f}x its share, {res['mib_s']:.0f} MiB/s", file=sys.stderr, flush=True)

    def line(split: bool) -> str:
        xs = [r for r in rows if r["split"] == split]
        if not xs:
            return f"| {'split' if split else 'unsplit'} | (no run) | | | |"
        eng, disk = [r["engine_x"] for r in xs], [r["disk_x"] for r in xs]
        label = (f"split for {args.ranks} shards (new runs), {args.cycles} cycles" if split
                 else "unsplit (before; states saved before), 1 cycle")
        return (f"| {label} | {len(xs)} | **{max(disk):.2f}** (median {statistics.median(disk):.2f}) | "
                f"{max(eng):.2f} (median {statistics.median(eng):.2f}) | "
                f"{statistics.median([r['mib_s'] for r in xs]):.0f} |")

    shape = next((r["blocks"] for r in rows if r["split"]), None)
    lines = [
        f"## Mode 3 with shard=(k, {args.ranks}): bytes each rank reads ÷ its share",
        "",
        f"Machine: {common.machine(data)}. Versions: {common.versions(('zring',))}.",
        "",
        f"Store: {n} × 12 KiB records, {n * RECORD / (1 << 30):.2f} GiB; a rank's share is 1/{args.ranks} of it "
        f"per cycle ({n // BATCH} steps of batch {BATCH}). Each rank a fresh process"
        f"{', in a ' + str(args.cgroup_mib) + ' MiB memory cgroup' if limit else ''}, page cache dropped before it; "
        f"DataLoader mode 3, {args.workers} workers, prefetch {args.prefetch}; shape {shape}. "
        "Disk: read_bytes of /proc/self/io over the process; engine: the store's read counters (its O_DIRECT reads; a store read buffered counts its page-cache reads under the disk column only). "
        "Each run also reads the window after its last step (read ahead), counted here.",
        "",
        "| run | ranks | disk bytes ÷ share, worst rank | engine bytes ÷ share, worst rank | MiB/s per rank |",
        "|---|---:|---:|---:|---:|",
        line(True),
        line(False),
        "",
        "Per rank (disk ÷ share): " + "; ".join(
            f"{'split' if r['split'] else 'unsplit'} {r['rank']}: {r['disk_x']:.2f}" for r in rows) + ".",
    ]
    argv = " ".join(sys.argv[1:])
    lines += ["", f"Command: `python benches/shard_reads.py{(' ' + argv) if argv else ''}`. Data: {shown(store)}."]
    lines += [f"- note: {x}" for x in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or REPO / "bench-results" / "cold.md"
    old = out.read_text() if out.exists() else ""
    section = f"{BEGIN}\n{text.rstrip()}\n{END}\n"
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        new = before + section + rest.split(END, 1)[1].lstrip("\n")
    elif common.KEEP in old:
        before, kept = old.split(common.KEEP, 1)
        new = before.rstrip("\n") + "\n\n" + section + "\n" + common.KEEP + kept
    else:
        new = old.rstrip("\n") + "\n\n" + section
    out.write_text(new)


if __name__ == "__main__":
    main()
