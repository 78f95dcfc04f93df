"""The main job of the README's first command.

Writes a sample dataset (generated 12 KiB image tiles plus labels, several
hundred MiB), streams it through zring's DataLoader the way a training loop
would, and prints throughput and the consumer's wait per step as a latency
histogram. The dataset goes to $ZRING_DEMO_DIR (default ./bench-data/demo).
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import numpy as np

import zring

RECORDS = int(os.environ.get("ZRING_DEMO_RECORDS", "40000"))  # 40,000 x 12 KiB = 469 MiB
SHAPE = (3, 64, 64)
BATCH = 256
STEPS = int(os.environ.get("ZRING_DEMO_STEPS", "2000"))
WARMUP = 50


def tiles(start: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth gradients plus a little noise: compressible the way image tiles are."""
    y = np.arange(64, dtype=np.uint16)[:, None]
    x = np.arange(64, dtype=np.uint16)[None, :]
    out = np.empty((count, *SHAPE), dtype=np.uint8)
    for k in range(count):
        i = start + k
        base = (x * (1 + i % 3) + y * (1 + i % 5) + i) % 256
        for c in range(3):
            out[k, c] = (base + c * 40 + rng.integers(0, 6, size=(64, 64))).astype(np.uint8)
    return out


def main() -> int:
    root = os.environ.get("ZRING_DEMO_DIR", os.path.join("bench-data", "demo"))
    data_path = os.path.join(root, "data.zr")
    label_path = os.path.join(root, "label.zr")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)

    rng = np.random.default_rng(0)
    print(f"writing {RECORDS} tiles of {SHAPE} uint8 ({RECORDS * 12288 / 2**20:.0f} MiB) to {root}")
    npy = os.path.join(root, "tiles.npy")
    arr = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(RECORDS, *SHAPE))
    for s in range(0, RECORDS, 4096):
        n = min(4096, RECORDS - s)
        arr[s : s + n] = tiles(s, n, rng)
    arr.flush()
    del arr
    t0 = time.perf_counter()
    zring.write_dataset(data_path, np.load(npy, mmap_mode="r"), codec="zstd")
    write_s = time.perf_counter() - t0
    zring.write_dataset(label_path, (np.arange(RECORDS) % 1000).astype(np.int64), codec="raw")
    os.remove(npy)
    st = zring.Zrecord(data_path).stats()
    print(
        f"wrote {st['records']} records in {write_s:.1f} s ({RECORDS * 12288 / 2**20 / write_s:.0f} MiB/s), "
        f"{st['live_bytes'] / 2**20:.0f} MiB on disk, ratio {RECORDS * 12288 / max(st['live_bytes'], 1):.2f}x"
    )

    streams = {"data": zring.Dataset(data_path), "label": zring.Dataset(label_path)}
    with zring.DataLoader(streams, batch_size=BATCH, num_workers=2, prefetch_size=4, mode=2, seed=0) as loader:
        for _ in range(WARMUP):
            batch = next(loader)
        waits = np.empty(STEPS)
        t0 = time.perf_counter()
        for k in range(STEPS):
            t = time.perf_counter()
            batch = next(loader)
            waits[k] = time.perf_counter() - t
            # A stand-in for a training step that touches the batch.
            assert batch["data"].shape == (BATCH, *SHAPE)
        wall = time.perf_counter() - t0
        stats = loader.stats()
    mib = STEPS * BATCH * 12288 / 2**20
    print(f"\nstreamed {STEPS} steps of batch {BATCH} (mode=cyclic, 2 gather threads, depth 4)")
    print(f"  {STEPS / wall:,.0f} batches/s  {STEPS * BATCH / wall:,.0f} samples/s  {mib / wall:,.0f} MiB/s decoded")
    print("\nconsumer wait per step (time blocked in next()):")
    print("| p50 | p90 | p99 | p99.9 | max |")
    print("|---|---|---|---|---|")
    q = np.quantile(waits * 1e3, [0.5, 0.9, 0.99, 0.999])
    print(f"| {q[0]:.3f} ms | {q[1]:.3f} ms | {q[2]:.3f} ms | {q[3]:.3f} ms | {waits.max() * 1e3:.3f} ms |")
    print("\nloader stats():", {k: v for k, v in stats.items() if not isinstance(v, dict)})
    for name, h in stats.items():
        if isinstance(h, dict):
            print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in h.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
