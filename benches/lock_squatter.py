"""A read-only user holding every lock it can open (issue 36's must-show).

Run as root: a store is written, made ``chmod -R a+rX``, and uid 65534
(``setpriv``) takes every lock it can on every file of it (OFD, ``flock`` and
POSIX locks, through whatever descriptor it can open) and holds them; then
``Dataset()``, an append, a delete and a compaction run, each timed. The
helper's locks are printed at the end. ``ZRING_LOCK_WAIT_MS`` bounds a pin's
wait (2000 here).

    python benches/lock_squatter.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "py" / "tests"))
import test_locks  # noqa: E402  (the helper's script and the system python)

import zring  # noqa: E402


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the helper runs as uid 65534")
    root = Path(tempfile.mkdtemp(prefix="zring-squat-"))
    os.chmod(root, 0o755)
    p = root / "s"
    try:
        zring.write_dataset(p, np.arange(20_000, dtype=np.int64), codec="raw")
        subprocess.run(["chmod", "-R", "a+rX", str(p)], check=True)
        helper = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                   test_locks.system_python(), "-c", test_locks.SQUATTER, str(p)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert helper.stdout.readline().strip() == "ready"
        os.environ["ZRING_LOCK_WAIT_MS"] = "2000"

        def timed(name, f):
            t = time.monotonic()
            try:
                f()
                print(f"{name:<10} ok in {time.monotonic() - t:.3f} s")
            except Exception as e:  # noqa: BLE001  (the figure is what happened)
                print(f"{name:<10} {type(e).__name__} after {time.monotonic() - t:.3f} s: {e}")

        def read():
            with zring.Dataset(p) as ds:
                assert ds[19_999] == 19_999

        timed("Dataset()", read)
        timed("append", lambda: zring.write_dataset(p, np.arange(20_000, 30_000, dtype=np.int64), codec="raw",
                                                    append=True))
        with zring.Zrecord(p) as z:
            timed("delete", lambda: z.delete(np.arange(0, 30_000, 3)))
            timed("compact", z.compact)
        helper.stdin.close()
        helper.wait(timeout=30)
        print("uid 65534 held (path, open flags, locks):")
        print(helper.stderr.read().replace(str(p), "STORE"), end="")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
