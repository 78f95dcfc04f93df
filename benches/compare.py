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
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import struct
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (the benches' shared helpers)
from common import REPO, fio_randread, note, notes, proc_read_bytes  # noqa: E402

# Fixed inputs.
RECORD_SHAPE = (3, 64, 64)  # uint8 image tile, 12 KiB
RECORD = int(np.prod(RECORD_SHAPE))
BATCH = 256
SEED = 7
SAMPLER_LENGTH = 1_000_000
SAMPLER_BATCHES = (256, 1024, 8192)
SAMPLER_SECS = 0.15
HOT_MIB = {"quick": 64, "full": 1024}
GATHER_SECS = {"quick": 0.6, "full": 3.0}
GATHER_MIN_BATCHES = 3
COLD_GIB = {"quick": 1.0, "full": 5.0}
COLD_ROUNDS = {"quick": 4, "full": 12}
COLD_BATCHES_PER_ROUND = 6
LOADER_STEPS = {"quick": 60, "full": 400}
LOADER_WARMUP = 5
LOADER_WORKERS = 2
LOADER_PREFETCH = 4
FIO_SECS = {"quick": 4, "full": 15}
# (e) every core
CEIL_RECORDS = {"quick": 5_000, "full": 20_000}
CEIL_SECS = {"quick": 1.0, "full": 3.0}  # per gather / loader measurement
CEIL_WRITE_RUNS = 3
CEIL_LOADER_WORKERS = (4, 2)
CEIL_TRANSFORM_WORKERS = 4
CEIL_TRANSFORM_SLEEP = 0.004  # the GIL-releasing transform: time.sleep, then the batch unchanged
CEIL_PREFETCH = 4
CEIL_MODE = 1
CEIL_LOADER_SEED = 42
CEIL_LEVEL = 3  # zstd level of the compress and decode ceilings (zring's and loaderx's default)

MIB = 1 << 20
# Bumped whenever make_records changes, so stored data from older runs is not reused.
DATA_VERSION = 2


# --------------------------------------------------------------------------
# data, measurement helpers
# --------------------------------------------------------------------------

def make_records(n: int) -> np.ndarray:
    """n deterministic (3, 64, 64) uint8 tiles: smooth per-record gradients
    (slope, phase and a per-channel offset vary) plus 2 bits of noise, so
    zstd shrinks them about 1.4x (the formula of fill_record in
    benches/src/lib.rs, with numpy's generator)."""
    out = np.empty((n, *RECORD_SHAPE), dtype=np.uint8)
    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:64, 0:64].astype(np.uint32)
    for s in range(0, n, 2048):
        e = min(n, s + 2048)
        k = e - s
        gx = rng.integers(1, 6, size=(k, 1, 1, 1), dtype=np.uint32)
        gy = rng.integers(1, 6, size=(k, 1, 1, 1), dtype=np.uint32)
        phase = rng.integers(0, 256, size=(k, 1, 1, 1), dtype=np.uint32)
        plane = (np.arange(3, dtype=np.uint32) * 50).reshape(1, 3, 1, 1)
        noise = rng.integers(0, 4, size=(k, *RECORD_SHAPE), dtype=np.uint32)
        out[s:e] = ((gx * x + gy * y) // 8 + phase + plane + noise) & 0xFF
    return out


def index_batches(n: int, count: int, batch: int = BATCH, seed: int = SEED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, size=batch, dtype=np.uint64) for _ in range(count)]


def allocated(path: Path) -> int:
    """Bytes allocated on disk (st_blocks * 512) under path."""
    if path.is_file():
        return os.stat(path).st_blocks * 512
    return sum(os.stat(p).st_blocks * 512 for p in path.rglob("*") if p.is_file())


