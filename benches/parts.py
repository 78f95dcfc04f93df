"""A dataset of many parts against one store of the same records, in one run.

Builds (once, under ``--dir``) a dataset of ``--parts`` parts holding
``--records`` records of ``--record-bytes`` (int64s: ``i``, ``3 * i``, then
``i`` again; 16 bytes by default) with
:mod:`zring.parts`, and one store of the same records with
``write_dataset``. Then reports:

* open: ``zring.Dataset(path)`` of the dataset of parts in a fresh process
  (the manifest read, every part opened once and checked against it),
  median of ``--opens`` processes, with the page cache warm; and the same
  for the one store;
* hot random gathers: ``ds[idx]`` of ``--batch`` random indices (the same
  index batches for both), rounds interleaved, records/s and the ratio
  parts ÷ one store, round by round;
* hot DataLoader: batch ``--batch``, 2 workers, iid, records/s and ratio;
* ``ulimit -n 256``: a process limited to 256 descriptors opens the
  dataset, checks 50 random gathers and 50 loader batches against the
  records' values, and reports its open time and the most descriptors it
  had open;
* with ``--cold-secs`` (as root): the cold DataLoader, batch ``--batch``,
  2 workers, ``--cold-mode`` (1: iid), in a fresh process for each
  contender with the page cache dropped before it (and in a memory cgroup
  of ``--cgroup-mib`` when given), the contenders alternated for
  ``--rounds`` rounds: records/s over ``--cold-secs`` from the loader's
  start, its first batch included, and the ratio round by round; the
  dataset's open time from cold beside; the bytes each process read from
  disk per record (``/proc/self/io``) and its page-cache hits
  (``read_stats()``); with ``--cold-other BUILD``, the parts' run under
  another build (a directory put on ``PYTHONPATH``) in each round too.

    python benches/parts.py --dir DIR                     # 1,000 parts, 1 M records
    python benches/parts.py --dir DIR --records 100000 --record-bytes 4096
    python benches/parts.py --dir DIR --parts 100 --records 100000 --secs 0.5
    python benches/parts.py --dir DIR --record-bytes 1024 --cold-secs 3   # as root
    python benches/parts.py --dir DIR --record-bytes 1024 --skip-hot --skip-open --cold-secs 3 --cold-other BUILD
    PYTHONPATH=BUILD python benches/parts.py --dir DIR --single-hot 2     # one store only
    python benches/parts.py --dir DIR --record-bytes 1024 --slices 40 --slice-secs 0.3   # fine-grained A/B

With ``--slices N``, only hot random gathers, the two contenders alternated
in ``N`` pairs of ``--slice-secs`` each (which goes first alternating too),
each pair's ratio taken, pairs during which the host's page cache was
dropped (``drop_pagecache`` in ``/proc/vmstat`` moved: another job's cold
run) left out and both datasets read again: on a host shared with other
jobs, short pairs see the same load far more often than 1 s rounds do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

import zring
from zring import parts


def records(lo: int, hi: int, width: int = 2) -> np.ndarray:
    """Records lo..hi of ``width`` int64: ``i``, ``3 * i``, then ``i`` again."""
    i = np.arange(lo, hi, dtype=np.int64)
    out = np.repeat(i[:, None], width, axis=1)
    out[:, 1] = 3 * i
    return out


def build(root: Path, n_parts: int, n: int, width: int) -> tuple[Path, Path]:
    tag = f"{n}" if width == 2 else f"{n}x{width * 8}"
    ds, single = root / f"parts-{n_parts}-{tag}", root / f"single-{tag}"
    if not (ds / "manifest.json").is_file():
        t = time.perf_counter()
        bounds = np.linspace(0, n, n_parts + 1).astype(np.int64)
        infos = [parts.write_part(ds, records(int(a), int(b), width), codec="raw")
                 for a, b in zip(bounds, bounds[1:])]
        parts.commit(ds, infos, mode="overwrite")
        print(f"wrote {n_parts} parts in {time.perf_counter() - t:.1f} s", flush=True)
    if not single.is_dir():
        zring.write_dataset(single, records(0, n, width), codec="raw", progress=False)
    return ds, single


OPEN = textwrap.dedent(
    """
    import sys, time
    limit = int(sys.argv[2])
    if limit:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import zring
    t = time.perf_counter()
    ds = zring.Dataset(sys.argv[1])
    print(time.perf_counter() - t, len(ds))
    """
)


def open_secs(path: Path, runs: int, limit: int = 0) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", OPEN, str(path), str(limit)], capture_output=True, text=True,
                             check=True)
        times.append(float(out.stdout.split()[0]))
    return statistics.median(times)


def gather_rate(ds, batches: list[np.ndarray], secs: float, cpu: list | None = None) -> float:
    """Records/s of ``ds[idx]`` over ``batches`` for ``secs``; with ``cpu``,
    records per CPU-second of the process (every thread) appended to it: on a
    host shared with other jobs, wall time measures the scheduler as much as
    the gathers."""
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        for idx in batches:
            ds[idx]
            done += idx.size
        el = time.perf_counter() - t0
        if el >= secs:
            if cpu is not None:
                cpu.append(done / max(time.process_time() - c0, 1e-9))
            return done / el


def drops() -> int:
    """Page-cache drops on the host so far (``drop_caches`` writes)."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return 0


