"""The memory budget and the record cache, seen from Python.

A store whose data exceeds its memory budget is read with O_DIRECT and a
record cache in front (issue: reads around and beyond RAM). These tests pin
the behaviour a user relies on: the budget is honoured and reported, records
come back byte-exact whether they are served by the cache or the disk, and a
cached record is never served after its store moved on (appends, delete,
compact).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import zring

RECORD = 4096


def _data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, RECORD), dtype=np.uint8)


def test_an_explicit_budget_below_the_data_reads_direct_with_a_cache(tmp_path):
    arr = _data(512)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    with zring.Dataset(tmp_path / "d.zr", cache_bytes=arr.nbytes // 2) as ds:
        r = ds.read_stats()
        assert r["policy"] == "direct" and not r["forced"]
        assert r["budget_bytes"] == arr.nbytes // 2
        assert "budget" in r["policy_reason"]
        idx = np.arange(len(arr), dtype=np.uint64)
        for _ in range(3):
            np.testing.assert_array_equal(ds[idx], arr)
        r = ds.read_stats()
        assert r["records"] == 3 * len(arr)
        assert r["cache_hits"] > 0, r
        assert r["cache_hits"] + r["cache_misses"] == r["records"]
        assert r["bytes_from_cache"] == r["cache_hits"] * RECORD
        # Admission without churn: after the first pass the cached subset is
        # fixed, so each later pass hits it exactly.
        assert r["cache_held"] <= arr.nbytes // 2


def test_a_budget_that_holds_the_data_reads_buffered(tmp_path):
    arr = _data(64)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    with zring.Dataset(tmp_path / "d.zr", cache_bytes=arr.nbytes * 4) as ds:
        assert ds.read_stats()["policy"] == "buffered"
        np.testing.assert_array_equal(ds[np.arange(64, dtype=np.uint64)], arr)
        assert ds.stats()["reads"]["records"] == 64


def test_bad_budgets_are_errors(tmp_path):
    zring.write_dataset(tmp_path / "d.zr", _data(4), codec="raw")
    with pytest.raises(ValueError, match="cache_bytes"):
        zring.Dataset(tmp_path / "d.zr", cache_bytes=-1)
    with pytest.raises(TypeError, match="cache_bytes"):
        zring.Dataset(tmp_path / "d.zr", cache_bytes="1G")


def test_concurrent_gathers_through_the_cache_are_exact(tmp_path):
    arr = _data(600, seed=1)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="zstd")
    errors = []
    with zring.Dataset(tmp_path / "d.zr", cache_bytes=arr.nbytes // 3) as ds:
        assert ds.read_stats()["policy"] == "direct"

        def run(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    idx = rng.integers(0, len(arr), size=64).astype(np.uint64)
                    got = ds[idx]
                    if not np.array_equal(got, arr[idx.astype(np.int64)]):
                        errors.append(f"thread {seed}: wrong bytes")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert ds.read_stats()["cache_hits"] > 0


def test_a_cached_record_is_never_served_after_the_store_moved_on(tmp_path):
    """Appends, delete (the tail moves into the hole) and compact (new chunk
    files) change what an index means; the cache is keyed by where and what
    the stored bytes are, so no stale record can come back."""
    p = tmp_path / "z.zr"
    model = _data(200, seed=4)

    def read_all(z: zring.Zrecord) -> np.ndarray:
        out = np.empty((len(z), RECORD), dtype=np.uint8)
        z.gather(np.arange(len(z), dtype=np.uint64), out.reshape(-1), RECORD)
        return out

    with zring.Zrecord(p, codec="raw", cache_bytes=model.nbytes // 2) as z:
        z.append(model.reshape(-1), len(model), RECORD)
        z.sync()
        # Opened empty (buffered); the first gather after the store grew past
        # its budget switches it to direct reads with the cache.
        for _ in range(3):
            np.testing.assert_array_equal(read_all(z), model)
        r = z.read_stats()
        assert r["policy"] == "direct" and r["switches"] == 1, r
        assert r["cache_hits"] > 0
        z.delete([0, 5, 17])
        rows = list(model)
        for i in sorted([0, 5, 17], reverse=True):
            rows[i] = rows[-1]
            rows.pop()
        model = np.stack(rows)
        np.testing.assert_array_equal(read_all(z), model)
        z.compact()
        extra = _data(3, seed=5)
        z.append(extra.reshape(-1), 3, RECORD)
        model = np.concatenate([model, extra])
        for _ in range(2):
            np.testing.assert_array_equal(read_all(z), model)


def test_the_loader_reports_each_streams_reads(tmp_path):
    arr = _data(512, seed=2)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    ds = zring.Dataset(tmp_path / "d.zr")
    with zring.DataLoader({"x": ds}, batch_size=64, num_workers=1, mode=2, seed=3,
                          cache_bytes=arr.nbytes // 2) as loader:
        for _ in range(16):
            batch = next(loader)
            np.testing.assert_array_equal(batch["x"], arr[loader.last_indices.astype(np.int64)])
        reads = loader.stats()["reads"]["x"]
        assert reads["policy"] == "direct"
        assert reads["records"] >= 16 * 64
    ds.close()


def test_the_cache_follows_a_budget_that_changes_while_reading(tmp_path, monkeypatch):
    # The budget is detected again as reads go on (every few thousand records
    # or 16 MiB): a process that grows takes its memory out of the cache
    # at once, and the cache grows back when the memory is free again. The
    # environment override stands in for a cgroup limit that moves.
    arr = _data(1024, seed=5)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    idx = np.arange(len(arr), dtype=np.uint64)
    monkeypatch.setenv("ZRING_CACHE_BYTES", str(arr.nbytes // 2))
    with zring.Dataset(tmp_path / "d.zr") as ds:
        assert ds.read_stats()["policy"] == "direct"
        for _ in range(2):
            np.testing.assert_array_equal(ds[idx], arr)
        assert ds.read_stats()["cache_held"] > arr.nbytes // 4
        monkeypatch.setenv("ZRING_CACHE_BYTES", str(arr.nbytes // 8))
        for _ in range(5):
            np.testing.assert_array_equal(ds[idx], arr)
        r = ds.read_stats()
        # The slab pool and reads in flight take an eighth of a small budget.
        assert r["cache_capacity"] == arr.nbytes // 8 - arr.nbytes // 64, r
        assert r["cache_held"] <= arr.nbytes // 8, r
        assert r["budget_bytes"] == arr.nbytes // 8
        assert "shrinks" in r["policy_reason"], r["policy_reason"]
        assert r["policy"] == "direct" and r["switches"] == 0
        monkeypatch.setenv("ZRING_CACHE_BYTES", str(arr.nbytes // 2))
        for _ in range(5):
            np.testing.assert_array_equal(ds[idx], arr)
        r = ds.read_stats()
        assert r["cache_capacity"] == arr.nbytes // 2 - arr.nbytes // 16, r
        assert "grows" in r["policy_reason"], r["policy_reason"]
        assert r["cache_held"] > arr.nbytes // 4, r


def test_rows_of_whole_pages_are_read_from_disk_straight_into_the_array(tmp_path):
    arr = _data(256, seed=3)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    with zring.Dataset(tmp_path / "d.zr", cache_bytes=arr.nbytes // 4) as ds:
        assert ds.read_stats()["policy"] == "direct"
        idx = np.random.default_rng(1).permutation(len(arr))[:100].astype(np.uint64)
        got = ds[idx]
        np.testing.assert_array_equal(got, arr[idx])
        assert got.ctypes.data % 4096 == 0, "not page-aligned"
        r = ds.read_stats()
        # Every record the gather read from disk went straight into its row.
        assert r["bytes_read"] > 0 and r["bytes_into_place"] == r["bytes_read"], r
        # The array is an ordinary array: writable, its own rows.
        got[0] = 0
        np.testing.assert_array_equal(ds[idx[:1]], arr[idx[:1]])


MEMORY_CHILD = """
import sys
import numpy as np
import zring