def rm(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def evict(paths: list[Path]) -> str:
    """fdatasync + posix_fadvise(DONTNEED) on every file, then drop_caches as root."""
    n = 0
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in files:
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    dropped = False
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            dropped = True
        except OSError:
            pass
    return f"fadvise DONTNEED on {n} files" + (" + drop_caches" if dropped else " (drop_caches not permitted)")


def block_read_bytes() -> int:
    total = 0
    for dev in Path("/sys/block").iterdir():
        if dev.name.startswith(("loop", "ram", "zram")):
            continue
        try:
            total += int((dev / "stat").read_text().split()[2]) * 512
        except (OSError, IndexError, ValueError):
            pass
    return total


def pct(lat: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(lat), q)) if lat else float("nan")


class Row:
    def __init__(self, name: str, kind: str, lat_s: list[float], nbytes: int, records: int, secs: float, **extra):
        self.name, self.kind = name, kind
        self.lat_ms = [v * 1e3 for v in lat_s]
        self.nbytes, self.records, self.secs = nbytes, records, secs
        self.extra = extra
        # The process's CPU-seconds (every thread) over the timed work, when measured.
        self.cpu_s: float | None = extra.pop("cpu_s", None)

    def cpu_per_gib(self) -> str:
        """CPU-seconds per GiB delivered, as shown ("-" when not measured)."""
        if self.cpu_s is None or not self.nbytes:
            return "-"
        return f"{self.cpu_s / (self.nbytes / (1 << 30)):.2f}"

    @property
    def mib_s(self) -> float:
        return self.nbytes / MIB / self.secs if self.secs > 0 else 0.0

    @property
    def per_s(self) -> float:
        return len(self.lat_ms) / self.secs if self.secs > 0 else 0.0


def timed_gather(name: str, kind: str, fn, batches: list[np.ndarray], budget: float, check=None, **extra) -> Row:
    """Calls fn(idx) on batches until `budget` seconds of gathering are spent."""
    first = fn(batches[0])
    if check is not None:
        check(batches[0], first)
    lat = []
    busy = 0.0
    c0 = cpu_secs()
    for idx in batches[1:]:
        t = time.perf_counter()
        fn(idx)
        d = time.perf_counter() - t
        lat.append(d)
        busy += d
        if busy >= budget and len(lat) >= GATHER_MIN_BATCHES:
            break
    extra.setdefault("cpu_s", cpu_secs() - c0)
    return Row(name, kind, lat, len(lat) * BATCH * RECORD, len(lat) * BATCH, busy, **extra)


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


def _try_import(name: str):
    try:
        return __import__(name)
    except Exception as e:  # noqa: BLE001
        note(f"{name} not importable: {e}")
        return None


# --------------------------------------------------------------------------
# (b) stores: writers and gatherers
# --------------------------------------------------------------------------