def slices(ds, single, a) -> None:
    """Hot random gathers, the contenders alternated in short pairs (``--slices``)."""
    rng = np.random.default_rng(7)
    batches = [rng.integers(0, a.records, a.batch) for _ in range(64)]
    sets = {"parts": ds, "one store": single}

    def warm() -> None:
        for d in sets.values():
            for lo in range(0, a.records, 1 << 16):
                d[np.arange(lo, min(a.records, lo + (1 << 16)))]

    at = {k: 0 for k in sets}

    def run(k: str) -> tuple[float, float]:
        n, t, c = 0, time.perf_counter(), time.process_time()
        while True:
            for _ in range(4):
                sets[k][batches[at[k] % len(batches)]]
                at[k] += 1
                n += a.batch
            el = time.perf_counter() - t
            if el >= a.slice_secs:
                return n / el, n / max(time.process_time() - c, 1e-9)

    warm()
    pairs, left = [], 0
    for s in range(a.slices):
        d0 = drops()
        order = ["parts", "one store"] if s % 2 == 0 else ["one store", "parts"]
        r = {k: run(k) for k in order}
        if drops() != d0:
            left += 1
            warm()
            continue
        pairs.append((r["parts"], r["one store"]))
    med = statistics.median
    wall = [p[0] / o[0] for p, o in pairs]
    cpu = [p[1] / o[1] for p, o in pairs]
    q = lambda xs, f: float(np.quantile(xs, f))  # noqa: E731
    print(f"hot random gathers of {a.batch}, {len(pairs)} alternated pairs of {a.slice_secs:g} s ({left} left out: "
          f"page cache dropped): parts / one store = {med(wall):.2f}x (quartiles {q(wall, 0.25):.2f}, "
          f"{q(wall, 0.75):.2f}); per CPU-second {med(cpu):.2f}x; {med([p[0] for p, _ in pairs]) / 1e6:.2f} vs "
          f"{med([o[0] for _, o in pairs]) / 1e6:.2f} M records/s ({zring.__file__})")


def loader_rate(ds, batch: int, secs: float) -> float:
    with zring.DataLoader({"x": ds}, batch_size=batch, mode=1, num_workers=2, seed=1) as dl:
        for _ in range(5):
            next(dl)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < secs:
            done += len(next(dl)["x"])
        return done / (time.perf_counter() - t0)


