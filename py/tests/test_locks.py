"""Locks other users can hold (issue 36).

The writer lock was a ``flock``, which any descriptor takes, a read-only one
included: after ``chmod -R a+rX`` a user who could only read the store kept
every append, delete and compact out. ``pin()`` waited on ``pins`` without a
bound, so a ``Dataset()`` hung silently while another process held it. Now
the writer lock is an OFD write lock (which needs a descriptor opened for
writing), a reader's locks on ``lock`` are replaced around, a pin waits at
most ``ZRING_LOCK_WAIT_MS`` and then raises ``LockedError`` naming ``pins``,
and a compaction keeps (and later removes) the chunks a reader pins instead
of waiting for it.
"""

import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import zring

#: `struct flock` on Linux x86-64 and aarch64: l_type, l_whence (shorts),
#: l_start, l_len (off_t), l_pid (int), padding.
FLOCK = "hhqqi4x"


def ofd_lock(fd: int, kind: int, start: int = 0, length: int = 0) -> bool:
    """An OFD lock without waiting; False when another description holds a
    conflicting one."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(FLOCK, kind, os.SEEK_SET, start, length, 0))
        return True
    except (BlockingIOError, PermissionError):
        return False


def test_a_pin_waits_a_bounded_time_then_names_the_pins_file(tmp_path, monkeypatch):
    """A process that holds a write lock on every chunk's byte of ``pins``
    (which needs write access to the store): ``Dataset()`` raises within the
    bound instead of hanging, naming the file and what to do; once the
    holder lets go it opens."""
    p = tmp_path / "s"
    zring.write_dataset(p, np.arange(1000, dtype=np.int64))
    monkeypatch.setenv("ZRING_LOCK_WAIT_MS", "300")
    fd = os.open(p / "pins", os.O_RDWR)
    try:
        assert ofd_lock(fd, fcntl.F_WRLCK)
        t = time.monotonic()
        with pytest.raises(zring.LockedError, match="ZRING_LOCK_WAIT_MS") as e:
            zring.Dataset(p)
        waited = time.monotonic() - t
        assert str(p / "pins") in str(e.value) and "fuser" in str(e.value)
        assert waited < 30, f"Dataset() took {waited:.1f} s"
    finally:
        os.close(fd)
    with zring.Dataset(p) as ds:
        assert ds[999] == 999


def test_compaction_keeps_pinned_chunks_and_removes_them_later(tmp_path):
    """Reclamation never waits for a reader: a pinned chunk is kept, the
    compaction returns, and the chunk goes once no one pins it."""
    p = tmp_path / "s"
    zring.write_dataset(p, np.arange(10_000, dtype=np.int64), codec="raw")
    before = sorted(x.name for x in p.glob("chunk-*.zr"))
    fd = os.open(p / "pins", os.O_RDONLY)
    assert ofd_lock(fd, fcntl.F_RDLCK)  # every chunk, past and future
    try:
        with zring.Zrecord(p) as z:
            z.delete(np.arange(0, 10_000, 2))
            z.compact()
            assert len(z) == 5000
        assert set(before) <= {x.name for x in p.glob("chunk-*.zr")}, "pinned chunks stay"
    finally:
        os.close(fd)
    with zring.Zrecord(p) as z:
        z.sync()
    assert not set(before) & {x.name for x in p.glob("chunk-*.zr")}, "and go once unpinned"
    with zring.Dataset(p) as ds:
        # The tail fills holes: the same records, in another order.
        np.testing.assert_array_equal(np.sort(ds[np.arange(5000)]), np.arange(1, 10_000, 2))


SQUATTER = r"""
import fcntl, os, struct, sys
FLOCK = "hhqqi4x"
held = []
for d, _, files in os.walk(sys.argv[1]):
    for name in files + ["."]:
        path = os.path.join(d, name)
        for flags in (os.O_RDWR, os.O_RDONLY):
            try:
                fd = os.open(path, flags)
            except OSError:
                continue
            held.append(fd)
            got = []
            for kind in (fcntl.F_WRLCK, fcntl.F_RDLCK):
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(FLOCK, kind, 0, 0, 0, 0))
                    got.append("ofd")
                    break
                except OSError:
                    pass
            for op in (fcntl.LOCK_EX, fcntl.LOCK_SH):
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    got.append("flock")
                    break
                except OSError:
                    pass
            # Classic POSIX locks, from a second descriptor of the file.
            try:
                fd2 = os.open(path, os.O_RDONLY)
                held.append(fd2)
                fcntl.lockf(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)
                got.append("posix")
            except OSError:
                pass
            print(path, flags, got, file=sys.stderr)
            break
print("ready", flush=True)
sys.stdin.read()
"""


def system_python() -> str | None:
    """A python3 the other user can run with this one's site-packages (the
    venv's interpreter may live where that user cannot enter)."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return shutil.which(want, path="/usr/bin:/usr/local/bin:/bin")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a second user (uid 65534)")
def test_a_read_only_user_holding_every_lock_it_can_keeps_no_writer_out_and_hangs_no_reader(monkeypatch):
    """The must-show of issue 36: after ``chmod -R a+rX``, uid 65534 holds
    every lock it can take on every file of the store (OFD, ``flock`` and
    POSIX locks, through every descriptor it can open); appends, deletes and
    compactions proceed, and ``Dataset()`` opens within the bound."""
    python = system_python()
    if python is None:
        pytest.skip("no system python of this version for the second user")
    root = Path(tempfile.mkdtemp(prefix="zring-locks-"))
    try:
        os.chmod(root, 0o755)
        p = root / "s"
        zring.write_dataset(p, np.arange(20_000, dtype=np.int64), codec="raw")
        with zring.Zrecord(p) as z:  # a writer of this version made lock and pins
            z.sync()
        subprocess.run(["chmod", "-R", "a+rX", str(p)], check=True)
        assert os.stat(p / "lock").st_mode & stat.S_IROTH
        squatter = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", SQUATTER, str(p)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert squatter.stdout.readline().strip() == "ready", squatter.stderr.read()
            monkeypatch.setenv("ZRING_LOCK_WAIT_MS", "2000")
            t = time.monotonic()
            with zring.Dataset(p) as ds:
                assert ds[19_999] == 19_999
            assert time.monotonic() - t < 30
            zring.write_dataset(p, np.arange(20_000, 30_000, dtype=np.int64), codec="raw", append=True)
            with zring.Zrecord(p) as z:
                z.delete(np.arange(0, 30_000, 3))
                z.compact()
                assert len(z) == 20_000
            with zring.Dataset(p) as ds:
                want = np.delete(np.arange(30_000), np.arange(0, 30_000, 3))
                np.testing.assert_array_equal(np.sort(ds[np.arange(len(ds))]), want)
            assert squatter.poll() is None, "the squatter held its locks throughout"
        finally:
            squatter.stdin.close()
            squatter.wait(timeout=30)
    finally:
        shutil.rmtree(root)
