"""Table format 2: metadata on disk, and a cold open and first gather of a
store of 1e8 records, before and after ``compact(format=2)``, in one run.

* 20 million int64 labels written raw (zring format 1, zring format 2,
  loaderx 0.7.3): bytes on disk against the labels' 160 MB; the format-1
  stores are written with ``append=True`` (a one-shot write seals its table
  in format 2 itself: ``benches/seal.py``);
* 2 million ragged token records (int32, 8..127 tokens) written raw: table
  bytes per record;
* ``--records`` (default 1e8) int64 labels: with the page cache emptied, a
  new process opens the store and gathers 1,024 random labels; the times and
  the process's resident memory after each, in format 1 and in format 2.

    python benches/table.py [--records 100000000]   # root, for drop_caches
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, drop_caches, machine, note, notes, versions, write_result  # noqa: E402

import zring  # noqa: E402

DATA = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "table"


def disk_bytes(path: Path) -> int:
    """Bytes the store's files take (their lengths; chunk files are dense)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name not in ("lock", "pins"))


def allocated(path: Path) -> int:
    """Bytes allocated on disk (loaderx's chunk files are sparse)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and p.name not in ("lock", "pins"))


def table_bytes(path: Path) -> int:
    with zring.Zrecord(path, readonly=True) as z:
        return z.stats()["table_bytes"]


def timed(f):
    t = time.perf_counter()
    r = f()
    return r, time.perf_counter() - t


PROBE = r"""
import json, resource, sys, time
import numpy as np
def io():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["read_bytes"])
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
import zring
r0, m0 = io(), rss()
t1 = time.perf_counter()
ds = zring.Dataset(sys.argv[1])
t2 = time.perf_counter()
idx = np.random.default_rng(int(sys.argv[2])).integers(0, len(ds), 1024)
got = ds[idx]
t3 = time.perf_counter()
assert (got == idx).all(), "wrong labels"
print(json.dumps({"open_s": t2 - t1, "gather_s": t3 - t2, "rss": rss() - m0, "read_bytes": io() - r0}))
"""


COMPACT = r"""
import json, sys, threading, time
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
import zring
m0, a0 = status("VmHWM"), status("RssAnon")
peak_anon, done = a0, threading.Event()
def watch():
    global peak_anon
    while not done.wait(0.02):
        peak_anon = max(peak_anon, status("RssAnon"))
w = threading.Thread(target=watch)
w.start()
t = time.perf_counter()
with zring.Zrecord(sys.argv[1]) as s:
    s.compact(format=int(sys.argv[2]))
