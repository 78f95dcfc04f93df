"""Bad inputs raise the right exception types, with messages that say what to fix."""

import numpy as np
import pytest

import zring


@pytest.fixture
def ds(tmp_path):
    zring.write_dataset(tmp_path / "d", np.arange(20, dtype=np.int32).reshape(10, 2))
    with zring.Dataset(tmp_path / "d") as d:
        yield d


def test_hierarchy():
    assert issubclass(zring.ZringError, RuntimeError)
    assert zring.ZrecordError is zring.ZringError
    assert issubclass(zring.ChecksumError, zring.CorruptError)
    for cls in (zring.CorruptError, zring.NotAStoreError, zring.UnsupportedVersionError,
                zring.LockedError, zring.PoisonedError):
        assert issubclass(cls, zring.ZringError)


@pytest.mark.parametrize("idx", [10, -11, 2**40])
def test_int_index_out_of_range(ds, idx):
    with pytest.raises(IndexError, match=f"index {idx} is out of range for length 10"):
        ds[idx]


def test_fancy_index_errors(ds):
    with pytest.raises(IndexError, match="out of range"):
        ds[[0, 10]]
    with pytest.raises(IndexError, match="out of range"):
        ds[np.array([3, -20])]
    with pytest.raises(IndexError, match=r"boolean index has shape \(3,\), expected \(10,\)"):
        ds[np.array([True, False, True])]
    with pytest.raises(IndexError, match="integers or a boolean mask"):
        ds[np.array([1.5])]
    with pytest.raises(IndexError, match="multi-axis"):
        ds[1, 2]
    np.testing.assert_array_equal(ds[[-1, 0]], [[18, 19], [0, 1]])


def test_bad_codec_and_arrays(tmp_path):
    with pytest.raises(ValueError, match=r"unknown codec 'lz4', expected one of"):
        zring.write_dataset(tmp_path / "x", np.zeros(3), codec="lz4")
    with pytest.raises(ValueError, match="sample axis"):
        zring.write_dataset(tmp_path / "x", np.float32(1))
    with pytest.raises(TypeError, match="Python objects"):
        zring.write_dataset(tmp_path / "y", np.array([object(), 1], dtype=object))
    with pytest.raises(ValueError, match="no arrays to write"):
        zring.write_ragged(tmp_path / "z", [])
    with pytest.raises(ValueError, match=r"array 1 has shape \(2, 4\); expected \(rows, \*\(3,\)\)"):
        zring.write_ragged(tmp_path / "z2", [np.zeros((1, 3)), np.zeros((2, 4))])


def test_append_schema_mismatch(tmp_path):
    zring.write_dataset(tmp_path / "d", np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="cannot append"):
        zring.write_dataset(tmp_path / "d", np.zeros((4, 3), np.float32), append=True)
    with pytest.raises(ValueError, match="cannot append"):
        zring.write_dataset(tmp_path / "d", np.zeros((4, 2), np.float64), append=True)
    with zring.Dataset(tmp_path / "d") as ds:
        assert len(ds) == 4, "a refused append adds nothing"


def test_wrong_dataset_kind(tmp_path):
    zring.write_dataset(tmp_path / "d", np.zeros((4, 2), np.float32))
    zring.write_ragged(tmp_path / "r", [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="open it with Dataset"):
        zring.RaggedDataset(tmp_path / "d")
    with pytest.raises(ValueError, match="open it with RaggedDataset"):
        zring.Dataset(tmp_path / "r")


def test_missing_and_not_a_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        zring.Dataset(tmp_path / "nope")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("hello")
    with pytest.raises((zring.NotAStoreError, FileNotFoundError)):
        zring.Dataset(tmp_path / "junk")
    with pytest.raises(zring.NotAStoreError):
        zring.Store(tmp_path / "junk", "r")


def test_store_arguments(tmp_path):
    with pytest.raises(ValueError, match="not a store mode"):
        zring.Store(tmp_path / "s", "w")
    with zring.Zrecord(tmp_path / "z", codec="raw") as z:
        with pytest.raises(ValueError, match="fewer than n"):
            z.append(np.zeros(7, np.uint8), 2, 4)
        with pytest.raises(ValueError, match="C-contiguous"):
            z.append(np.zeros((4, 4), np.uint8)[:, ::2], 2, 4)
        z.append(np.zeros(8, np.uint8), 2, 4)
        with pytest.raises(IndexError):
            z.gather([5], np.zeros(4, np.uint8), 4)
        with pytest.raises(ValueError, match="need"):
            z.gather([0, 1], np.zeros(4, np.uint8), 4)
        with pytest.raises(ValueError, match="read-only"):
            ro = np.zeros(4, np.uint8)
            ro.flags.writeable = False
            z.gather([0], ro, 4)
        with pytest.raises(ValueError, match="non-negative"):
            z.delete([-1])
        with pytest.raises(ValueError, match="unknown codec"):
            zring.Zrecord(tmp_path / "q", codec="gzip")
    with pytest.raises(ValueError, match="closed"):
        len(z)


def test_second_writer_is_locked(tmp_path):
    with zring.Zrecord(tmp_path / "z"):
        with pytest.raises(zring.LockedError):
            zring.Zrecord(tmp_path / "z")
        # readers are fine while a writer holds the lock
        zring.Zrecord(tmp_path / "z", readonly=True).close()


def test_loader_arguments(ds, tmp_path):
    with pytest.raises(ValueError, match="at least one stream"):
        zring.DataLoader({})
    zring.write_dataset(tmp_path / "o", np.zeros(3, np.int8))
    with zring.Dataset(tmp_path / "o") as other:
        with pytest.raises(ValueError, match="same length"):
            zring.DataLoader({"a": ds, "b": other})
    with pytest.raises(TypeError, match="DataLoader reads zring"):
        zring.DataLoader({"a": np.zeros(10)})
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        zring.DataLoader({"a": ds}, batch_size=0)
    with pytest.raises(ValueError, match="mode"):
        zring.DataLoader({"a": ds}, mode=7)
    with pytest.raises(ValueError, match="shard"):
        zring.DataLoader({"a": ds}, batch_size=4, shard=(3, 3))
    with pytest.raises(TypeError, match="no length"):
        with zring.DataLoader({"a": ds}, batch_size=4) as dl:
            len(dl)


def test_a_loader_over_a_bare_dataset_says_to_pass_a_dict(ds, tmp_path):
    # DataLoader(zring.Dataset(p)) failed inside dict() with a message about
    # sequence elements.
    zring.write_ragged(tmp_path / "r", [np.arange(3)])
    with zring.RaggedDataset(tmp_path / "r") as ragged:
        for bare in (ds, ragged, [ds]):
            with pytest.raises(TypeError, match=r'dict of named streams, such as DataLoader\(\{"x": ds\}, ...\)') as e:
                zring.DataLoader(bare)
            assert type(bare).__name__ in str(e.value)


def test_pad_errors():
    with pytest.raises(ValueError, match="over max_len=2"):
        zring.pad(np.zeros(5), [0, 3, 5], max_len=2)
    with pytest.raises(ValueError, match="non-decreasing"):
        zring.pad(np.zeros(5), [0, 3, 1])
