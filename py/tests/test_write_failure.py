"""A write that fails part-way (a full disk, a file-size limit) used to keep
the bytes it had written on disk until the store was next opened for
writing, the handle's ``len()`` counted records never saved, and leaving a
``with`` block after the failure raised ``PoisonedError`` with the disk
error only in ``__context__``. Now the failure gives the unsynced space back
at once, ``len()`` is what is saved, the error names the file, and the
block's own error is the one raised.

A file-size limit (``RLIMIT_FSIZE``) stands in for a full disk: both fail a
write into the chunk file with an OSError, in a child process so the limit
does not reach the test runner.
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = r"""
import errno, os, resource, signal, sys
import numpy as np
import zring

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
p = sys.argv[1]
rec = np.random.default_rng(0).integers(0, 255, size=(2500, 1000), dtype=np.uint8)
z = zring.Zrecord(p, codec="raw")
z.append(rec, 2500, 1000)
z.sync()
sizes = lambda: {n: os.path.getsize(os.path.join(p, n)) for n in os.listdir(p) if n.startswith(("chunk-", "table-"))}
saved = sizes()
biggest = max(saved.values())
resource.setrlimit(resource.RLIMIT_FSIZE, (biggest + (4 << 20), resource.RLIM_INFINITY))
err = None
try:
    with z:
        for _ in range(40):  # 40 MB, unsynced: the chunk passes the limit
            z.append(rec, 2500, 1000)
        z.sync()
except Exception as e:
    err = e
assert isinstance(err, OSError) and not isinstance(err, zring.PoisonedError), repr(err)
assert err.errno == errno.EFBIG, repr(err)
assert "chunk-" in str(err), str(err)
assert sizes() == saved, (sizes(), saved)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
with zring.Zrecord(p, readonly=True) as r:
    assert len(r) == 2500
    out = np.zeros((2500, 1000), np.uint8)
    r.gather(np.arange(2500, dtype=np.uint64), out, 1000)
    assert (out == rec).all()
print("ok")
"""

_LEN = r"""
import resource, signal, sys
import numpy as np
import zring

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
p = sys.argv[1]
rec = np.zeros((2500, 1000), np.uint8)
z = zring.Zrecord(p, codec="raw")
z.append(rec, 2500, 1000)
z.sync()
z.append(rec, 2500, 1000)  # shown to this handle, never saved
assert len(z) == 5000
resource.setrlimit(resource.RLIMIT_FSIZE, (6 << 20, resource.RLIM_INFINITY))
try:
    for _ in range(10):
        z.append(rec, 2500, 1000)
except OSError:
    pass
else:
    raise AssertionError("the append passed the limit")
assert len(z) == 2500, len(z)
z.close()  # after the failure: no error of its own
print("ok")
"""


def _run(script: str, path) -> None:
    r = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_failed_append_in_a_with_block_raises_its_own_error_and_gives_the_space_back(tmp_path):
    _run(_CHILD, tmp_path / "s")


def test_after_a_failed_append_len_is_what_is_saved_and_close_is_quiet(tmp_path):
    _run(_LEN, tmp_path / "s")