secs = time.perf_counter() - t
done.set()
w.join()
print(json.dumps({"secs": secs, "peak": status("VmHWM") - m0, "anon": peak_anon - a0}))
"""


def compact(path: Path, fmt: int) -> dict:
    """Compacts the store to table format ``fmt`` in a new process: seconds
    taken, the growth of its peak resident set over ``import zring`` (mapped
    table and chunk pages included) and of its anonymous memory (sampled
    every 20 ms)."""
    out = subprocess.run([sys.executable, "-c", COMPACT, str(path), str(fmt)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def probe(path: Path, seed: int) -> dict:
    drop_caches()
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(seed)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000_000)
    ap.add_argument("--labels", type=int, default=20_000_000)
    ap.add_argument("--ragged", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="cold probes per format")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "table.md")
    args = ap.parse_args()
    import loaderx

    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    lines = []

    # 1. int64 labels.
    labels = np.arange(args.labels, dtype=np.int64)
    payload = labels.nbytes
    # append=True: a format-1 table (a one-shot write seals format 2 itself:
    # benches/seal.py).
    z, tw = timed(lambda: zring.write_dataset(DATA / "labels", labels, codec="raw", append=True))
    v1 = disk_bytes(DATA / "labels")
    tc = compact(DATA / "labels", 2)["secs"]
    v2 = disk_bytes(DATA / "labels")
    with zring.Dataset(DATA / "labels") as ds:
        assert (ds[:] == labels).all()
    try:
        _, tl = timed(lambda: loaderx.write_dataset(DATA / "labels-lx", labels, codec="raw"))
        lx_row = f"| loaderx 0.7.3 (allocated) | {allocated(DATA / 'labels-lx') / 1e6:,.1f} MB | " \
                 f"{allocated(DATA / 'labels-lx') / payload:.3f} | {tl:.1f} s |"
    except Exception as e:  # loaderx refuses stores past its capacity
        lx_row = f"| loaderx 0.7.3 | refused: {type(e).__name__}: {e} | | |"
        note(f"loaderx.write_dataset of {args.labels:,} int64 labels: {type(e).__name__}: {e}")
    lines += [
        f"## {args.labels:,} int64 labels, raw ({payload / 1e6:.0f} MB)", "",
        "| store | on disk | × the labels | written in |", "|---|---:|---:|---:|",
        f"| zring, table format 1 | {v1 / 1e6:,.1f} MB | {v1 / payload:.3f} | {tw:.1f} s |",
        f"| zring, `compact(format=2)` | {v2 / 1e6:,.1f} MB | {v2 / payload:.3f} | + {tc:.1f} s |",
        lx_row, "",
    ]
    print("\n".join(lines[-7:]), flush=True)
    del labels

    # 2. ragged token records.
    rng = np.random.default_rng(0)
    lens = rng.integers(8, 128, args.ragged)
    tokens = rng.integers(0, 50_000, int(lens.sum()), dtype=np.int32)
    arrays = np.split(tokens, np.cumsum(lens)[:-1])
    _, tw = timed(lambda: zring.write_ragged(DATA / "ragged", arrays, codec="raw", append=True))
    t1 = table_bytes(DATA / "ragged")
    tc = compact(DATA / "ragged", 2)["secs"]
    t2 = table_bytes(DATA / "ragged")
    with zring.RaggedDataset(DATA / "ragged") as ds:
        for i in rng.integers(0, args.ragged, 1000):
            assert (ds[int(i)] == arrays[i]).all()
    n = args.ragged
    lines += [
        f"## {n:,} ragged records (int32 tokens, 8..127 each), raw", "",
        "| table | bytes | per record |", "|---|---:|---:|",
        f"| format 1 | {t1 / 1e6:,.1f} MB | {t1 / n:.2f} B |",
        f"| format 2 (`compact(format=2)`, {tc:.1f} s) | {t2 / 1e6:,.1f} MB | {t2 / n:.2f} B |",
        "| loaderx 0.7.3 | | 16 B by its layout |", "",
    ]
    print("\n".join(lines[-8:]), flush=True)
    del arrays, tokens

    # 3. a store of --records labels, cold.
    big = DATA / "big"
    arr = np.arange(args.records, dtype=np.int64)
    _, tw = timed(lambda: zring.write_dataset(big, arr, codec="raw", append=True))
    del arr
    rows = []
    for fmt in (1, 2):
        if fmt == 2:
            c = compact(big, 2)
        tb = table_bytes(big)
        for r in range(args.rounds):
            p = probe(big, 100 + r)
            rows.append((fmt, tb, p))
            print(f"format {fmt}: {p}", flush=True)
    lines += [
        f"## {args.records:,} int64 labels: a new process opens the store and gathers 1,024 random labels, "
        "page cache emptied first", "",
        f"Written in {tw:.0f} s (format 1); `compact(format=2)`, in a process of its own, took {c['secs']:.0f} s; "
        f"its peak resident set grew by {c['peak'] / 2**20:,.0f} MiB over `import zring` (the mapped format-1 "
        f"table's pages included), its anonymous memory by at most {c['anon'] / 2**20:,.0f} MiB.", "",
        "| table | table bytes | open | first gather | memory it added | read from disk |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for fmt in (1, 2):
        ps = [p for f, _, p in rows if f == fmt]
        tb = next(t for f, t, _ in rows if f == fmt)
        med = lambda k: float(np.median([p[k] for p in ps]))  # noqa: E731
        lines.append(f"| format {fmt} | {tb / 1e3:,.0f} kB | {med('open_s') * 1e3:.1f} ms | "
                     f"{med('gather_s') * 1e3:.1f} ms | {med('rss') / 2**20:.0f} MiB | "
                     f"{med('read_bytes') / 2**20:.1f} MiB |")
    lines += ["", f"Medians of {args.rounds} cold probes each. 'memory it added' is the growth of the probe "
              "process's resident set from after `import zring` to after the gather; 'read from disk' its "
              "read_bytes over the same span (the store's table and data, with the kernel's read-ahead).", ""]
    text = "\n".join([
        "# Table format 2: metadata and cold opens", "",
        f"`python benches/table.py --records {args.records}` — {machine(DATA)}", "",
        versions(("zring", "loaderx", "numpy")), "", *lines,
        *(f"- note: {n}" for n in notes),
    ])
    write_result(args.out, text)
    print(text)
    shutil.rmtree(DATA, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
