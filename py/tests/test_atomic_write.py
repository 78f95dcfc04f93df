"""write_dataset / write_ragged / ``zring convert`` build beside the target and
rename into place: a failure leaves nothing at the path, an existing path is
an error unless ``overwrite=True`` (or ``append=True``), and nothing is left
behind in the parent directory."""

import os
import stat

import numpy as np
import pytest

import zring
from zring import cli


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _rows(n, start=0):
    for i in range(start, start + n):
        yield np.full(i % 5 + 1, i, dtype=np.int32)


def test_an_exception_part_way_leaves_nothing(tmp_path):
    def failing():
        yield from _rows(50)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        zring.write_ragged(tmp_path / "r", failing(), chunk_bytes=64)  # several appends before it fails
    assert not (tmp_path / "r").exists()

    class Broken(np.ndarray):  # an array whose later blocks cannot be read
        def __getitem__(self, key):
            if isinstance(key, slice) and (key.start or 0) >= 500:
                raise OSError("read error at sample 500")
            return super().__getitem__(key)

    with pytest.raises(OSError, match="sample 500"):
        zring.write_dataset(tmp_path / "d", np.zeros((1000, 8), np.float32).view(Broken), chunk_bytes=100 * 32)
    assert not (tmp_path / "d").exists()
    assert _leftovers(tmp_path) == []


def test_an_existing_path_is_an_error_and_stays_intact(tmp_path):
    data = np.arange(60, dtype=np.int64).reshape(20, 3)
    zring.write_dataset(tmp_path / "d", data)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        zring.write_dataset(tmp_path / "d", data)  # a retried conversion
    with pytest.raises(FileExistsError, match="overwrite=True"):
        zring.write_ragged(tmp_path / "d", _rows(3))
    with zring.Dataset(tmp_path / "d") as ds:
        assert len(ds) == 20
        np.testing.assert_array_equal(ds[:], data)
    assert _leftovers(tmp_path) == []


def test_overwrite_replaces_and_append_adds(tmp_path):
    zring.write_dataset(tmp_path / "d", np.zeros((30, 2), np.int16))
    zring.write_dataset(tmp_path / "d", np.ones((7, 2), np.int16), overwrite=True)
    with zring.Dataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], np.ones((7, 2), np.int16))
    zring.write_dataset(tmp_path / "d", np.full((3, 2), 2, np.int16), append=True)
    with zring.Dataset(tmp_path / "d") as ds:
        assert len(ds) == 10
        np.testing.assert_array_equal(ds[7:], np.full((3, 2), 2, np.int16))
    # A ragged store replaced by a fixed one of another dtype: nothing of the old remains.
    zring.write_ragged(tmp_path / "r", _rows(10))
    zring.write_dataset(tmp_path / "r", np.arange(4, dtype=np.float64), overwrite=True)
    with zring.Dataset(tmp_path / "r") as ds:
        np.testing.assert_array_equal(ds[:], np.arange(4, dtype=np.float64))
    assert _leftovers(tmp_path) == []


def test_a_failed_overwrite_keeps_the_old_store(tmp_path):
    zring.write_ragged(tmp_path / "r", _rows(10))

    def failing():
        yield from _rows(20, start=100)
        raise KeyError("missing field")

    with pytest.raises(KeyError):
        zring.write_ragged(tmp_path / "r", failing(), overwrite=True, chunk_bytes=64)
    with zring.RaggedDataset(tmp_path / "r") as ds:
        assert len(ds) == 10
        np.testing.assert_array_equal(ds[9], np.full(5, 9, np.int32))
    assert _leftovers(tmp_path) == []


def test_overwrite_only_replaces_stores(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("not a store")
    with pytest.raises(FileExistsError, match="is not a zring store .*notes.txt.*nothing was removed"):
        zring.write_dataset(home, np.zeros(3), overwrite=True)
    assert (home / "notes.txt").read_text() == "not a store"
    (tmp_path / "empty").mkdir()
    zring.write_dataset(tmp_path / "empty", np.zeros(3), overwrite=True)
    with zring.Dataset(tmp_path / "empty") as ds:
        assert len(ds) == 3
    with pytest.raises(ValueError, match="exclude each other"):
        zring.write_dataset(tmp_path / "x", np.zeros(3), overwrite=True, append=True)


def test_cli_convert_refuses_an_existing_destination(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.int32).reshape(4, 3))
    assert cli.main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "out")]) == 0
    assert cli.main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "out")]) == 1
    assert "overwrite" in capsys.readouterr().err
    np.save(tmp_path / "b.npy", np.arange(6, dtype=np.int32).reshape(2, 3))
    assert cli.main(["convert", str(tmp_path / "b.npy"), str(tmp_path / "out"), "--overwrite"]) == 0
    with zring.Dataset(tmp_path / "out") as ds:
        np.testing.assert_array_equal(ds[:], np.arange(6, dtype=np.int32).reshape(2, 3))


@pytest.mark.parametrize("mask, mode", [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_a_store_gets_the_mode_the_umask_gives(tmp_path, mask, mode):
    # Stores were made drwx------ (the temporary directory's mode) whatever
    # the umask: nobody else on a shared cluster could read them.
    old = os.umask(mask)
    try:
        zring.write_dataset(tmp_path / "d", np.zeros((3, 2), np.uint8), codec="raw")
        zring.write_dataset(tmp_path / "d", np.ones((3, 2), np.uint8), codec="raw", overwrite=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == mode
    for f in (tmp_path / "d").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & ~mode & 0o777 == 0, f


def test_the_umask_is_read_without_changing_it(tmp_path, monkeypatch):
    # The umask used to be set to 022 and back to read it: a file another
    # thread created in that instant got a wider mode. The engine now makes
    # the directory and lets the kernel apply the umask.
    from zring import _zrecord

    set_to = []
    real = os.umask
    old = real(0o027)
    try:
        monkeypatch.setattr(_zrecord.os, "umask", lambda m: set_to.append(m) or real(m))
        zring.write_dataset(tmp_path / "d", np.zeros((3, 2), np.uint8), codec="raw")
        assert set_to == [], "the umask was changed"
        assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o750
    finally:
        real(old)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only): a disk that fills up."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("how", ["dataset", "ragged", "convert"])
def test_a_full_disk_is_an_oserror_with_its_errno_and_leaves_nothing(small_disk, how):
    # It used to surface as PoisonedError ("... reopen the store"): the close
    # after the failed write hid the OSError a program catches for ENOSPC.
    import errno

    data = np.random.default_rng(0).integers(0, 255, size=(2048, 4096), dtype=np.uint8)  # 8 MiB
    with pytest.raises(OSError) as e:
        if how == "dataset":
            zring.write_dataset(small_disk / "d", data, codec="raw")
        elif how == "ragged":
            zring.write_ragged(small_disk / "d", list(data), codec="raw")
        else:
            np.save(small_disk.parent / "a.npy", data)
            zring.convert(small_disk.parent / "a.npy", small_disk / "d", codec="raw")
    assert e.value.errno == errno.ENOSPC, repr(e.value)
    assert list(small_disk.iterdir()) == []