LIMITED = textwrap.dedent(
    """
    import os, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import numpy as np, zring
    most = 0
    def fds():
        global most
        most = max(most, len(os.listdir("/proc/self/fd")))
    t = time.perf_counter()
    ds = zring.Dataset(sys.argv[1])
    opened = time.perf_counter() - t
    fds()
    n = len(ds)
    rng = np.random.default_rng(0)
    for _ in range(50):
        idx = rng.integers(0, n, 256)
        got = ds[idx]
        assert np.array_equal(got[:, 0], idx) and np.array_equal(got[:, 1], 3 * idx)
        fds()
    with zring.DataLoader({"x": ds}, batch_size=256, num_workers=2, mode=1) as dl:
        for _ in range(50):
            b = next(dl)
            assert np.array_equal(b["x"][:, 0], dl.last_indices)
            fds()
    print(opened, most)
    """
)


COLD = textwrap.dedent(
    """
    import json, os, sys, time
    path, secs, mode, batch, cg = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    if cg:
        open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid()))
    import zring
    t = time.perf_counter()
    ds = zring.Dataset(path)
    opened = time.perf_counter() - t
    def io():
        got = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
        return int(got["read_bytes"]), int(got["rchar"])
    def disk():
        # Sectors read by every block device (the host's, not only ours).
        total = 0
        for name in os.listdir("/sys/block"):
            if not name.startswith(("loop", "ram", "zram")):
                total += int(open(f"/sys/block/{name}/stat").read().split()[2]) * 512
        return total
    io0, disk0 = io(), disk()
    done, t0 = 0, time.perf_counter()
    with zring.DataLoader({"x": ds}, batch_size=batch, mode=mode, num_workers=2, seed=3) as dl:
        while time.perf_counter() - t0 < secs:
            done += len(next(dl)["x"])
        rate = done / (time.perf_counter() - t0)
    io1, disk1 = io(), disk()
    st = ds.read_stats()
    keep = ("policy", "records", "page_cache_hits", "bytes_read", "bytes_from_page_cache")
    print(json.dumps({"opened": opened, "rate": rate, "records": done, "disk_read": io1[0] - io0[0],
                      "rchar": io1[1] - io0[1], "host_disk_read": disk1 - disk0,
                      **{k: st.get(k) for k in keep}}))
    """
)