def contenders(arr: np.ndarray):
    """(name, kind, write(path), open(path) -> gather(idx) -> ndarray) for every contender."""
    n = len(arr)
    out = []
    zring = _try_import("zring")
    loaderx = _try_import("loaderx")
    for codec in ("raw", "zstd", "zstd_dict"):
        if zring is not None:
            out.append((f"zring {codec}", "zring",
                        lambda p, c=codec: zring.write_dataset(p, arr, codec=c),
                        lambda p: zring.Dataset(p).__getitems__))
        if loaderx is not None:
            out.append((f"loaderx {codec}", "loaderx",
                        lambda p, c=codec: loaderx.write_dataset(p, arr, codec=c),
                        lambda p: loaderx.Dataset(p).__getitems__))

    def npy_write(p):
        p.mkdir(parents=True, exist_ok=True)
        np.save(p / "data.npy", arr)

    def npy_open(p):
        m = np.load(p / "data.npy", mmap_mode="r")
        return lambda idx: m[idx.astype(np.int64)]
    out.append(("npy mmap fancy-index", "peer", npy_write, npy_open))

    try:
        import lmdb

        def lmdb_write(p):
            env = lmdb.open(str(p), map_size=max(1 << 30, 4 * arr.nbytes), subdir=True, lock=False)
            with env.begin(write=True) as txn:
                for i in range(n):
                    txn.put(struct.pack(">Q", i), arr[i].tobytes(), append=True)
            env.sync()
            env.close()

        def lmdb_open(p):
            env = lmdb.open(str(p), readonly=True, lock=False, subdir=True)

            def g(idx):
                out = np.empty((len(idx), *RECORD_SHAPE), dtype=np.uint8)
                flat = out.reshape(len(idx), -1)
                with env.begin(buffers=True) as txn:
                    for k, i in enumerate(idx.tolist()):
                        flat[k] = np.frombuffer(txn.get(struct.pack(">Q", i)), dtype=np.uint8)
                return out
            return g
        out.append(("lmdb", "peer", lmdb_write, lmdb_open))
    except Exception as e:  # noqa: BLE001
        note(f"lmdb skipped: {e}")

    try:
        import h5py

        def h5_write(p):
            p.mkdir(parents=True, exist_ok=True)
            with h5py.File(p / "data.h5", "w") as f:
                f.create_dataset("data", data=arr, chunks=(1, *RECORD_SHAPE))

        def h5_open(p):
            ds = h5py.File(p / "data.h5", "r")["data"]

            def g(idx):
                # h5py wants increasing unique indices: read those, then reorder.
                u, inv = np.unique(idx, return_inverse=True)
                return ds[u][inv]
            return g
        out.append(("h5py (chunk = 1 record)", "peer", h5_write, h5_open))
    except Exception as e:  # noqa: BLE001
        note(f"h5py skipped: {e}")

    try:
        import zarr

        def zarr_write(p):
            z = zarr.create_array(store=str(p), shape=arr.shape, dtype=arr.dtype,
                                  chunks=(1, *RECORD_SHAPE), shards=(512, *RECORD_SHAPE), overwrite=True)
            z[:] = arr

        def zarr_open(p):
            z = zarr.open_array(str(p), mode="r")
            return lambda idx: z.oindex[idx.astype(np.int64)]
        out.append(("zarr v3 (sharded, zstd)", "peer", zarr_write, zarr_open))
        try:
            import tensorstore as ts

            def ts_open(p, zp=None):
                t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(p)}}, read=True).result()
                return lambda idx: t[idx.astype(np.int64)].read().result()
            out.append(("tensorstore (same zarr v3)", "peer", zarr_write, ts_open))
        except Exception as e:  # noqa: BLE001
            note(f"tensorstore skipped: {e}")
    except Exception as e:  # noqa: BLE001
        note(f"zarr skipped: {e}")

    try:
        import blosc2

        def b2_write(p):
            p.mkdir(parents=True, exist_ok=True)
            blosc2.asarray(arr, urlpath=str(p / "data.b2nd"), mode="w", chunks=(64, *RECORD_SHAPE),
                           blocks=(1, *RECORD_SHAPE))

        def b2_open(p):
            b = blosc2.open(str(p / "data.b2nd"), mode="r")

            def g(idx):
                out = np.empty((len(idx), *RECORD_SHAPE), dtype=np.uint8)
                for k, i in enumerate(idx.tolist()):
                    out[k] = b[i]
                return out
            return g
        out.append(("blosc2 (per-record reads)", "peer", b2_write, b2_open))
    except Exception as e:  # noqa: BLE001
        note(f"blosc2 skipped: {e}")

    try:
        from array_record.python import array_record_module as arm

        def ar_write(p):
            p.mkdir(parents=True, exist_ok=True)
            w = arm.ArrayRecordWriter(str(p / "data.array_record"), "group_size:1")
            for i in range(n):
                w.write(arr[i].tobytes())
            w.close()

        def ar_open(p):
            r = arm.ArrayRecordReader(str(p / "data.array_record"), "readahead_buffer_size:0")

            def g(idx):
                recs = r.read(idx.astype(np.int64).tolist())
                return np.frombuffer(b"".join(recs), dtype=np.uint8).reshape(len(idx), *RECORD_SHAPE)
            return g
        out.append(("array_record (group_size 1)", "peer", ar_write, ar_open))
    except Exception as e:  # noqa: BLE001
        note(f"array_record skipped: {e}")

    try:
        import lance
        import pyarrow as pa

        def lance_write(p):
            flat = arr.reshape(n, -1)
            col = pa.FixedSizeBinaryArray.from_buffers(pa.binary(RECORD), n, [None, pa.py_buffer(flat)])
            lance.write_dataset(pa.table({"data": col}), str(p), mode="overwrite")

        def lance_open(p):
            d = lance.dataset(str(p))

            def g(idx):
                t = d.take(idx.astype(np.int64), columns=["data"])
                buf = t.column("data").combine_chunks().buffers()[1]
                return np.frombuffer(buf, dtype=np.uint8, count=len(idx) * RECORD).reshape(len(idx), *RECORD_SHAPE)
            return g
        out.append(("lance (pylance take)", "peer", lance_write, lance_open))
    except Exception as e:  # noqa: BLE001
        note(f"lance skipped: {e}")
    return out


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def warm(path: Path) -> None:
    """Reads every file under ``path`` once, so its pages are in the page cache."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


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

def cpu_secs() -> float:
    """CPU seconds this process (all its threads) has used, user + system
    (getrusage: microseconds, where os.times counts clock ticks)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


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


