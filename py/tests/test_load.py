"""Load from Python: many forked readers, and many loaders created and closed.

Guarantees: 100 children forked from a process that has already read a store
all read correct data (none reuses the parent's io_uring ring or decode pool,
none hangs); 1,000 DataLoaders created, read from and closed leave the
process's threads, open files and memory where they were.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import zring


def _count(path: str) -> int:
    return len(os.listdir(path))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


_FORK_READERS = r"""
import os, sys, time
import numpy as np
import zring
path = sys.argv[1]
data = np.arange(300 * 64, dtype=np.int32).reshape(300, 64)
zring.write_dataset(path, data)
ds = zring.Dataset(path)
assert np.array_equal(ds[[5, 299, 0]], data[[5, 299, 0]])  # the parent has used the engine
pids = []
for k in range(100):
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            idx = [(k * 7 + j) % 300 for j in range(32)]
            code = 0 if np.array_equal(ds[idx], data[idx]) else 2
        finally:
            os._exit(code)
    pids.append(pid)
deadline = time.monotonic() + 120
failed = []
for pid in pids:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                failed.append((pid, status))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            failed.append((pid, "hung"))
            break
        time.sleep(0.005)
assert np.array_equal(ds[[1, 2]], data[[1, 2]])
print(f"{100 - len(failed)} of 100 forked readers ok; failed: {failed[:5]}")
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_a_hundred_forked_children_read(tmp_path):
    # In a fresh interpreter: forking this pytest process is unsafe once other
    # tests have started JAX's threads.
    r = subprocess.run([sys.executable, "-c", _FORK_READERS, str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"forked readers failed: {r.stdout}{r.stderr}"
    assert "100 of 100 forked readers ok" in r.stdout


def test_a_thousand_loaders_leave_no_threads_files_or_memory(tmp_path):
    data = np.arange(512 * 16, dtype=np.float32).reshape(512, 16)
    zring.write_dataset(tmp_path / "x", data)
    zring.write_dataset(tmp_path / "y", np.arange(512, dtype=np.int64), codec="raw")
    streams = {"x": zring.Dataset(tmp_path / "x"), "y": zring.Dataset(tmp_path / "y")}

    def cycle(k: int) -> None:
        with zring.DataLoader(streams, batch_size=32, num_workers=2, prefetch_size=2, mode=k % 3, seed=k) as dl:
            batch = next(dl)
            np.testing.assert_array_equal(batch["x"], data[batch["y"]])

    for k in range(50):  # warm up: the decode pool, allocator arenas
        cycle(k)
    time.sleep(0.2)
    threads, fds, rss = _count("/proc/self/task"), _count("/proc/self/fd"), _rss_kib()
    for k in range(1000):
        cycle(k)
    deadline = time.monotonic() + 5
    while _count("/proc/self/task") > threads and time.monotonic() < deadline:
        time.sleep(0.05)  # a joined thread can linger in /proc for a moment
    assert _count("/proc/self/task") <= threads, "loader threads outlived close()"
    assert _count("/proc/self/fd") <= fds, "open files leaked"
    grown = _rss_kib() - rss
    assert grown < 64 * 1024, f"resident memory grew by {grown} KiB over 1,000 loaders"
