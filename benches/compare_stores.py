"""The fixed inputs, data and measurement helpers and every contender's writer
and gatherer, for benches/compare.py (and the benches that use its records).

compare.py re-exports what other benches take from it (make_records, warm, rm,
index_batches, allocated), so ``import compare`` keeps working for them.
"""

from __future__ import annotations

import os
import resource
import shutil
import struct
import time
from pathlib import Path

import numpy as np

from common import note

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


def cpu_secs() -> float:
    """CPU seconds this process (all its threads) has used, user + system
    (getrusage: microseconds, where os.times counts clock ticks)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


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
