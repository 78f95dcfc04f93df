"""A process forked after the parent opened and read a store can still read it.

torch's DataLoader workers are forked from a process that already holds open
stores; the engine must not reuse the parent's io_uring ring or thread pool in
the child (they do not survive fork). The child reports through its exit code
and a pipe, and the parent waits with a deadline so a hang fails the test.
"""

import os
import threading
import time

import numpy as np
import pytest

import zring
from conftest import wait_child


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_forked_child_reads(tmp_path):
    data = np.arange(4000, dtype=np.float32).reshape(200, 20)
    zring.write_dataset(tmp_path / "d", data)
    ds = zring.Dataset(tmp_path / "d")
    idx = [199, 3, 50, 50]
    np.testing.assert_array_equal(ds[idx], data[idx])  # parent uses the engine first

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(r)
            got = ds[idx]
            got2 = zring.Dataset(tmp_path / "d")[::7]
            ok = np.array_equal(got, data[idx]) and np.array_equal(got2, data[::7])
            os.write(w, b"ok" if ok else b"mismatch")
            code = 0 if ok else 2
        except BaseException as exc:  # report, then exit without cleanup
            os.write(w, repr(exc).encode()[:500])
        finally:
            os._exit(code)

    os.close(w)
    status = wait_child(pid, time.monotonic() + 60)
    if status is None:
        pytest.fail("forked child did not finish reading within 60 s")
    msg = os.read(r, 1000).decode(errors="replace")
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child failed: {msg!r} (status {status})"
    assert msg == "ok"
    # the parent keeps working after the fork too
    np.testing.assert_array_equal(ds[idx], data[idx])
    ds.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_forked_child_gets_a_clear_error_from_a_parent_loader(tmp_path):
    """A DataLoader's gather threads stay in the parent. In the child, next()
    must raise at once (not wait forever for threads that do not exist), and
    dropping the copy must not try to join them; a new loader works."""
    zring.write_dataset(tmp_path / "d", np.arange(64, dtype=np.int64))
    ds = zring.Dataset(tmp_path / "d")
    loader = zring.DataLoader({"x": ds}, batch_size=8, mode=0, num_workers=1)
    first = next(loader)["x"].copy()

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                next(loader)
                os.write(w, b"no error")
            except RuntimeError as exc:
                if "fork" not in str(exc):
                    raise
                loader.close()  # must not hang joining the parent's threads
                with zring.DataLoader({"x": ds}, batch_size=8, mode=0, num_workers=1) as fresh:
                    ok = np.array_equal(next(fresh)["x"], first)
                os.write(w, b"ok" if ok else b"mismatch")
                code = 0 if ok else 2
        except BaseException as exc:
            os.write(w, repr(exc).encode()[:500])
        finally:
            os._exit(code)

    os.close(w)
    status = wait_child(pid, time.monotonic() + 60)
    if status is None:
        pytest.fail("forked child hung on the parent's DataLoader")
    msg = os.read(r, 1000).decode(errors="replace")
    os.close(r)
    assert msg == "ok", f"child said {msg!r} (status {status})"
    np.testing.assert_array_equal(next(loader)["x"], np.arange(8, 16))
    loader.close()
    ds.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_fork_while_threads_gather_on_the_pool_and_during_an_append(tmp_path):
    """Forks while two threads gather 256-record batches of a zstd store on
    the decode pool, a DataLoader's threads gather ahead, and a third thread
    appends to another store: fork waits for the operations under way (one
    block of a long append), so every child reads without hanging, and its
    writes through the parent's handle are refused at once, never waited
    for."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 50, size=(3000, 512), dtype=np.uint8)
    zring.write_dataset(tmp_path / "d", data, codec="zstd")
    ds = zring.Dataset(tmp_path / "d")
    loader = zring.DataLoader({"x": ds}, batch_size=256, num_workers=2)
    writer = zring.Zrecord(tmp_path / "w", codec="zstd")
    stop = threading.Event()
    failures: list[BaseException] = []

    def gather(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                idx = r.integers(0, len(data), 256)
                np.testing.assert_array_equal(ds[idx], data[idx])
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    def append() -> None:
        try:
            while not stop.is_set():
                writer.append(data[:1000], 1000, data.shape[1])
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=gather, args=(s,)) for s in (1, 2)] + [threading.Thread(target=append)]
    for t in threads:
        t.start()
    try:
        for round in range(12):
            time.sleep(0.01)
            next(loader)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: never return into pytest
                code = 1
                try:
                    os.close(r)
                    idx = np.arange(round, len(data), 11)[:256]
                    ok = np.array_equal(ds[idx], data[idx])
                    try:  # the parent's writer: refused in a child, never waited for
                        writer.sync()
                        ok = False
                    except zring.ZringError as exc:
                        ok = ok and "forked child" in str(exc)
                    os.write(w, b"ok" if ok else b"mismatch")
                    code = 0 if ok else 2
                except BaseException as exc:
                    os.write(w, repr(exc).encode()[:500])
                finally:
                    os._exit(code)
            os.close(w)
            status = wait_child(pid, time.monotonic() + 30)
            msg = os.read(r, 1000).decode(errors="replace")
            os.close(r)
            assert status is not None, f"round {round}: the forked child hung"
            assert msg == "ok", f"round {round}: child said {msg!r} (status {status})"
    finally:
        stop.set()
        for t in threads:
            t.join()
        loader.close()
    assert not failures, failures
    writer.close()
    ds.close()
