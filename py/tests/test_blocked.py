"""Mode 3 (blocked) from Python: each cycle visits every record once, a
batch comes from one window of blocks of consecutive records, a state
resumes exactly (block shape included) and two shards concatenate to the
global batch."""

import numpy as np
import pytest

import zring

N, BATCH = 1000, 20  # 50 steps per cycle, no remainder


@pytest.fixture
def ys(tmp_path):
    zring.write_dataset(tmp_path / "y", np.arange(N, dtype=np.int64))
    ds = zring.Dataset(tmp_path / "y")
    yield ds
    ds.close()


def _loader(ys, **kw):
    args = {"batch_size": BATCH, "mode": 3, "seed": 5, "num_workers": 2, "block_records": 10, "window_blocks": 4}
    args.update(kw)
    return zring.DataLoader({"y": ys}, **args)


def test_one_cycle_visits_every_record_once_from_windows_of_blocks(ys):
    with _loader(ys) as dl:
        batches = [next(dl)["y"].copy() for _ in range(N // BATCH)]
    seen = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(seen), np.arange(N))
    # A window holds 4 blocks of 10: a batch spans at most two windows.
    for b in batches:
        assert len(np.unique(b // 10)) <= 8, b


def test_resume_is_exact_and_keeps_the_shape(ys):
    with _loader(ys) as dl:
        for _ in range(7):
            next(dl)
        state = dl.state()
        want = [next(dl)["y"].copy() for _ in range(60)]
    assert state["sampler"]["blocks"] == {"block_records": 10, "window_blocks": 4}
    with zring.DataLoader({"y": ys}, state=state, num_workers=1) as dl2:
        for w in want:
            np.testing.assert_array_equal(next(dl2)["y"], w)
    with pytest.raises(ValueError, match="block_records and window_blocks conflict with a state"):
        zring.DataLoader({"y": ys}, state=state, block_records=10)


def test_two_shards_concatenate_to_the_global_batch(ys):
    with _loader(ys) as full:
        whole = [next(full)["y"].copy() for _ in range(30)]
    parts = []
    for i in range(2):
        with _loader(ys, shard=(i, 2)) as dl:
            parts.append([next(dl)["y"].copy() for _ in range(30)])
    for step in range(30):
        np.testing.assert_array_equal(np.concatenate([parts[0][step], parts[1][step]]), whole[step])


def test_the_sampler_matches_the_loader_and_a_zero_shape_is_refused(ys):
    s = zring.Sampler(N, BATCH, zring.Sampler.Mode.BLOCKED, seed=5, block_records=10, window_blocks=4)
    with _loader(ys) as dl:
        for k in range(5):
            np.testing.assert_array_equal(next(dl)["y"], s.batch(k))
    with pytest.raises(ValueError, match="block_records"):
        zring.Sampler(N, BATCH, 3, block_records=0)
    with pytest.raises(ValueError, match="window_blocks must be"):
        _loader(ys, window_blocks=0)


def test_the_default_shape_is_a_mebibyte_of_records(ys):
    with _loader(ys, block_records=None, window_blocks=None) as dl:
        shape = dl.state()["sampler"]["blocks"]
    # 8-byte records: 1 MiB is 131072 of them.
    assert shape["block_records"] == 131072
    assert shape["window_blocks"] >= 1
