"""Small one-contender-per-process benchmarks, for A/B runs that alternate
zring and loaderx in separate processes (no shared warm-up or ordering bias).

    python benches/ab.py setup DIR                 # 20,000 tiles, stored by both libraries, every codec
    python benches/ab.py hot DIR LIB CODEC [ROUNDS] # random 256 × 12 KiB gathers, warmed
    python benches/ab.py loader DIR LIB CODEC [STEPS] [WORKERS]
    python benches/ab.py cold STORE [ROUNDS]       # zring only: gathers right after evicting STORE
    python benches/ab.py once STORE                # one cold 256-record gather (for strace -f -c)

LIB is zring, loaderx or npy (hot only). Each run prints one line.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

import numpy as np

N, B = 20_000, 256


def tiles(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    y = np.arange(64, dtype=np.uint16)[:, None]
    x = np.arange(64, dtype=np.uint16)[None, :]
    out = np.empty((n, 3, 64, 64), np.uint8)
    for i in range(n):
        base = (x * (1 + i % 3) + y * (1 + i % 5) + i) % 256
        for c in range(3):
            out[i, c] = (base + c * 40 + rng.integers(0, 6, (64, 64))).astype(np.uint8)
    return out


def evict(store: str) -> None:
    for f in os.listdir(store):
        fd = os.open(os.path.join(store, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "setup":
        d = argv[1]
        os.makedirs(d, exist_ok=True)
        a = tiles(N)
        np.save(f"{d}/a.npy", a)
        for lib in ("zring", "loaderx"):
            m = importlib.import_module(lib)
            for codec in ("raw", "zstd", "zstd_dict"):
                m.write_dataset(f"{d}/{lib}-{codec}", a, codec=codec)
            m.write_dataset(f"{d}/{lib}-label", (np.arange(N) % 1000).astype(np.int64), codec="raw")
        return
    if cmd == "hot":
        d, lib, codec = argv[1:4]
        rounds = int(argv[4]) if len(argv) > 4 else 300
        if lib == "npy":
            a = np.load(f"{d}/a.npy", mmap_mode="r")
            f = lambda i: a[i]  # noqa: E731
        else:
            z = importlib.import_module(lib).Zrecord(f"{d}/{lib}-{codec}")
            dst = np.empty((B, 3, 64, 64), np.uint8)
            f = lambda i: z.gather(i, dst, 12288)  # noqa: E731
        idx = [np.random.default_rng(s).integers(0, N, B).astype(np.uint64) for s in range(rounds)]
        for i in idx:
            f(i)
        ts = []
        t0 = time.perf_counter()
        for i in idx:
            t = time.perf_counter()
            f(i)
            ts.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        ms = np.array(ts) * 1e3
        print(f"{lib}-{codec} {B * 12288 * rounds / wall / 2**30:.2f} GiB/s p50 {np.median(ms):.3f} ms "
              f"p99 {np.quantile(ms, .99):.3f} ms")
    elif cmd == "loader":
        d, lib, codec = argv[1:4]
        steps = int(argv[4]) if len(argv) > 4 else 1000
        workers = int(argv[5]) if len(argv) > 5 else 4
        m = importlib.import_module(lib)
        dl = m.DataLoader({"data": m.Dataset(f"{d}/{lib}-{codec}"), "label": m.Dataset(f"{d}/{lib}-label")},
                          batch_size=B, num_workers=workers, prefetch_size=4, mode=1, seed=0)
        it = iter(dl)
        for _ in range(30):
            next(it)
        ws = []
        t0 = time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            next(it)
            ws.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        ms = np.array(ws) * 1e3
        print(f"{lib}-{codec} {steps / wall:.0f} batches/s wait p50 {np.median(ms):.3f} ms p99 {np.quantile(ms, .99):.3f} ms")
        os._exit(0)  # loaderx's daemon threads would otherwise delay exit
    elif cmd in ("cold", "once"):
        store = argv[1]
        rounds = 1 if cmd == "once" else (int(argv[2]) if len(argv) > 2 else 200)
        import zring

        z = zring.Zrecord(store, readonly=True)
        dst = np.empty((B, 12288), np.uint8)
        rng = np.random.default_rng(1)
        batches = [rng.integers(0, len(z), B).astype(np.uint64) for _ in range(rounds)]
        evict(store)
        t0 = time.perf_counter()
        for i in batches:
            z.gather(i, dst, 12288)
        wall = time.perf_counter() - t0
        print(f"cold {B * rounds / wall:.0f} records/s {B * rounds * 12288 / wall / 2**20:.0f} MiB/s "
              f"(direct={z.stats()['direct']})")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