def cold_run(path: Path, secs: float, mode: int, batch: int, cgs, limit: int | None, seq: int,
             build: str | None = None) -> dict:
    """One fresh process, page cache dropped first: its open seconds (``opened``),
    loader records/s (``rate``) and records (``records``), the bytes it read
    from disk (``disk_read``, /proc/self/io) and through reads (``rchar``), the
    host's disks' reads meanwhile (``host_disk_read``), and ``read_stats()``'s
    policy and counts. ``build``: another build's directory, put first on the
    process's ``PYTHONPATH``."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    cg = None
    if cgs is not None and limit:
        cg, _ = cgs.create(f"zring-parts-{os.getpid()}-{seq}", limit)
    try:
        env = dict(os.environ, PYTHONPATH=build) if build else None
        out = subprocess.run([sys.executable, "-c", COLD, str(path), str(secs), str(mode), str(batch), str(cg or "")],
                             capture_output=True, text=True, check=True, env=env)
    finally:
        if cg:
            cgs.remove(cg)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where the data is built (kept for reruns)")
    ap.add_argument("--parts", type=int, default=1000)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-bytes", type=int, default=16, help="a multiple of 8, at least 16")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=float, default=1.0)
    ap.add_argument("--opens", type=int, default=5)
    ap.add_argument("--cold-secs", type=float, default=0, help="seconds of each cold DataLoader run (0: none)")
    ap.add_argument("--cold-mode", type=int, default=1)
    ap.add_argument("--cold-other", default=None,
                    help="another build's directory (PYTHONPATH): the cold parts run under it too, each round")
    ap.add_argument("--cgroup-mib", type=int, default=None, help="memory cgroup limit of each cold process")
    ap.add_argument("--skip-hot", action="store_true", help="only the open, cold and ulimit figures")
    ap.add_argument("--skip-open", action="store_true", help="no open figures")
    ap.add_argument("--slices", type=int, default=0,
                    help="only hot random gathers, in this many alternated pairs of --slice-secs (module docs)")
    ap.add_argument("--slice-secs", type=float, default=0.3)
    ap.add_argument("--single-hot", type=float, default=0,
                    help="only hot random gathers from the one store for this many seconds, one line (to compare "
                         "two builds, alternated: PYTHONPATH=BUILD python benches/parts.py --single-hot 2 ...)")
    a = ap.parse_args()
    root = a.dir or Path(tempfile.mkdtemp(prefix="zring-parts-"))
    root.mkdir(parents=True, exist_ok=True)
    width = max(2, a.record_bytes // 8)
    ds_path, single_path = build(root, a.parts, a.records, width)
    if a.single_hot:
        single = zring.Dataset(single_path)
        rng = np.random.default_rng(7)
        batches = [rng.integers(0, a.records, a.batch) for _ in range(64)]
        gather_rate(single, batches, 0.5)  # warm
        cpu: list[float] = []
        rate = gather_rate(single, batches, a.single_hot, cpu)
        print(f"one store, hot random gathers of {a.batch}: {rate / 1e6:.3f} M records/s, "
              f"{cpu[0] / 1e6:.3f} M records per CPU-second ({zring.__file__})")
        return

    if a.slices:
        slices(zring.Dataset(ds_path), zring.Dataset(single_path), a)
        return

    if not a.skip_open:
        print(f"open, dataset of {a.parts} parts: {open_secs(ds_path, a.opens) * 1e3:.0f} ms "
              f"(median of {a.opens} processes)")
        print(f"open, one store:               {open_secs(single_path, a.opens) * 1e3:.0f} ms")

    if a.cold_secs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import Cgroups  # noqa: E402

        cgs = Cgroups() if a.cgroup_mib else None
        limit = a.cgroup_mib << 20 if a.cgroup_mib else None
        colds, others = [], []
        # Bytes per record from disk (the process's, /proc/self/io), and the
        # share of records copied from the page cache.
        per = lambda c, k: c[k] / max(c["records"], 1)  # noqa: E731
        hits = lambda c: (c["page_cache_hits"] or 0) / max(c["records"] or 1, 1)  # noqa: E731
        for r in range(a.rounds):
            pc = cold_run(ds_path, a.cold_secs, a.cold_mode, a.batch, cgs, limit, 2 * r)
            sc = cold_run(single_path, a.cold_secs, a.cold_mode, a.batch, cgs, limit, 2 * r + 1)
            colds.append((pc, sc))
            p, s = pc["rate"], sc["rate"]
            if a.cold_other:
                oc = cold_run(ds_path, a.cold_secs, a.cold_mode, a.batch, cgs, limit, 2 * r, a.cold_other)
                others.append((oc, sc))
                print(f"round {r}: cold DataLoader, parts under --cold-other {oc['rate'] / 1e3:.1f} k rec/s "
                      f"({oc['rate'] / s:.2f}x of one store), from disk {per(oc, 'disk_read'):.0f} B/record, "
                      f"page cache hits {hits(oc):.0%}", flush=True)
            print(f"round {r}: cold DataLoader {p / 1e3:.1f} vs {s / 1e3:.1f} k rec/s ({p / s:.2f}x); "
                  f"from disk {per(pc, 'disk_read'):.0f} vs {per(sc, 'disk_read'):.0f} B/record, page cache hits {hits(pc):.0%} vs "
                  f"{hits(sc):.0%}; policy {pc['policy']} vs {sc['policy']}; "
                  f"open from cold {pc['opened'] * 1e3:.0f} vs {sc['opened'] * 1e3:.0f} ms", flush=True)
        med = statistics.median
        print(f"cold DataLoader, mode {a.cold_mode}, batch {a.batch}, 2 workers, {a.cold_secs:g} s, page cache dropped: "
              f"parts / one store = {med([p['rate'] / s['rate'] for p, s in colds]):.2f}x (median of rounds; "
              f"{med([p['rate'] for p, _ in colds]) / 1e3:.1f} vs {med([s['rate'] for _, s in colds]) / 1e3:.1f} "
              f"k records/s); from disk {med([per(p, 'disk_read') for p, _ in colds]):.0f} vs "
              f"{med([per(s, 'disk_read') for _, s in colds]):.0f} B/record; open from cold "
              f"{med([p['opened'] for p, _ in colds]) * 1e3:.0f} vs {med([s['opened'] for _, s in colds]) * 1e3:.0f} ms")
        if others:
            print(f"cold DataLoader, parts under --cold-other / one store = "
                  f"{med([o['rate'] / s['rate'] for o, s in others]):.2f}x "
                  f"({med([o['rate'] for o, _ in others]) / 1e3:.1f} k records/s); from disk "
                  f"{med([per(o, 'disk_read') for o, _ in others]):.0f} B/record")
    if a.skip_hot:
        a.rounds = 0
    ds, single = zring.Dataset(ds_path), zring.Dataset(single_path)
    rng = np.random.default_rng(7)
    batches = [rng.integers(0, a.records, a.batch) for _ in range(64)]
    for idx in batches[:4]:  # same records either way
        assert np.array_equal(ds[idx], single[idx])
    if a.rounds:
        # Every record read once, so that both start in the page cache (the
        # cold runs above dropped it).
        for d in (ds, single):
            for lo in range(0, a.records, 1 << 16):
                d[np.arange(lo, min(a.records, lo + (1 << 16)))]
    gathers, loads, cpus = [], [], []
    for r in range(a.rounds):
        cp: list[float] = []
        cs: list[float] = []
        p, s = gather_rate(ds, batches, a.secs, cp), gather_rate(single, batches, a.secs, cs)
        lp, ls = loader_rate(ds, a.batch, a.secs), loader_rate(single, a.batch, a.secs)
        gathers.append((p, s))
        cpus.append((cp[0], cs[0]))
        loads.append((lp, ls))
        print(f"round {r}: gather {p / 1e6:.2f} vs {s / 1e6:.2f} M rec/s ({p / s:.2f}x), "
              f"{cp[0] / 1e6:.2f} vs {cs[0] / 1e6:.2f} M rec per CPU-s ({cp[0] / cs[0]:.2f}x); "
              f"DataLoader {lp / 1e6:.2f} vs {ls / 1e6:.2f} M rec/s ({lp / ls:.2f}x)", flush=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    if not gathers:
        gathers, loads, cpus = [(0.0, 1.0)], [(0.0, 1.0)], [(0.0, 1.0)]
    print(f"hot random gathers of {a.batch}: parts / one store = {med([p / s for p, s in gathers]):.2f}x "
          f"(median of rounds; {med([p for p, _ in gathers]) / 1e6:.2f} vs {med([s for _, s in gathers]) / 1e6:.2f} "
          "M records/s)")
    print(f"hot random gathers of {a.batch} per CPU-second (all threads): parts / one store = "
          f"{med([p / s for p, s in cpus]):.2f}x ({med([p for p, _ in cpus]) / 1e6:.2f} vs "
          f"{med([s for _, s in cpus]) / 1e6:.2f} M records per CPU-second)")
    print(f"hot DataLoader, batch {a.batch}, 2 workers: parts / one store = {med([p / s for p, s in loads]):.2f}x "
          f"({med([p for p, _ in loads]) / 1e6:.2f} vs {med([s for _, s in loads]) / 1e6:.2f} M records/s)")
    ds.close()
    single.close()

    out = subprocess.run([sys.executable, "-c", LIMITED, str(ds_path)], capture_output=True, text=True)
    if out.returncode != 0:
        print("ulimit -n 256: FAILED\n" + out.stderr[-2000:])
        sys.exit(1)
    opened, most = out.stdout.split()
    print(f"ulimit -n 256: open {float(opened) * 1e3:.0f} ms, 50 gathers and 50 loader batches checked, "
          f"at most {most} descriptors open")
    print(json.dumps({"parts": a.parts, "records": a.records, "record_bytes": width * 8, "batch": a.batch}))


if __name__ == "__main__":
    main()
