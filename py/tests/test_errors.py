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


def test_schedule_points_refuse_strings_and_fractional_steps():
    """A point's weights given as the string '11' were read as [1, 1]; a
    step of 1.5 was truncated to 1."""
    with pytest.raises(TypeError, match=r"schedule point 0's weights .*sequence of numbers.*'11'"):
        zring.schedule({0: "11"})
    with pytest.raises(TypeError, match=r"schedule point 1's weights .*str '2'"):
        zring.schedule([(0, [1, 1]), (5, [1, "2"])])
    with pytest.raises(TypeError, match=r"schedule point 1's step must be an int, got float 1.5"):
        zring.schedule([(0, [1, 1]), (1.5, [1, 2])])
    with pytest.raises(TypeError, match=r"schedule point 1's step must be an int, got bool"):
        zring.schedule([(0, [1, 1]), (True, [1, 2])])
    with pytest.raises(ValueError, match=r"schedule point 1's step must be >= 0 and <= 2\*\*64 - 1, got 18446744073709551616"):
        zring.schedule([(0, [1, 1]), (2**64, [1, 2])])
    assert zring.schedule([(0, [1, 1]), (np.int64(5), [1, 2])]).points[1] == (5, [1.0, 2.0])


def test_huge_weights_are_refused_not_normalised_to_zeros(ds):
    """Weights of 1e308 summed to inf, and normalised to [0, 0]."""
    with pytest.raises(ValueError, match=r"weights sum to more than the largest float.*scale them down"):
        zring.mix([{"x": ds}, {"x": ds}], [1e308, 1e308])
    with pytest.raises(ValueError, match=r"sum to more than the largest float"):
        zring.schedule([(0, [1e308, 1e308])])
    with pytest.raises(ValueError, match=r"weights must be positive and finite"):
        zring.mix([{"x": ds}, {"x": ds}], [float("inf"), 1])
    with pytest.raises(TypeError, match=r"weights must be a sequence of numbers, got str '11'"):
        zring.mix([{"x": ds}, {"x": ds}], "11")
    # Large weights whose sum is finite normalise as they should.
    m = zring.mix([{"x": ds}, {"x": ds}], [8e307, 8e307])
    np.testing.assert_allclose(m.weights, [0.5, 0.5])


@pytest.mark.parametrize("kw, exc, match", [
    ({"batch_size": 1.5}, TypeError, r"batch_size must be an int, got float 1.5"),
    ({"batch_size": 4.0}, TypeError, r"batch_size must be an int, got float 4.0"),
    ({"batch_size": True}, TypeError, r"batch_size must be an int, got bool"),
    ({"batch_size": "4"}, TypeError, r"batch_size must be an int, got str '4'"),
    ({"batch_size": 2**64}, ValueError, r"batch_size must be >= 1 and <= 2\*\*64 - 1, got 18446744073709551616"),
    ({"seed": -1}, ValueError, r"seed must be >= 0 and <= 2\*\*64 - 1, got -1"),
    ({"seed": 2**64}, ValueError, r"seed must be >= 0 and <= 2\*\*64 - 1"),
    ({"seed": 0.5}, TypeError, r"seed must be an int, got float 0.5"),
    ({"shard": (0, 2**32)}, ValueError, r"shard count must be >= 1 and <= 2\*\*32 - 1"),
    ({"shard": (0.5, 2)}, TypeError, r"shard index must be an int, got float 0.5"),
    ({"num_workers": 2**64}, ValueError, r"num_workers must be >= 1 and <= 2\*\*64 - 1"),
])
def test_loader_integers_are_checked_not_truncated_or_overflowed(ds, kw, exc, match):
    kw = {"batch_size": 2, **kw}
    with pytest.raises(exc, match=match):
        zring.DataLoader({"x": ds}, **kw)


def test_loader_state_at_a_step_is_checked(ds):
    with zring.DataLoader({"x": ds}, batch_size=2) as dl:
        assert dl._state_at(3)["sampler"]["step"] == 3
        with pytest.raises(TypeError, match=r"step must be an int, got float 1.5"):
            dl._state_at(1.5)
        with pytest.raises(ValueError, match=r"step must be >= 0 and <= 2\*\*64 - 1, got -1"):
            dl._state_at(-1)


def test_sampler_integers_are_checked():
    s = zring.Sampler(10, 2, 1, seed=3)
    with pytest.raises(TypeError, match=r"step must be an int, got float 1.5"):
        s.seek(1.5)
    with pytest.raises(ValueError, match=r"step must be >= 0 and <= 2\*\*64 - 1, got 18446744073709551616"):
        s.seek(2**64)
    with pytest.raises(ValueError, match=r"step must be >= 0"):
        s.batch(-1)
    with pytest.raises(TypeError, match=r"step must be an int"):
        s.batch(2.0)
    with pytest.raises(ValueError, match=r"seed must be >= 0 and <= 2\*\*64 - 1, got 18446744073709551616"):
        zring.Sampler(10, 2, 1, seed=2**64)
    with pytest.raises(ValueError, match=r"seed must be >= 0"):
        zring.Sampler(10, 2, 1, seed=-1)
    with pytest.raises(TypeError, match=r"batch_size must be an int, got float 2.5"):
        zring.Sampler(10, 2.5, 1)
    s.seek(np.uint64(4))
    assert s.step == 4


def test_mixture_allocation_integers_are_checked(ds):
    m = zring.mix([{"x": ds}, {"x": ds}], [1, 3])
    assert m.allocation(8).tolist() == [2, 6]
    with pytest.raises(TypeError, match=r"rows must be an int, got float 8.5"):
        m.allocation(8.5)
    with pytest.raises(ValueError, match=r"batch_size must be >= 1 and <= 2\*\*64 - 1, got 18446744073709551616"):
        m.allocation(8, 2**64)


def test_rank_parts_refuse_fractions_and_out_of_range(tmp_path):
    """rank_parts=(0, 1.5) was read as (0, 1); a rank past u32 was a bare
    OverflowError."""
    p = tmp_path / "p"
    zring.write_dataset(p, np.arange(8, dtype=np.int64))
    for bad, exc, match in (((0, 1.5), TypeError, r"rank_parts' ranks must be an int, got float 1.5"),
                            ((False, 2), TypeError, r"rank_parts' rank must be an int, got bool"),
                            ((0, 2**32), ValueError, r"rank_parts' ranks must be >= 0 and <= 2\*\*32 - 1"),
                            ((-1, 2), ValueError, r"rank_parts' rank must be >= 0"),
                            ((0,), TypeError, r"rank_parts must be a \(rank, ranks\) pair")):
        with pytest.raises(exc, match=match):
            zring.Dataset(p, rank_parts=bad)
    with pytest.raises(TypeError, match=r"rank_parts' ranks must be an int, got float 1.5"):
        zring.DataLoader({"x": zring.Dataset(p)}, batch_size=2, rank_parts=(0, 1.5))
    with pytest.raises(ValueError, match=r"cache_bytes must be >= 0 and <= 2\*\*64 - 1, got 18446744073709551616"):
        zring.Dataset(p, cache_bytes=2**64)
