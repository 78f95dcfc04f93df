"""A store of thousands of chunk files opens, gathers and feeds a DataLoader in
a process limited to 64 open files (``ulimit -n 64``): chunk files are opened
when read, through a descriptor cache bounded by the limit."""

import subprocess
import sys
import textwrap

import numpy as np

import zring
from zring import _schema

CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # before zring looks at it
    import numpy as np, zring
    path, n = sys.argv[1], int(sys.argv[2])
    want = (np.arange(n, dtype=np.int64) * 7919) % 1000003
    ds = zring.Dataset(path)
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx = rng.integers(0, n, 256)
        assert np.array_equal(ds[idx], want[idx])
    assert np.array_equal(ds[:], want)
    with zring.DataLoader({"x": ds}, batch_size=128, num_workers=2, mode=2) as dl:
        for _ in range(40):
            batch = next(dl)
            assert np.array_equal(batch["x"], want[dl.last_indices])
    print("ok", flush=True)
    """
)


def test_thousands_of_chunks_under_ulimit_64(tmp_path):
    n = 3000
    values = (np.arange(n, dtype=np.int64) * 7919) % 1000003
    # One 8-byte record per chunk file.
    with zring.Store(str(tmp_path / "d"), "a", codec="raw", chunk_bytes=8) as s:
        s.append_fixed(values.view(np.uint8), 8, None)
        s.set_schema(_schema.dumps(_schema.fixed_schema(np.dtype(np.int64), (), "raw")))
        s.sync()
    assert sum(1 for p in (tmp_path / "d").iterdir() if p.name.startswith("chunk-")) == n
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "d"), str(n)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