def e_tables(res: dict) -> str:
    n, ncpu, ceil = res["n"], res["ncpu"], res["ceil"]
    threads = tuple(dict.fromkeys((1, ncpu)))
    mib = n * RECORD / MIB
    s = [f"### (e) Every core: each contender against the machine's ceilings\n",
         f"{n} × 12 KiB records ({mib:.0f} MiB), {ncpu} cpus. *Cores busy* is the process's CPU time "
         f"(user + system, all threads, `os.times()`) ÷ wall time over the measurement.\n"]

    def c(kind):
        return ceil.get((kind, ncpu))

    # ceilings
    s += ["**Ceilings** (MiB/s of record bytes; each figure 1 run of ≥ 0.5 s of repeated passes)\n",
          "| ceiling | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads) + " | scaling |",
          "|---|" + "---:|" * (len(threads) + 1)]
    labels = {"compress": f"zstd level {CEIL_LEVEL} compress", "decode": f"zstd level {CEIL_LEVEL} decode",
              "memcpy": "memcpy"}
    for k, label in labels.items():
        if (k, 1) not in ceil:
            s.append(f"| {label} | " + " | ".join("n/a" for _ in threads) + " | - |")
            continue
        s.append(f"| {label} | " + " | ".join(f"{ceil[(k, t)]:.0f}" for t in threads) +
                 f" | {ratio(ceil[(k, threads[-1])], ceil[(k, 1)])} |")
    s.append("")

    # writes
    lxw = {w["codec"]: w["median"] for w in res["writes"] if w["kind"] == "loaderx"}
    s += [f"**write_dataset** from a `.npy` mapped with `mmap_mode=\"r\"` (in the page cache), each run a fresh "
          f"store, including the sync write_dataset does before it returns\n",
          "| writer | runs | best MiB/s | median MiB/s | cores busy | × loaderx (median) | × ceiling (median) | on disk MiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in res["writes"]:
        base = c("compress") if w["codec"] == "zstd" else c("memcpy")
        tag = f"{w['name']}{' (earlier run)' if w['reused'] else ''}"
        s.append(f"| {tag} | {w['runs']} | {w['best']:.0f} | {w['median']:.0f} | {w['busy']:.2f} | "
                 f"{ratio(w['median'], lxw.get(w['codec']))} | {ratio(w['median'], base)} | {w['disk'] / MIB:.0f} |")
    s.append("")

    # gathers
    lxg = {g["codec"]: g["median"] for g in res["gathers"] if g["kind"] == "loaderx"}
    s += [f"**Hot gather** (store read once into the page cache), `Dataset(p).__getitems__` of {BATCH} random indices, "
          f"the same sequence for all; MiB/s and batches/s are the median over the batches timed "
          f"(~{res['secs']:g} s each)\n",
          "| gatherer | batches timed | median MiB/s | median batches/s | cores busy | × loaderx | × ceiling |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for g in res["gathers"]:
        base = c("decode") if g["codec"] == "zstd" else c("memcpy")
        s.append(f"| {g['name']} | {g['batches']} | {g['median']:.0f} | {g['per_s']:.1f} | {g['busy']:.2f} | "
                 f"{ratio(g['median'], lxg.get(g['codec']))} | {ratio(g['median'], base)} |")
    s.append("")

    # loaders
    bare = {(g["kind"], g["codec"]): g["per_s"] for g in res["gathers"]}
    lxl = {(r["codec"], r["workers"]): r["per_s"] for r in res["loaders"] if r["kind"] == "loaderx" and "na" not in r}
    s += [f"**DataLoader** end to end: 'data' only, batch {BATCH}, prefetch {CEIL_PREFETCH}, mode {CEIL_MODE}, "
          f"{LOADER_WARMUP} warm-up steps, then 1 run of ~{res['secs']:g} s; the consumer does no work\n",
          "| loader | data | workers | steps timed | batches/s | MiB/s | cores busy | × loaderx | × bare gather |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["loaders"]:
        if "na" in r:
            s.append(f"| {r['name']} | {r['codec']} | {r['workers']} | n/a | n/a | n/a | n/a | - | - |")
            continue
        s.append(f"| {r['name']} | {r['codec']} | {r['workers']} | {r['steps']} | {r['per_s']:.1f} | "
                 f"{r['per_s'] * BATCH * RECORD / MIB:.0f} | {r['busy']:.2f} | "
                 f"{ratio(r['per_s'], lxl.get((r['codec'], r['workers'])))} | "
                 f"{ratio(r['per_s'], bare.get((r['kind'], r['codec'])))} |")
    s.append("")

    # transforms
    if res["transforms"]:
        lxt = next((r["per_s"] for r in res["transforms"] if r["kind"] == "loaderx" and "na" not in r), None)
        plain = {(r["kind"], r["codec"], r["workers"]): r["per_s"] for r in res["loaders"] if "na" not in r}
        s += [f"**DataLoader with a {CEIL_TRANSFORM_SLEEP * 1e3:g} ms GIL-releasing transform** (`time.sleep`, then "
              f"the batch unchanged), {CEIL_TRANSFORM_WORKERS} workers, same settings; run one at a time the "
              f"transform alone caps a loader at {1 / CEIL_TRANSFORM_SLEEP:.0f} batches/s\n",
              "| loader | data | steps timed | batches/s | cores busy | × loaderx | × same loader without transform |",
              "|---|---|---:|---:|---:|---:|---:|"]
        for r in res["transforms"]:
            if "na" in r:
                s.append(f"| {r['name']} | {r['codec']} | n/a | n/a | n/a | n/a | n/a |")
                continue
            s.append(f"| {r['name']} | {r['codec']} | {r['steps']} | {r['per_s']:.1f} | {r['busy']:.2f} | "
                     f"{ratio(r['per_s'], lxt)} | "
                     f"{ratio(r['per_s'], plain.get((r['kind'], r['codec'], r['workers'])))} |")
        s.append("")

    s.append(f"Ceilings (`zring._zring.ceiling`, the same records, no I/O, no index, no checksum): *compress* is "
             f"{ncpu} threads each zstd-compressing (level {CEIL_LEVEL}) its share of the records one record at a "
             f"time; *decode* is {ncpu} threads decoding those frames; *memcpy* is {ncpu} threads copying each "
             f"record into its slot of another buffer. × ceiling divides by the {ncpu}-thread figure: compress for "
             f"zstd writes, decode for zstd gathers, memcpy for raw writes and gathers; × bare gather divides a "
             f"loader's batches/s by the median batches/s of its own library's hot gather above.\n")
    return "\n".join(s) + "\n"


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

def ratio(v: float, base: float | None) -> str:
    return f"{v / base:.2f}" if base else "-"


def gather_table(rows: list[Row], title: str, hot: bool, ceil: dict[str, float | None] | None = None) -> str:
    """``ceil`` ({"decode": MiB/s, "memcpy": MiB/s}) adds a "× ceiling" column to zring and loaderx rows."""
    lx = {r.name.split()[-1]: r.mib_s for r in rows if r.kind == "loaderx"}
    peers = [r for r in rows if r.kind == "peer"]
    best = max(peers, key=lambda r: r.mib_s) if peers else None
    s = [f"### {title}\n"]
    if best:
        s.append(f"Best peer: **{best.name}** ({best.mib_s:.0f} MiB/s).\n")
    head = "| contender | gather MiB/s | batches/s | × loaderx | × best peer |"
    sep = "|---|---:|---:|---:|---:|"
    if ceil is not None:
        head += " × ceiling |"
        sep += "---:|"
    head += " CPU-s per GiB | p50 ms | p99 ms | p99.9 ms |"
    sep += "---:|---:|---:|---:|"
    if hot:
        head += " write MiB/s | on disk MiB | size ratio |"
        sep += "---:|---:|---:|"
    else:
        head += " disk served MiB | disk / delivered |"
        sep += "---:|---:|"
    s += [head, sep]
    for r in rows:
        codec = r.name.split()[-1] if r.kind in ("zring", "loaderx") else "raw"
        base = lx.get(codec)
        if r.kind == "ceiling":
            s.append(f"| {r.name} | {r.mib_s:.0f} | {r.extra['iops'] / BATCH:.0f} (÷256) | {ratio(r.mib_s, base)} | "
                     f"{ratio(r.mib_s, best.mib_s if best else None)} | - | per 12k read: {r.extra['clat_p50_ms']:.3f} | "
                     f"{r.extra['clat_p99_ms']:.3f} | {r.extra['clat_p999_ms']:.3f} | - | - |")
            continue
        line = f"| {r.name} | {r.mib_s:.0f} | {r.per_s:.0f} | {ratio(r.mib_s, base)} | {ratio(r.mib_s, best.mib_s if best else None)} |"
        if ceil is not None:
            top = ceil.get("memcpy" if codec == "raw" else "decode") if r.kind in ("zring", "loaderx") else None
            line += f" {ratio(r.mib_s, top)} |"
        line += f" {r.cpu_per_gib()} | {pct(r.lat_ms, 50):.3f} | {pct(r.lat_ms, 99):.3f} | {pct(r.lat_ms, 99.9):.3f} |"
        if hot:
            line += f" {r.extra['write_mib_s']:.0f} | {r.extra['disk'] / MIB:.0f} | {r.extra['ratio']:.2f} |"
        else:
            line += f" {r.extra['disk'] / MIB:.0f} | {r.extra['disk'] / max(r.nbytes, 1):.2f} |"
        s.append(line)
    return "\n".join(s) + "\n"


def loader_table(rows: list[Row], steps: int) -> str:
    lx = {r.name.split()[-1]: r.per_s for r in rows if r.kind == "loaderx"}
    peers = [r for r in rows if r.kind == "peer"]
    best = max(peers, key=lambda r: r.per_s) if peers else None
    s = [f"### (d) Loader end to end: batch {BATCH}, 'data' 12 KiB + 'label' int64, {LOADER_WORKERS} workers, "
         f"prefetch {LOADER_PREFETCH}, {steps} steps after {LOADER_WARMUP} warm-up, consumer does no work\n"]
    if best:
        s.append(f"Best peer: **{best.name}** ({best.per_s:.1f} batches/s).\n")
    s += ["| loader | batches/s | MiB/s | × loaderx | × best peer | CPU-s per GiB | wait p50 ms | wait p99 ms "
          "| wait p99.9 ms |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        codec = r.name.split()[-1] if r.kind in ("zring", "loaderx") else "raw"
        s.append(f"| {r.name} | {r.per_s:.1f} | {r.mib_s:.0f} | {ratio(r.per_s, lx.get(codec))} | "
                 f"{ratio(r.per_s, best.per_s if best else None)} | {r.cpu_per_gib()} | {pct(r.lat_ms, 50):.3f} | {pct(r.lat_ms, 99):.3f} | "
                 f"{pct(r.lat_ms, 99.9):.3f} |")
    return "\n".join(s) + "\n"


def sampler_table(rows: list[dict]) -> str:
    names = []
    for r in rows:
        for k in r:
            if k not in ("mode", "batch") and k not in names:
                names.append(k)
    s = ["### (a) Sampler: ns per index (lower is better)\n",
         "| mode | batch | " + " | ".join(names) + " | zring × loaderx (speed-up) | zring × numpy |",
         "|---|---:|" + "---:|" * (len(names) + 2)]
    for r in rows:
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in names]
        z, lx = r.get("zring.Sampler"), r.get("loaderx Sampler")
        npk = [k for k in r if k.startswith("numpy")]
        npv = r[npk[0]] if npk else None
        s.append(f"| {r['mode']} | {r['batch']} | " + " | ".join(cells) +
                 f" | {lx / z if z and lx else float('nan'):.2f} | {npv / z if z and npv else float('nan'):.2f} |")
    return "\n".join(s) + "\n"


def plots(out: Path, hot: list[Row], cold: list[Row], load: list[Row]) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        note(f"matplotlib unavailable, no plots: {e}")
        return []
    made = []
    colors = {"zring": "tab:blue", "loaderx": "tab:orange", "peer": "tab:gray", "ceiling": "tab:green"}

    def bars(rows, value, label, fname, title):
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
        ax.barh([r.name for r in rows], [value(r) for r in rows], color=[colors[r.kind] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)

    def cdf(rows, fname, title, xlabel):
        rows = [r for r in rows if r.lat_ms]
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(9, 5))
        for r in rows:
            v = np.sort(np.asarray(r.lat_ms))
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=r.name,
                    linestyle="-" if r.kind == "zring" else ("--" if r.kind == "loaderx" else ":"))
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of batches")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)

    bars(hot, lambda r: r.mib_s, "gather MiB/s (higher is better)", "hot_throughput.png", "Hot gather, 256 × 12 KiB random")
    cdf(hot, "hot_latency_cdf.png", "Hot gather latency per batch", "ms per batch (log)")
    bars(cold, lambda r: r.mib_s, "gather MiB/s (higher is better)", "cold_throughput.png", "Cold gather, cache emptied per round")
    cdf(cold, "cold_latency_cdf.png", "Cold gather latency per batch", "ms per batch (log)")
    bars(load, lambda r: r.per_s, "batches/s (higher is better)", "loader_throughput.png", "Loader end to end, batch 256")
    cdf(load, "loader_wait_cdf.png", "Loader: consumer wait per step", "ms waited in next() (log)")
    return made


def machine() -> str:
    return common.machine(REPO, f", numpy {np.__version__}")


def versions() -> str:
    return common.versions(
        ("zring", "loaderx", "lmdb", "h5py", "zarr", "tensorstore", "blosc2", "array_record", "grain", "lance", "torch"),
        {"array_record": "array-record", "lance": "pylance"},
    )


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
