"""Side-by-side comparison of zring with loaderx and other record stores.

One process, the same data and the same index sequences for every contender:

  (a) sampler: ns per index, zring.Sampler vs loaderx's Sampler vs numpy;
  (b) hot gather: write MiB/s, gather MiB/s, per-batch latency, bytes on disk;
  (c) cold gather: the page cache emptied before every round, with the bytes
      the disk actually served, plus fio on zring's largest chunk file as the
      physical ceiling;
  (d) loader end to end: batch 256 of 'data' (12 KiB) + 'label' (int64).
  (e) every core: the machine's ceilings on the same records (N-thread zstd
      compress and decode, N-thread memcpy, no I/O; zring._zring.ceiling),
      then write, hot gather and loader throughput of zring and loaderx, each
      with the CPU cores it kept busy and its ratio to the matching ceiling.

Usage (in the project venv, with zring built by ``maturin develop``):

    python benches/compare.py [--quick] [--only abcde] [--cold-gib N] [--data DIR] [--out DIR]

Data goes to $ZRING_BENCH_DIR/compare (default ``bench-data/compare`` in the
repository; never /tmp, which may be memory) and is reused between runs: a
store built by an earlier run keeps the write time measured when it was built
(delete the directory to measure writes again).
Tables go to ``bench-results/compare.md`` (``bench-results/cores.md`` for a run of
``--only e`` alone) and plots to ``bench-results/*.png``.
A peer that is not installed or fails is skipped with a note in the tables.

The script runs the measurements; benches/compare_stores.py holds the fixed
inputs, the data and measurement helpers and every contender's writer and
gatherer, benches/compare_report.py the tables and plots.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (the benches' shared helpers)
from common import REPO, fio_randread, note, notes, proc_read_bytes  # noqa: E402
from compare_stores import (  # noqa: E402  (inputs, helpers, contenders; other benches take some from here)
    BATCH, CEIL_LEVEL, CEIL_LOADER_SEED, CEIL_LOADER_WORKERS, CEIL_MODE, CEIL_PREFETCH, CEIL_RECORDS, CEIL_SECS,
    CEIL_TRANSFORM_SLEEP, CEIL_TRANSFORM_WORKERS, CEIL_WRITE_RUNS, COLD_BATCHES_PER_ROUND, COLD_GIB, COLD_ROUNDS,
    DATA_VERSION, FIO_SECS, GATHER_SECS, HOT_MIB, LOADER_PREFETCH, LOADER_STEPS, LOADER_WARMUP, LOADER_WORKERS,
    MIB, RECORD, RECORD_SHAPE, SAMPLER_BATCHES, SAMPLER_LENGTH, SAMPLER_SECS, SEED, Row, _try_import, allocated,
    block_read_bytes, contenders, cpu_secs, evict, index_batches, make_records, pct, rm, slug, timed_gather, warm,
)
from compare_report import (  # noqa: E402  (tables and plots)
    e_tables, gather_table, loader_table, machine, plots, sampler_table, versions,
)


# --------------------------------------------------------------------------
# (a) sampler
# --------------------------------------------------------------------------

def bench_sampler() -> list[dict]:
    rows = []
    zring = _try_import("zring")
    lxs = None
    try:
        from loaderx._sampler import Sampler as LxSampler
        lxs = LxSampler
    except Exception as e:  # noqa: BLE001
        note(f"loaderx Sampler unavailable: {e}")
    modes = {0: "sequential", 1: "iid", 2: "cyclic"}

    def measure(next_fn) -> float:
        next_fn()
        calls, t0 = 0, time.perf_counter()
        while True:
            next_fn()
            calls += 1
            el = time.perf_counter() - t0
            if el >= SAMPLER_SECS and calls >= 5:
                return el, calls

    for mode, mname in modes.items():
        for b in SAMPLER_BATCHES:
            res = {}
            if zring is not None:
                s = zring.Sampler(SAMPLER_LENGTH, b, mode, SEED)
                el, calls = measure(s.next)
                res["zring.Sampler"] = el / (calls * b) * 1e9
            if lxs is not None:
                s = lxs(SAMPLER_LENGTH, b, mode, SEED)
                el, calls = measure(s.next)
                res["loaderx Sampler"] = el / (calls * b) * 1e9
            rng = np.random.default_rng(SEED)
            if mode == 1:
                fn = lambda: rng.integers(0, SAMPLER_LENGTH, size=b, dtype=np.uint64)  # noqa: E731
                label = "numpy integers"
            elif mode == 2:
                state = {"perm": rng.permutation(SAMPLER_LENGTH), "pos": 0}

                def fn(state=state, b=b):
                    if state["pos"] + b > SAMPLER_LENGTH:
                        state["perm"] = rng.permutation(SAMPLER_LENGTH)
                        state["pos"] = 0
                    out = state["perm"][state["pos"]:state["pos"] + b]
                    state["pos"] += b
                    return out
                label = "numpy permutation slice"
            else:
                state = {"pos": 0}

                def fn(state=state, b=b):
                    out = (np.arange(state["pos"], state["pos"] + b, dtype=np.uint64)) % SAMPLER_LENGTH
                    state["pos"] += b
                    return out
                label = "numpy arange"
            el, calls = measure(fn)
            res[label] = el / (calls * b) * 1e9
            rows.append({"mode": mname, "batch": b, **res})
    return rows


# --------------------------------------------------------------------------
# (b) hot gather
# --------------------------------------------------------------------------

def bench_hot(arr: np.ndarray, data: Path, budget: float) -> list[Row]:
    n = len(arr)
    batches = index_batches(n, 100_000 if budget > 1 else 20_000)

    def check(idx, got):
        if not np.array_equal(np.asarray(got).reshape(len(idx), -1), arr[idx.astype(np.int64)].reshape(len(idx), -1)):
            raise AssertionError("gathered bytes differ from the source array")

    rows = []
    for name, kind, write, opener in contenders(arr):
        path = data / f"hot-{DATA_VERSION}-{n}" / slug(name.split(" (")[0] if "tensorstore" not in name else "zarr v3")
        done = path.parent / f".{path.name}.complete"
        try:
            if "tensorstore" in name:
                wsecs = float("nan")  # reads zarr's files
            elif done.exists() and path.exists():
                wsecs = float(done.read_text())  # built by an earlier run; its write time is kept
            else:
                rm(path)
                gc.collect()
                t = time.perf_counter()
                write(path)
                os.sync()
                wsecs = time.perf_counter() - t
                done.write_text(repr(wsecs))
            on_disk = allocated(path)
            warm(path)  # "hot" means in the page cache, whatever ran before
            g = opener(path)
            g(batches[0])  # open costs and first touch
            row = timed_gather(name, kind, g, batches, budget, check=check,
                               write_mib_s=arr.nbytes / MIB / wsecs if wsecs == wsecs else float("nan"),
                               disk=on_disk, ratio=arr.nbytes / max(on_disk, 1))
            rows.append(row)
            print(f"  hot  {name:<32} write {row.extra['write_mib_s']:8.0f} MiB/s  gather {row.mib_s:8.0f} MiB/s "
                  f"p50 {pct(row.lat_ms, 50):7.2f} ms", file=sys.stderr)
            del g
            gc.collect()
        except Exception as e:  # noqa: BLE001
            note(f"{name}: failed in the hot run ({type(e).__name__}: {e})")
            traceback.print_exc(limit=2)
    return rows


# --------------------------------------------------------------------------
# (c) cold
# --------------------------------------------------------------------------

def bench_cold(data: Path, gib: float, mode: str) -> tuple[list[Row], str]:
    n = int(gib * (1 << 30) / RECORD)
    root = data / f"cold-{DATA_VERSION}-{n}"
    root.mkdir(parents=True, exist_ok=True)
    zring = _try_import("zring")
    loaderx = _try_import("loaderx")
    block = 1 << 14
    writers = []
    if zring is not None:
        writers.append(("zring raw", "zring", root / "zring_raw", lambda p, a: zring.write_dataset(p, a, codec="raw", append=True),
                        lambda p: zring.Dataset(p).__getitems__))
    if loaderx is not None:
        writers.append(("loaderx raw", "loaderx", root / "loaderx_raw", lambda p, a: loaderx.write_dataset(p, a, codec="raw"),
                        lambda p: loaderx.Dataset(p).__getitems__))
    # Build each store from blocks so a store larger than memory never sits in memory.
    for name, _, path, write, opener in writers:
        ok = path / ".complete"
        if ok.exists():
            continue
        rm(path)
        print(f"  cold: building {name} ({gib:.1f} GiB)", file=sys.stderr)
        for s in range(0, n, block):
            write(path, make_records_range(s, min(n, s + block)))
        ok.write_text(str(n))
    npy = root / "data.npy"
    if not (root / ".npy-complete").exists():
        print(f"  cold: building npy ({gib:.1f} GiB)", file=sys.stderr)
        m = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(n, *RECORD_SHAPE))
        for s in range(0, n, block):
            m[s:min(n, s + block)] = make_records_range(s, min(n, s + block))
        m.flush()
        del m
        (root / ".npy-complete").write_text(str(n))
    how = evict([root])
    contenders_ = [(name, kind, opener(path)) for name, kind, path, _, opener in writers]
    mm = np.load(npy, mmap_mode="r")
    contenders_.insert(0, ("npy mmap fancy-index", "peer", lambda idx: mm[idx.astype(np.int64)]))
    rows = []
    rounds = COLD_ROUNDS[mode]
    for name, kind, g in contenders_:
        batches = index_batches(n, rounds * COLD_BATCHES_PER_ROUND, seed=SEED + 1)
        lat, busy, disk, pio, cpu = [], 0.0, 0, 0, 0.0
        for r in range(rounds):
            evict([root])
            for b in batches[r * COLD_BATCHES_PER_ROUND:(r + 1) * COLD_BATCHES_PER_ROUND]:
                d0, p0 = block_read_bytes(), proc_read_bytes()
                c0, t = cpu_secs(), time.perf_counter()
                g(b)
                el = time.perf_counter() - t
                cpu += cpu_secs() - c0
                disk += block_read_bytes() - d0
                pio += proc_read_bytes() - p0
                lat.append(el)
                busy += el
        row = Row(name, kind, lat, len(lat) * BATCH * RECORD, len(lat) * BATCH, busy, disk=disk, proc_io=pio,
                  cpu_s=cpu)
        rows.append(row)
        print(f"  cold {name:<32} {row.mib_s:8.0f} MiB/s  disk {disk / MIB:8.0f} MiB  p50 {pct(row.lat_ms, 50):7.2f} ms",
              file=sys.stderr)
    fio_row = run_fio(root / "zring_raw", FIO_SECS[mode], root)
    if fio_row is not None:
        rows.append(fio_row)
    return rows, f"{gib:.1f} GiB of 12 KiB records per store; before every round of {COLD_BATCHES_PER_ROUND} batches: {how}"


def make_records_range(start: int, end: int) -> np.ndarray:
    """Records [start, end) of a large store; reproducible per block."""
    out = np.empty((end - start, *RECORD_SHAPE), dtype=np.uint8)
    rng = np.random.default_rng(SEED + 1000 + start)
    y, x = np.mgrid[0:64, 0:64].astype(np.uint32)
    k = end - start
    gx = rng.integers(1, 6, size=(k, 1, 1, 1), dtype=np.uint32)
    gy = rng.integers(1, 6, size=(k, 1, 1, 1), dtype=np.uint32)
    phase = rng.integers(0, 256, size=(k, 1, 1, 1), dtype=np.uint32)
    plane = (np.arange(3, dtype=np.uint32) * 50).reshape(1, 3, 1, 1)
    noise = rng.integers(0, 4, size=(k, *RECORD_SHAPE), dtype=np.uint32)
    out[:] = ((gx * x + gy * y) // 8 + phase + plane + noise) & 0xFF
    return out


def run_fio(store: Path, secs: int, root: Path) -> Row | None:
    evict([root])
    f = fio_randread(store, secs)
    if f is None:
        return None
    # Per "batch" of 256 reads at the measured rate, for comparison with the rows above.
    row = Row("fio io_uring O_DIRECT randread 12k qd32", "ceiling", [], f["ios"] * 12288, f["ios"], f["secs"],
              iops=f["iops"], clat_p50_ms=f["clat_p50_ms"], clat_p99_ms=f["clat_p99_ms"],
              clat_p999_ms=f["clat_p999_ms"], cmd=f["cmd"])
    row.lat_ms = []
    return row


# --------------------------------------------------------------------------
# (d) loader end to end
# --------------------------------------------------------------------------

def bench_loader(arr: np.ndarray, data: Path, steps: int) -> list[Row]:
    n = len(arr)
    labels = np.arange(n, dtype=np.int64)
    root = data / f"loader-{DATA_VERSION}-{n}"
    zring = _try_import("zring")
    loaderx = _try_import("loaderx")
    rows = []

    def drive(name, kind, it, close):
        lat = []
        for _ in range(LOADER_WARMUP):
            next(it)
        c0, t0 = cpu_secs(), time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            b = next(it)
            lat.append(time.perf_counter() - t)
            del b
        wall = time.perf_counter() - t0
        # This process's threads only: a loader working in other processes
        # (torch's workers) shows "-".
        cpu = cpu_secs() - c0 if "procs" not in name else None
        close()
        row = Row(name, kind, lat, steps * BATCH * (RECORD + 8), steps * BATCH, wall, cpu_s=cpu)
        rows.append(row)
        print(f"  load {name:<40} {row.per_s:8.1f} batches/s  wait p50 {pct(row.lat_ms, 50):7.3f} ms "
              f"p99 {pct(row.lat_ms, 99):7.3f} ms", file=sys.stderr)

    for lib, kind in ((zring, "zring"), (loaderx, "loaderx")):
        if lib is None:
            continue
        for codec in ("raw", "zstd"):
            name = f"{kind} DataLoader, data {codec}"
            try:
                dp, lp = root / f"{kind}_{codec}_data", root / f"{kind}_label"
                if not (dp / ".complete").exists():
                    rm(dp)
                    lib.write_dataset(dp, arr, codec=codec)
                    (dp / ".complete").write_text("1")
                if not (lp / ".complete").exists():
                    rm(lp)
                    lib.write_dataset(lp, labels, codec="raw")
                    (lp / ".complete").write_text("1")
                warm(dp)
                warm(lp)
                dl = lib.DataLoader({"data": lib.Dataset(dp), "label": lib.Dataset(lp)}, batch_size=BATCH,
                                    num_workers=LOADER_WORKERS, prefetch_size=LOADER_PREFETCH, mode=2, seed=SEED)
                first = next(dl)
                if not np.array_equal(arr[first["label"].astype(np.int64)], first["data"]):
                    raise AssertionError("data and label streams do not line up")
                drive(name, kind, dl, dl.close)
            except Exception as e:  # noqa: BLE001
                note(f"{name}: failed ({type(e).__name__}: {e})")
                traceback.print_exc(limit=3)

    npy_dir = root / "npy"
    if not (npy_dir / ".complete").exists():
        npy_dir.mkdir(parents=True, exist_ok=True)
        np.save(npy_dir / "data.npy", arr)
        np.save(npy_dir / "label.npy", labels)
        (npy_dir / ".complete").write_text("1")

    warm(npy_dir)
    torch = _try_import("torch")
    if torch is not None:
        try:
            class NpyPair(torch.utils.data.Dataset):
                def __init__(self):
                    self.d = None

                def _open(self):
                    if self.d is None:
                        self.d = np.load(npy_dir / "data.npy", mmap_mode="r")
                        self.l = np.load(npy_dir / "label.npy", mmap_mode="r")

                def __len__(self):
                    return n

                def __getitem__(self, i):
                    self._open()
                    return self.d[i], self.l[i]

                def __getitems__(self, idx):
                    self._open()
                    idx = np.asarray(idx, dtype=np.int64)
                    return {"data": torch.from_numpy(self.d[idx]), "label": torch.from_numpy(self.l[idx])}

            torch.set_num_threads(1)
            g = torch.Generator().manual_seed(SEED)
            # Enough successive permutations for the whole run (no epoch end mid-run).
            rs = torch.utils.data.RandomSampler(NpyPair(), num_samples=(steps + LOADER_WARMUP + 8) * BATCH, generator=g)
            sampler = torch.utils.data.BatchSampler(rs, BATCH, drop_last=True)
            dl = torch.utils.data.DataLoader(NpyPair(), sampler=sampler, batch_size=None, num_workers=LOADER_WORKERS,
                                             prefetch_factor=LOADER_PREFETCH, persistent_workers=True,
                                             collate_fn=lambda b: b)
            it = iter(dl)
            drive("torch DataLoader over npy mmap (2 procs)", "peer", it, lambda: None)
            del it, dl
        except Exception as e:  # noqa: BLE001
            note(f"torch DataLoader failed ({type(e).__name__}: {e})")
            traceback.print_exc(limit=3)

    try:
        import grain

        class NpySource:
            def __init__(self):
                self.d = np.load(npy_dir / "data.npy", mmap_mode="r")
                self.l = np.load(npy_dir / "label.npy", mmap_mode="r")

            def __len__(self):
                return n

            def __getitem__(self, i):
                return {"data": np.asarray(self.d[i]), "label": self.l[i]}

        ds = (grain.MapDataset.source(NpySource()).seed(SEED).shuffle().repeat().batch(BATCH)
              .to_iter_dataset(grain.ReadOptions(num_threads=LOADER_WORKERS, prefetch_buffer_size=LOADER_PREFETCH * BATCH)))
        it = iter(ds)
        drive("grain MapDataset over npy mmap (threads)", "peer", it, lambda: None)
    except Exception as e:  # noqa: BLE001
        note(f"grain skipped ({type(e).__name__}: {e})")
    return rows


# --------------------------------------------------------------------------
# (e) every core: each contender against the machine's ceilings
# --------------------------------------------------------------------------

def ceilings(src: np.ndarray, kinds: tuple[str, ...] = ("compress", "decode", "memcpy"),
             threads: tuple[int, ...] | None = None) -> dict[tuple[str, int], float]:
    """{(kind, threads): MiB/s} of zring._zring.ceiling on the records of ``src``
    (one record per first-axis entry); {} with a note if the build has no ceiling."""
    try:
        from zring._zring import ceiling
    except Exception as e:  # noqa: BLE001
        note(f"zring._zring.ceiling unavailable, no ceilings ({type(e).__name__}: {e})")
        return {}
    flat = np.ascontiguousarray(src).reshape(-1)
    item = flat.nbytes // len(src)
    counts = threads or tuple(dict.fromkeys((1, os.cpu_count() or 1)))
    out = {}
    for t in counts:
        for k in kinds:
            out[(k, t)] = ceiling(k, flat, item, t, CEIL_LEVEL)
            print(f"  ceiling {k:<8} {t:2d} thread(s) {out[(k, t)]:9.0f} MiB/s", file=sys.stderr)
    return out


def bench_ceilings(data: Path, mode: str) -> dict:
    """Section (e): ceilings, writes, hot gathers, loaders and loaders with a
    transform, on CEIL_RECORDS[mode] records; returns what e_tables prints."""
    n = CEIL_RECORDS[mode]
    secs = CEIL_SECS[mode]
    ncpu = os.cpu_count() or 1
    arr = make_records(n)
    res: dict = {"n": n, "secs": secs, "ncpu": ncpu, "writes": [], "gathers": [], "loaders": [], "transforms": []}
    print(f"  (e) {n} records ({arr.nbytes / MIB:.0f} MiB), {ncpu} cpus", file=sys.stderr)
    res["ceil"] = ceilings(arr)

    root = data / f"ceil-{DATA_VERSION}-{n}"
    root.mkdir(parents=True, exist_ok=True)
    npy = root / "src.npy"
    if not (root / ".src.complete").exists():
        np.save(npy, arr)
        (root / ".src.complete").write_text(str(n))
    src = np.load(npy, mmap_mode="r")
    if src.shape != arr.shape or not np.array_equal(src[:: max(1, n // 64)], arr[:: max(1, n // 64)]):
        raise AssertionError(f"{npy} does not hold make_records({n}); delete {root}")

    libs = [(kind, lib) for kind, lib in (("zring", _try_import("zring")), ("loaderx", _try_import("loaderx")))
            if lib is not None]
    codecs = ("zstd", "raw")

    # -- writes: 3 runs from the page-cached .npy mapping, each a fresh store;
    # the last one stays as the store the gathers and loaders read.
    stores: dict[tuple[str, str], Path] = {}
    for codec in codecs:
        for kind, lib in libs:
            name = f"{kind} {codec}"
            path = root / f"{kind}_{codec}"
            done = root / f".{kind}_{codec}.complete"
            try:
                if done.exists() and path.exists():
                    runs, reused = json.loads(done.read_text())["runs"], True
                else:
                    runs, reused = [], False
                    for _ in range(CEIL_WRITE_RUNS):
                        rm(path)
                        gc.collect()
                        warm(npy)  # the source is in the page cache
                        c0, t0 = cpu_secs(), time.perf_counter()
                        lib.write_dataset(path, src, codec=codec)  # syncs before it returns
                        wall = time.perf_counter() - t0
                        runs.append((wall, cpu_secs() - c0))
                    done.write_text(json.dumps({"runs": runs}))
                stores[(kind, codec)] = path
                rates = [arr.nbytes / MIB / w for w, _ in runs]
                res["writes"].append({
                    "name": name, "kind": kind, "codec": codec, "runs": len(runs), "reused": reused,
                    "best": max(rates), "median": float(np.median(rates)),
                    "busy": sum(c for _, c in runs) / sum(w for w, _ in runs),
                    "disk": allocated(path)})
                w = res["writes"][-1]
                print(f"  write {name:<14} best {w['best']:7.0f} median {w['median']:7.0f} MiB/s "
                      f"cores {w['busy']:.2f}{' (earlier run)' if reused else ''}", file=sys.stderr)
            except Exception as e:  # noqa: BLE001
                note(f"(e) write {name}: failed ({type(e).__name__}: {e})")
                traceback.print_exc(limit=2)

    # -- hot gathers: the same index sequence for every store.
    batches = index_batches(n, 20_000 if secs > 1 else 5_000)

    def check(idx, got):
        if not np.array_equal(np.asarray(got).reshape(len(idx), -1), arr[idx.astype(np.int64)].reshape(len(idx), -1)):
            raise AssertionError("gathered bytes differ from the source array")

    libmap = dict(libs)
    for (kind, codec), path in stores.items():
        name = f"{kind} {codec}"
        try:
            warm(path)
            g = libmap[kind].Dataset(path).__getitems__
            g(batches[0])  # open costs and first touch
            c0, t0 = cpu_secs(), time.perf_counter()
            row = timed_gather(name, kind, g, batches, secs, check=check)
            busy = (cpu_secs() - c0) / (time.perf_counter() - t0)
            med = pct(row.lat_ms, 50) / 1e3
            res["gathers"].append({"name": name, "kind": kind, "codec": codec, "batches": len(row.lat_ms),
                                   "median": BATCH * RECORD / MIB / med, "per_s": 1 / med, "busy": busy})
            print(f"  gather {name:<14} median {BATCH * RECORD / MIB / med:7.0f} MiB/s {1 / med:7.1f} batches/s "
                  f"cores {busy:.2f}", file=sys.stderr)
            del g
            gc.collect()
        except Exception as e:  # noqa: BLE001
            note(f"(e) gather {name}: failed ({type(e).__name__}: {e})")
            traceback.print_exc(limit=2)

    # -- loaders: only the 'data' stream, consumer does no work.
    def drive(make) -> tuple[int, float, float]:
        dl = make()
        try:
            for _ in range(LOADER_WARMUP):
                next(dl)
            steps = 0
            c0, t0 = cpu_secs(), time.perf_counter()
            while True:
                b = next(dl)
                del b
                steps += 1
                wall = time.perf_counter() - t0
                if wall >= secs:
                    break
            return steps, wall, cpu_secs() - c0
        finally:
            dl.close()
            del dl
            gc.collect()

    def loader(kind, codec, workers, **kw):
        lib = libmap[kind]
        return lambda: lib.DataLoader({"data": lib.Dataset(stores[(kind, codec)])}, num_workers=workers,
                                      batch_size=BATCH, prefetch_size=CEIL_PREFETCH, mode=CEIL_MODE,
                                      seed=CEIL_LOADER_SEED, **kw)

    def measure(out: list, name: str, kind: str, codec: str, workers: int, make, new_arg: str | None = None) -> None:
        """Appends one loader row; ``new_arg`` names a keyword this build may not accept yet (row: n/a)."""
        try:
            warm(stores[(kind, codec)])
            steps, wall, cpu = drive(make)
            out.append({"name": name, "kind": kind, "codec": codec, "workers": workers, "steps": steps,
                        "wall": wall, "per_s": steps / wall, "busy": cpu / wall})
            print(f"  loader {name:<44} {steps / wall:7.1f} batches/s cores {cpu / wall:.2f}", file=sys.stderr)
        except TypeError as e:
            if new_arg is None or new_arg not in str(e):
                note(f"(e) {name}: failed ({type(e).__name__}: {e})")
                traceback.print_exc(limit=2)
                return
            out.append({"name": name, "kind": kind, "codec": codec, "workers": workers, "na": str(e)})
            note(f"(e) {name}: n/a, this DataLoader does not take {new_arg} ({e})")
        except Exception as e:  # noqa: BLE001
            note(f"(e) {name}: failed ({type(e).__name__}: {e})")
            traceback.print_exc(limit=2)

    for codec in codecs:
        for workers in CEIL_LOADER_WORKERS:
            for kind, _ in libs:
                if (kind, codec) in stores:
                    measure(res["loaders"], f"{kind} DataLoader", kind, codec, workers, loader(kind, codec, workers))

    def sleepy(batch):
        time.sleep(CEIL_TRANSFORM_SLEEP)  # releases the GIL
        return batch

    codec, workers = "zstd", CEIL_TRANSFORM_WORKERS
    variants = [("zring DataLoader (transform workers: default)", "zring", {}),
                ("zring DataLoader, transform_workers=0", "zring", {"transform_workers": 0}),
                ("loaderx DataLoader", "loaderx", {})]
    for name, kind, kw in variants:
        if (kind, codec) in stores:
            measure(res["transforms"], name, kind, codec, workers, loader(kind, codec, workers, transform=sleepy, **kw),
                    new_arg=next(iter(kw), None))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data and short rounds (~3 minutes)")
    ap.add_argument("--cold-gib", type=float, default=None, help="cold store size in GiB (0 skips the cold table)")
    ap.add_argument("--data", type=Path, default=None, help="data directory (default $ZRING_BENCH_DIR/compare)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results")
    ap.add_argument("--only", default="abcde", help="sections to run, e.g. 'bd'")
    args = ap.parse_args()
    mode = "quick" if args.quick else "full"
    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "compare"
    data.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cold_gib = COLD_GIB[mode] if args.cold_gib is None else args.cold_gib
    started = time.perf_counter()

    n = int(HOT_MIB[mode] * MIB / RECORD)
    print(f"compare ({mode}): {n} records ({HOT_MIB[mode]} MiB) in {data}", file=sys.stderr)
    md = [f"## zring vs loaderx vs peers ({mode} run)\n", f"Machine: {machine()}.\n", f"Versions: {versions()}.\n"]
    hot = cold = load = []
    if "a" in args.only:
        print("(a) sampler", file=sys.stderr)
        md.append(sampler_table(bench_sampler()))
    arr = make_records(n) if set(args.only) & set("bd") else None
    if "b" in args.only:
        print("(b) hot gather", file=sys.stderr)
        ncpu = os.cpu_count() or 1
        cb = ceilings(arr, kinds=("decode", "memcpy"), threads=(ncpu,))
        hot = bench_hot(arr, data, GATHER_SECS[mode])
        md.append(gather_table(hot, f"(b) Hot gather: {n} × 12 KiB records ({HOT_MIB[mode]} MiB), {BATCH} random "
                                    f"indices per batch, same sequence for all", hot=True,
                               ceil={k: cb.get((k, ncpu)) for k in ("decode", "memcpy")}))
        if cb:
            md.append(f"× ceiling: gather MiB/s ÷ what {ncpu} threads do on these records with no I/O "
                      f"(`zring._zring.ceiling`): zstd level {CEIL_LEVEL} decode ({cb[('decode', ncpu)]:.0f} MiB/s, "
                      f"without a dictionary) for zstd and zstd_dict, memcpy ({cb[('memcpy', ncpu)]:.0f} MiB/s) "
                      f"for raw; each 1 run of ≥ 0.5 s.\n")
    if "c" in args.only and cold_gib > 0:
        print("(c) cold gather", file=sys.stderr)
        cold, how = bench_cold(data, cold_gib, mode)
        md.append(gather_table(cold, f"(c) Cold gather: {how}", hot=False))
        fio = [r for r in cold if r.kind == "ceiling"]
        if fio:
            md.append(f"fio ceiling command (run right after the same eviction): `{fio[0].extra['cmd']}`; "
                      f"its latency columns are per single 12 KiB read, its batches/s is IOPS ÷ 256.\n")
        md.append("`disk served` is the delta of sectors read in /sys/block/*/stat around each timed batch "
                  "(whole machine, so other activity can add to it).\n")
    if "d" in args.only:
        print("(d) loader", file=sys.stderr)
        load = bench_loader(arr, data, LOADER_STEPS[mode])
        md.append(loader_table(load, LOADER_STEPS[mode]))
    if "e" in args.only:
        print("(e) every core: ceilings", file=sys.stderr)
        md.append(e_tables(bench_ceilings(data, mode)))
    made = plots(args.out, hot, cold, load)
    if made:
        md.append("Plots: " + ", ".join(f"`{m}`" for m in made) + ".\n")
    if notes:
        md.append("Notes:\n\n" + "\n".join(f"- {x}" for x in notes) + "\n")
    md.append(f"Total run time {time.perf_counter() - started:.0f} s. Command: "
              f"`python benches/compare.py{' --quick' if args.quick else ''}"
              f"{'' if args.cold_gib is None else f' --cold-gib {args.cold_gib:g}'}"
              f"{'' if args.only == ap.get_default('only') else f' --only {args.only}'}`.\n")
    text = "\n".join(md)
    # Section (e) alone has its own page, so that it does not replace the peers' tables.
    common.write_result(args.out / ("cores.md" if set(args.only) == {"e"} else "compare.md"), text)
    print(text)


if __name__ == "__main__":
    main()
