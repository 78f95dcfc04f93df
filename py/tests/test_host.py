"""One host, not one process: budgets shared by handles and stores, and
readers that survive writers.

The record cache's capacity used to be set by each handle on its own (the
largest won, a shrink by one starved the others), each store was judged
against the whole budget alone, and a reader that had not read yet failed
with FileNotFoundError after another handle or process compacted the store,
or read another store's bytes after ``overwrite=True``. These tests pin the
rules that replaced that: the smallest stated budget wins, modes are chosen
against the data of every open store, a reader reads the snapshot it opened
(or raises StaleError when the store was replaced), and the memory of a store
that no longer needs a record cache is given back.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import zring
from zring import _zring

RECORD = 4096
MIB = 1 << 20


def _data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, RECORD), dtype=np.uint8)


def _all(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint64)


def test_the_smallest_stated_budget_wins_for_every_handle(tmp_path):
    arr = _data(1024)  # 4 MiB
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    with zring.Dataset(tmp_path / "d", cache_bytes=2 * MIB) as a:
        np.testing.assert_array_equal(a[_all(1024)], arr)
        r = a.read_stats()
        assert (r["policy"], r["budget_bytes"]) == ("direct", 2 * MIB)
        assert 0 < r["cache_capacity"] <= 2 * MIB
        with zring.Dataset(tmp_path / "d", cache_bytes=MIB) as b:
            assert b.read_stats()["budget_bytes"] == MIB
            # The first handle's next gather follows the smaller budget.
            np.testing.assert_array_equal(a[_all(1024)], arr)
            r = a.read_stats()
            assert r["budget_bytes"] == MIB, r
            assert r["cache_capacity"] <= MIB and r["cache_held"] <= MIB, r
            assert "shrinks" in r["policy_reason"], r["policy_reason"]
        # The smaller promise left with its handle: the cache grows back.
        np.testing.assert_array_equal(a[_all(1024)], arr)
        r = a.read_stats()
        assert r["budget_bytes"] == 2 * MIB and r["cache_capacity"] > MIB, r


def test_a_dataloaders_budget_lowers_the_datasets_cache(tmp_path):
    arr = _data(1024)
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    with zring.Dataset(tmp_path / "d", cache_bytes=3 * MIB) as ds:
        ds[_all(1024)]
        dl = zring.DataLoader({"x": ds}, num_workers=1, batch_size=64, prefetch_size=1, mode=2,
                              cache_bytes=MIB)
        try:
            for _ in range(40):
                next(dl)
            r = dl.stats()["reads"]["x"]
            assert r["budget_bytes"] == MIB and r["cache_capacity"] <= MIB, r
            ds[_all(1024)]
            assert ds.read_stats()["cache_capacity"] <= MIB
        finally:
            dl.close()


def test_two_stores_that_fit_alone_but_not_together_are_both_read_direct(tmp_path):
    a_arr, b_arr = _data(256, 1), _data(256, 2)  # 1 MiB each
    zring.write_dataset(tmp_path / "a", a_arr, codec="raw")
    zring.write_dataset(tmp_path / "b", b_arr, codec="raw")
    budget = int(1.4 * MIB)
    with zring.Dataset(tmp_path / "a", cache_bytes=budget) as a:
        assert a.read_stats()["policy"] == "buffered"
        with zring.Dataset(tmp_path / "b", cache_bytes=budget) as b:
            r = b.read_stats()
            assert r["policy"] == "direct", r["policy_reason"]
            np.testing.assert_array_equal(a[_all(256)], a_arr)
            r = a.read_stats()
            assert (r["policy"], r["switches"]) == ("direct", 1), r["policy_reason"]
            for _ in range(2):
                np.testing.assert_array_equal(a[_all(256)], a_arr)
                np.testing.assert_array_equal(b[_all(256)], b_arr)
            ra, rb = a.read_stats(), b.read_stats()
            # One budget between them, shared, never more.
            assert ra["cache_capacity"] + rb["cache_capacity"] <= budget
            assert ra["cache_held"] + rb["cache_held"] <= budget
            assert ra["cache_hits"] > 0 and rb["cache_hits"] > 0


def test_without_mappings_a_store_that_fits_stays_buffered(tmp_path, monkeypatch):
    # Nothing counts page-cache residency without mappings: a full pass used
    # to be judged "thrashing" and moved to O_DIRECT with a cache of 0 bytes.
    monkeypatch.setenv("ZRING_MMAP", "0")
    arr = _data(512)
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    with zring.Dataset(tmp_path / "d", cache_bytes=64 * MIB) as ds:
        for _ in range(12):  # > 4096 records, several full passes
            np.testing.assert_array_equal(ds[_all(512)], arr)
        r = ds.read_stats()
        assert (r["policy"], r["switches"], r["records"]) == ("buffered", 0, 12 * 512), r["policy_reason"]


def test_a_switch_to_buffered_gives_the_cached_records_back(tmp_path, monkeypatch):
    arr = _data(512)  # 2 MiB
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    monkeypatch.setenv("ZRING_CACHE_BYTES", str(MIB))
    with zring.Dataset(tmp_path / "d") as ds:
        ds[_all(512)]
        r = ds.read_stats()
        assert r["policy"] == "direct" and r["cache_held"] > 0, r
        # The budget grows past the data: the cache grows, serves every record,
        # and the store goes back to the page cache, freeing the records.
        monkeypatch.setenv("ZRING_CACHE_BYTES", str(64 * MIB))
        for _ in range(40):
            np.testing.assert_array_equal(ds[_all(512)], arr)
            if ds.read_stats()["policy"] == "buffered":
                break
        r = ds.read_stats()
        assert r["policy"] == "buffered", r["policy_reason"]
        assert (r["cache_capacity"], r["cache_held"], r["cache_entries"]) == (0, 0, 0), r
        np.testing.assert_array_equal(ds[_all(512)], arr)


# --------------------------------------------------------------------------
# readers and writers
# --------------------------------------------------------------------------

def _delete_and_compact(path, n: int) -> None:
    with _zring.Store(str(path), "a") as w:
        w.delete(np.arange(0, n, 3, dtype=np.uint64))
        w.compact()


_OTHER_PROCESS = """
import sys, numpy as np
from zring import _zring
with _zring.Store(sys.argv[1], "a") as w:
    w.delete(np.arange(0, int(sys.argv[2]), 3, dtype=np.uint64))
    w.compact()
