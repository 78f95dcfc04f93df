"""A store file that shrinks under an open Dataset raises ZringError, not SIGBUS.

Hot records are copied straight out of read-only mappings of the chunk files,
and the record table is mapped too. Truncating one of those files while a
Dataset has it mapped made the next read of the lost pages raise SIGBUS, and
the interpreter died with signal 7. The engine now catches those faults in its
own mappings and raises a typed error; the process lives on.

Each scenario runs in a fresh interpreter, so a regression shows up as a child
killed by SIGBUS (returncode -7) instead of taking pytest down with it. The
child first reads every other record, so the engine remembers the pages as
resident, then cuts the file and reads the records it has not read yet: their
pages are remembered, never asked about again, and gone from the file, so the
copy faults (and no cache can hold the records, as they were never read).
"""

import os
import signal
import subprocess
import sys

import pytest

CHILD = r"""
import os, sys
import numpy as np
import zring

path, kind, cut = sys.argv[1], sys.argv[2], sys.argv[3]
# 1 KiB records, four to a page, no zero bytes.
data = (np.arange(1024 * 256, dtype=np.int32) % 997 + 1).reshape(1024, 256)
zring.write_dataset(path, data, codec="raw")
ds = zring.Dataset(path)
even, odd = np.arange(0, 1024, 2), np.arange(1, 1024, 2)
for _ in range(2):
    assert np.array_equal(ds[even], data[even])
target = sorted(p for p in os.listdir(path) if p.startswith(kind + "-"))[-1]
target = os.path.join(path, target)
os.truncate(target, 0 if cut == "all" else os.path.getsize(target) // 2)
try:
    ds[odd]
except zring.ZringError as e:
    print(type(e).__name__, e)
    sys.exit(0)
print("no error after", kind, "shrank")
sys.exit(3)
"""


@pytest.mark.parametrize("cut", ["all", "half"])
@pytest.mark.parametrize("kind", ["chunk", "table"])
def test_shrunk_file_under_a_dataset_raises(tmp_path, kind, cut):
    env = {k: v for k, v in os.environ.items() if k != "ZRING_MMAP"}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "d"), kind, cut],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode != -signal.SIGBUS, f"the child died of SIGBUS: {r.stderr}"
    assert r.returncode == 0, f"child exited {r.returncode}: {r.stdout}{r.stderr}"
    if kind == "table":
        assert r.stdout.startswith("CorruptError"), r.stdout
        assert "table-" in r.stdout and "shrank" in r.stdout, r.stdout
