"""One host, not one process: budgets shared by handles and stores, and
readers that survive writers.

The record cache's capacity used to be set by each handle on its own (the
largest won, a shrink by one starved the others), each store was judged
against the whole budget alone, and a reader that had not read yet failed
with FileNotFoundError after another handle or process compacted the store,
or read another store's bytes after ``overwrite=True``. These tests pin the
rules that replaced that: the latest budget statement still live wins, modes are chosen
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


def test_one_budget_per_process_the_latest_live_statement(tmp_path):
    arr = _data(1024)  # 4 MiB
    zring.write_dataset(tmp_path / "d", arr, codec="raw")
    with zring.Dataset(tmp_path / "d", cache_bytes=2 * MIB) as a:
        np.testing.assert_array_equal(a[_all(1024)], arr)
        r = a.read_stats()
        assert (r["policy"], r["budget_bytes"]) == ("direct", 2 * MIB)
        assert 0 < r["cache_capacity"] <= 2 * MIB
        with zring.Dataset(tmp_path / "d", cache_bytes=MIB) as b:
            # The latest statement still live is the process's budget.
            assert b.read_stats()["budget_bytes"] == MIB
            np.testing.assert_array_equal(a[_all(1024)], arr)
            assert a.read_stats()["budget_bytes"] == MIB
        # Closed: its statement is withdrawn, the first one's holds again.
        np.testing.assert_array_equal(a[_all(1024)], arr)
        assert a.read_stats()["budget_bytes"] == 2 * MIB
        # The process-level call states it for every handle.
        assert zring.set_cache_bytes(MIB) is None
        try:
            np.testing.assert_array_equal(a[_all(1024)], arr)
            r = a.read_stats()
            assert r["budget_bytes"] == MIB, r
            assert r["cache_capacity"] <= MIB and r["cache_held"] <= MIB, r
            assert "shrinks" in r["policy_reason"], r["policy_reason"]
        finally:
            assert zring.set_cache_bytes(None) == MIB
        # Withdrawn: the handle's statement again, and the cache grows back.
        np.testing.assert_array_equal(a[_all(1024)], arr)
        r = a.read_stats()
        assert r["budget_bytes"] == 2 * MIB and r["cache_capacity"] > MIB, r


@pytest.mark.parametrize("close_first", ["first", "second"])
def test_two_loaders_closed_in_either_order_leave_the_right_budget(tmp_path, close_first):
    # Two DataLoaders with different cache_bytes, closed in the order they
    # were opened, used to leave the closed one's value stated for the rest
    # of the process (each restored what it had replaced).
    arr = _data(1024)
    zring.write_dataset(tmp_path / "d", arr, codec="raw")

    def budget(ds) -> int:
        ds[_all(64)]  # a read looks at the budget again
        return ds.read_stats()["budget_bytes"]

    with zring.Dataset(tmp_path / "d") as ds:
        measured = budget(ds)
        assert measured not in (MIB, 3 * MIB)
        one = zring.DataLoader({"x": ds}, num_workers=1, batch_size=64, prefetch_size=1, mode=2, cache_bytes=MIB)
        two = zring.DataLoader({"x": ds}, num_workers=1, batch_size=64, prefetch_size=1, mode=2,
                               cache_bytes=3 * MIB)
        try:
            next(one)
            next(two)
            assert budget(ds) == 3 * MIB, "the latest statement holds"
            first, second = (one, two) if close_first == "first" else (two, one)
            first.close()
            assert budget(ds) == (3 * MIB if close_first == "first" else MIB), "the live loader's budget holds"
            second.close()
            got = budget(ds)
            assert got not in (MIB, 3 * MIB), f"a closed loader's budget stayed stated: {got}"
            assert zring.set_cache_bytes(None) is None, "no process-level statement was made"
        finally:
            one.close()
            two.close()
    # A statement outlives nothing: released, it counts no more, and release
    # is idempotent.
    s = _zring.state_cache_bytes(5 * MIB)
    assert (s.bytes, s.live) == (5 * MIB, True)
    s.release()
    s.release()
    assert not s.live


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


# --- Another user on the host: the rank registry and the writer's lock -------
#
# The rank registry was /dev/shm/zring-ranks-<hash of the limit path>, opened
# with create and no O_NOFOLLOW and then chmodded 0666: a symlink planted there
# by another user made a root-owned 0600 file world-writable when a root rank
# started, and anyone could lock the file to zero every rank's record cache or
# keep every rank from registering. And the store's `lock` file was 0644, so any
# user who could read a store could flock it through a read-only descriptor and
# keep the owner's writer out. These tests run as root (CI does) and act as
# uid 65534 through setpriv.

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]

_RANK = r"""
import os, sys, pathlib
pathlib.Path(sys.argv[1], "cgroup.procs").write_text(str(os.getpid()))
import numpy as np, zring
with zring.Dataset(sys.argv[2]) as ds:
    ds[np.arange(len(ds), dtype=np.uint64)]
    print(ds.read_stats()["budget_source"], flush=True)
    sys.stdin.readline()