"""


@pytest.mark.parametrize("writer", ["handle", "process"])
@pytest.mark.parametrize("read_first", [False, True])
def test_a_reader_reads_its_snapshot_across_delete_and_compact(tmp_path, writer, read_first):
    arr = _data(600)
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    before = sorted(p.name for p in (tmp_path / "d").iterdir())
    with zring.Dataset(tmp_path / "d") as r:
        if read_first:
            np.testing.assert_array_equal(r[np.arange(0, 600, 7, dtype=np.uint64)], arr[::7])
        if writer == "handle":
            _delete_and_compact(tmp_path / "d", 600)
        else:
            subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(tmp_path / "d"), "600"], check=True)
        # The old chunks are still there for the reader.
        assert len(r) == 600
        np.testing.assert_array_equal(r[_all(600)], arr)
        with zring.Dataset(tmp_path / "d") as fresh:
            keep = np.ones(600, bool)
            keep[::3] = False
            assert len(fresh) == keep.sum()
            assert sorted(map(bytes, fresh[_all(len(fresh))])) == sorted(map(bytes, arr[keep]))
    # The reader held the last pin on the old chunks: they went as it
    # closed, with no writer open.
    after = sorted(p.name for p in (tmp_path / "d").iterdir())
    chunks = [n for n in after if n.startswith("chunk-")]
    assert chunks and not set(chunks) & {n for n in before if n.startswith("chunk-")}, (before, after)


_ROUND = """
import sys, numpy as np
from zring import _zring
with _zring.Store(sys.argv[1], "a") as w:
    w.delete(np.array([0], dtype=np.uint64))
    w.append_fixed(np.full(4096, 9, np.uint8), 4096, None)
    w.compact()
"""


def _chunk_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.name.startswith("chunk-"))


def test_a_long_lived_reader_keeps_only_its_own_chunks_across_processes(tmp_path):
    # A reader pinned every chunk id from its first to infinity, so it kept
    # the output of every later compaction too: 20 MiB of chunk files after
    # four rounds over 4 MiB of live data. Each round runs in another
    # process, which must still respect the reader's pin.
    arr = _data(1024)  # 4 MiB
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    start = _chunk_bytes(tmp_path / "d")
    with zring.Dataset(tmp_path / "d") as r:
        np.testing.assert_array_equal(r[_all(1024)], arr)
        most = 0
        for _ in range(4):
            subprocess.run([sys.executable, "-c", _ROUND, str(tmp_path / "d")], check=True)
            most = max(most, _chunk_bytes(tmp_path / "d"))
        assert most <= 12 * MIB, most
        # The reader's files are still there, and the live store's.
        assert _chunk_bytes(tmp_path / "d") >= 2 * start - MIB, (start, _chunk_bytes(tmp_path / "d"))
        np.testing.assert_array_equal(r[_all(1024)], arr)
    # Its close removed them: the live store's alone are left.
    assert _chunk_bytes(tmp_path / "d") <= start, (start, _chunk_bytes(tmp_path / "d"))
    print(f"one reader alive over four delete + compact rounds (4 MiB live): at most {most} bytes of chunk files")


_OVERWRITE = """
import sys, numpy as np, zring
zring.write_dataset(sys.argv[1], np.full((600, 4096), 7, np.uint8), codec="raw", overwrite=True)
"""


@pytest.mark.parametrize("writer", ["handle", "process"])
@pytest.mark.parametrize("read_first", [False, True])
def test_a_store_replaced_under_a_reader_is_its_snapshot_or_stale(tmp_path, writer, read_first):
    arr = _data(600)
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    with zring.Dataset(tmp_path / "d") as r:
        if read_first:
            np.testing.assert_array_equal(r[_all(600)], arr)
        if writer == "handle":
            zring.write_dataset(tmp_path / "d", np.full((600, RECORD), 7, np.uint8), codec="raw", overwrite=True)
        else:
            subprocess.run([sys.executable, "-c", _OVERWRITE, str(tmp_path / "d")], check=True)
        # Never another store's bytes, a checksum error or FileNotFoundError:
        # the snapshot (its files already open), or StaleError.
        try:
            got = r[_all(600)]
        except zring.StaleError as e:
            assert not read_first or "replaced" in str(e) or "gone" in str(e)
            assert "reopen" in str(e)
        else:
            assert read_first, "a reader that never opened the old files cannot read them"
            np.testing.assert_array_equal(got, arr)
    with zring.Dataset(tmp_path / "d") as fresh:
        assert (fresh[_all(600)] == 7).all()
