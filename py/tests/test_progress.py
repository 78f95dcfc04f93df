"""write_dataset shows a tqdm bar when stderr is a terminal, and none otherwise."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, zring
    zring.write_dataset(sys.argv[1], np.zeros((5000, 16), np.uint8), chunk_bytes=4096)
""")


def _run(tmp_path, stderr_fd):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "d")],
                          stderr=stderr_fd, stdout=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0


def test_progress_bar_on_a_tty(tmp_path):
    pytest.importorskip("tqdm", reason="tqdm is not installed")
    master, slave = os.openpty()
    try:
        _run(tmp_path, slave)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the slave side is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    text = out.decode(errors="replace")
    assert "5000/5000" in text or "5.00k/5.00k" in text, text
    assert "rec" in text


def test_no_progress_bar_off_a_tty(tmp_path):
    with open(tmp_path / "err.txt", "wb") as f:
        _run(tmp_path, f.fileno())
    assert (tmp_path / "err.txt").read_bytes() == b""


def test_asked_for_progress_without_tqdm_warns(tmp_path, monkeypatch):
    """tqdm is a dependency, but where it is missing all the same an explicit
    progress=True says so instead of drawing nothing (it used to be silent);
    the store is written either way."""
    import numpy as np
    import zring

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    with pytest.warns(UserWarning, match="tqdm"):
        zring.write_dataset(tmp_path / "d", np.zeros((100, 4), np.uint8), progress=True)
    assert len(zring.Dataset(tmp_path / "d")) == 100