"""

# Run as uid 65534: tries to open (and, where it can, lock) each path given,
# and to plant a symlink in each directory given; prints what happened.
_INTRUDER = r"""
import fcntl, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.symlink("/etc/passwd", os.path.join(p, "planted"))
            os.listdir(p)
            out[p] = "entered"
        else:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            out[p] = "locked"
    except OSError as e:
        out[p] = type(e).__name__
print(json.dumps(out))
"""


def _as_nobody(code: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.fixture
def limited_cgroup():
    """A fresh memory cgroup with a 1 GiB limit (root only), removed after."""
    import os
    import shutil
    from pathlib import Path

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (a memory cgroup, another user) and setpriv")
    name = f"zring-test-{os.getpid()}"
    root = Path("/sys/fs/cgroup")
    try:
        if (root / "cgroup.controllers").exists():
            # v2 keeps processes out of cgroups whose children have
            # controllers (except the root): hang it off the root.
            sub = root / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
            cg, limit_file = root / name, "memory.max"
        else:
            mount = next(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                         if line.split(" - ")[1].split()[0] == "cgroup" and "memory" in line.split()[-1].split(","))
            own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if "memory" in line.split(":")[1].split(","))
            cg, limit_file = Path(mount) / own.lstrip("/") / name, "memory.limit_in_bytes"
        cg.mkdir()
        (cg / limit_file).write_text(str(1 << 30))
    except (OSError, StopIteration) as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")
    yield cg
    for _ in range(100):
        try:
            cg.rmdir()
            break
        except OSError:
            import time

            time.sleep(0.05)


def _rank(cg, store, registry):
    import os

    env = {k: v for k, v in os.environ.items() if k != "ZRING_CACHE_BYTES"}
    env["ZRING_REGISTRY_DIR"] = str(registry)
    p = subprocess.Popen([sys.executable, "-c", _RANK, str(cg), str(store)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return p, p.stdout.readline().strip()


def _stop(p) -> str:
    _, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, err
    return err


def _shared_dir():
    """A directory like /dev/shm (sticky, everyone may create in it)."""
    import os
    import tempfile

    d = tempfile.mkdtemp(prefix="zring-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(d, 0o1777)
    return d


def test_the_rank_registry_is_private_to_its_user(tmp_path, limited_cgroup):
    import os
    import shutil
    import stat
    from pathlib import Path

    zring.write_dataset(tmp_path / "d", _data(64), codec="raw")
    registry = Path(_shared_dir())
    try:
        a, said_a = _rank(limited_cgroup, tmp_path / "d", registry)
        b, said_b = _rank(limited_cgroup, tmp_path / "d", registry)
        try:
            assert "cgroup" in said_a, said_a
            assert "shared by 2 zring processes" in said_b, said_b
            made = sorted(registry.rglob("*"))
            print("made:", [(str(p), oct(p.lstat().st_mode)) for p in made])
            assert made and any(p.is_file() for p in made), made
            for p in made:
                mode = p.lstat().st_mode
                assert not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077 == 0, (p, oct(mode))
            r = _as_nobody(_INTRUDER, *map(str, made))
            print("uid 65534:", r.stdout, r.stderr)
            got = __import__("json").loads(r.stdout)
            assert set(got.values()) == {"PermissionError"}, got
        finally:
            _stop(a)
            _stop(b)
        # The last rank to leave removed its cgroup's file.
        assert [p for p in registry.rglob("*") if p.is_file()] == []
    finally:
        shutil.rmtree(registry)
    # What another user planted where the registry goes is not followed,
    # changed or used: the rank counts itself alone and says why.
    target = tmp_path / "secret"
    target.write_bytes(b"root's own bytes")
    os.chmod(target, 0o600)
    target_dir = tmp_path / "secret-dir"
    target_dir.mkdir(mode=0o700)
    for plant in ("symlink-to-file", "symlink-to-dir", "their-dir"):
        registry = Path(_shared_dir())
        try:
            at = registry / f"zring-{os.geteuid()}"
            code = {"symlink-to-file": f"import os; os.symlink({str(target)!r}, {str(at)!r})",
                    "symlink-to-dir": f"import os; os.symlink({str(target_dir)!r}, {str(at)!r})",
                    "their-dir": f"import os; os.mkdir({str(at)!r}); os.chmod({str(at)!r}, 0o777)"}[plant]
            r = _as_nobody(code)
            assert r.returncode == 0, r.stderr
            p, said = _rank(limited_cgroup, tmp_path / "d", registry)
            err = _stop(p)
            print(plant, "->", said, "|", err.strip())
            assert "cgroup" in said and "shared" not in said, said
            assert "the rank registry is unusable" in err and "ZRING_REGISTRY_DIR" in err, err
            assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == (b"root's own bytes", 0o600)
            assert list(target_dir.iterdir()) == [] and stat.S_IMODE(target_dir.stat().st_mode) == 0o700
            if plant == "their-dir":
                assert list(at.iterdir()) == []
        finally:
            shutil.rmtree(registry)


def test_a_user_who_may_only_read_a_store_cannot_keep_its_writer_out(tmp_path):
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (another user) and setpriv")
    # Readable by everyone, as stores on a shared machine are.
    where = tempfile.mkdtemp(prefix="zring-test-")
    try:
        os.chmod(where, 0o755)
        store = os.path.join(where, "d")
        zring.write_dataset(store, _data(8), codec="raw")
        lock = os.path.join(store, "lock")
        assert os.path.exists(lock)
        hold = _INTRUDER.replace("print(json.dumps(out))", "print(json.dumps(out), flush=True); sys.stdin.readline()")
        # uid 65534 reads the store, and tries to hold its lock file.
        nobody = subprocess.Popen([*NOBODY, sys.executable, "-c", hold, os.path.join(store, "head.zr"), lock],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            got = __import__("json").loads(nobody.stdout.readline())
            print("uid 65534:", got)
            assert got[os.path.join(store, "head.zr")] == "locked", "uid 65534 can read the store"
            assert got[lock] == "PermissionError", got
            zring.write_dataset(store, _data(1, seed=1), codec="raw", append=True)
        finally:
            nobody.communicate("\n", timeout=60)
        with zring.Dataset(store) as ds:
            assert len(ds) == 9
    finally:
        shutil.rmtree(where)


def test_a_full_registry_place_warns_and_names_the_variable(tmp_path, limited_cgroup):
    # A full tmpfs used to turn the registry off with no word.
    import os
    from pathlib import Path

    zring.write_dataset(tmp_path / "d", _data(64), codec="raw")
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=8", "tmpfs", str(full)]).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        for i in range(64):  # take every inode
            try:
                (full / f"f{i}").touch()
            except OSError:
                break
        p, said = _rank(limited_cgroup, tmp_path / "d", full)
        err = _stop(p)
        print(said, "|", err.strip())
        assert "cgroup" in said and "shared" not in said, said
        assert f"{full}/zring-{os.geteuid()} cannot be made: No space left on device" in err, err
        assert "ZRING_REGISTRY_DIR to another directory" in err, err
        assert not Path(full, f"zring-{os.geteuid()}").exists()
    finally:
        subprocess.run(["umount", str(full)])