def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))

path, budget, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = anon()
worst = 0
with zring.Dataset(path, cache_bytes=budget) as ds:
    assert ds.read_stats()["policy"] == "direct", ds.read_stats()
    rng = np.random.default_rng(1)
    for _ in range(4):
        idx = rng.integers(0, len(ds), size=batch).astype(np.uint64)
        out = ds[idx]
        assert np.array_equal(out[:, 0], (idx % 251).astype(np.uint8))
        del out
        worst = max(worst, anon() - base)
print(worst)
"""


@pytest.mark.parametrize("batch", [256, 1024])
def test_memory_between_gathers_stays_within_the_budget_whatever_the_batch(tmp_path, batch):
    """Records of 64 KiB + 1 byte read with O_DIRECT go through a scratch
    buffer as large as the batch's records, which every gathering thread
    kept after the gather: 4,096 of them through a 160 MiB budget left 2.59
    times the budget of anonymous memory allocated between gathers. What the
    threads keep now counts against the budget; the rest is freed."""
    import subprocess
    import sys

    n, record, budget = 1200, 65537, 64 << 20
    rows = (np.arange(n, dtype=np.uint64) % 251).astype(np.uint8)
    arr = np.repeat(rows[:, None], record, axis=1)
    zring.write_dataset(tmp_path / "d.zr", arr, codec="raw")
    del arr
    # glibc raises its mmap threshold when a mapped block is freed, so the
    # 16 MiB arrays of batches of 256 come from its heap after the first and
    # stay there freed (up to 1.12x the budget here, the allocator's and not
    # zring's); a fixed threshold measures what zring keeps.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / "d.zr"), str(budget), str(batch)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    worst = int(out.stdout.split()[-1])
    assert worst <= 1.1 * budget, f"{worst / 2**20:.1f} MiB of anonymous memory between gathers, budget {budget >> 20} MiB"
