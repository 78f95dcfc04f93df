"""zring.mix: weighted mixtures in a DataLoader, exact per batch and over
the run, each source covered by its own sampler, resumable and shardable."""

import numpy as np
import pytest

import zring

B = 24
LENGTHS = (120, 37, 53)  # 53 is prime: its cyclic stream uses one index per sampler step


@pytest.fixture
def sources(tmp_path):
    out = []
    for k, n in enumerate(LENGTHS):
        x = np.arange(n, dtype=np.int64) * 10 + k
        zring.write_dataset(tmp_path / f"x{k}", x)
        zring.write_ragged(tmp_path / f"r{k}", [np.full(int(i % 4), i * 10 + k, np.int32) for i in range(n)])
        out.append({"x": zring.Dataset(tmp_path / f"x{k}"), "r": zring.RaggedDataset(tmp_path / f"r{k}")})
    return out


def _run(loader, steps):
    got = []
    for _ in range(steps):
        b = next(loader)
        got.append((loader.last_step, loader.last_sources.copy(), loader.last_indices.copy(), b))
    return got


def test_every_batch_holds_each_share_and_the_run_is_exact(sources):
    w = np.array([0.5, 0.3, 0.2])  # 12, 7.2 and 4.8 rows of 24: the remainders must carry
    with zring.DataLoader(zring.mix(sources, w), batch_size=B, mode=2, seed=1, num_workers=2) as dl:
        got = _run(dl, 60)
    share = w / w.sum() * B
    total = np.zeros(3)
    for t, (step, src, idx, batch) in enumerate(got):
        assert step == t
        counts = np.bincount(src, minlength=3)
        assert counts.sum() == B
        assert np.all(np.abs(counts - share) < 2), counts
        assert counts[0] == 12 and set(counts[1:]) <= {4, 5, 6, 7, 8}, counts
        total += counts
        assert np.all(np.abs(total - share * (t + 1)) < 1), "the remainders carry over"
        # rows are the records named, source by source
        np.testing.assert_array_equal(batch["x"], idx * 10 + src)
        values, splits = batch["r"]
        for row in (0, B - 1):
            np.testing.assert_array_equal(values[splits[row]:splits[row + 1]],
                                          np.full(idx[row] % 4, idx[row] * 10 + src[row], np.int32))


def test_each_source_covers_its_records_once_per_cycle(sources):
    with zring.DataLoader(zring.mix(sources, [1, 1, 1]), batch_size=B, mode=2, seed=4, num_workers=1) as dl:
        got = _run(dl, 40)
    for k, n in enumerate(LENGTHS):
        drawn = np.concatenate([idx[src == k] for _, src, idx, _ in got])
        assert len(drawn) >= 2 * n
        for c in range(2):
            assert sorted(drawn[c * n:(c + 1) * n]) == list(range(n)), f"source {k}, cycle {c}"


def test_resume_is_exact_and_shards_make_the_global_batch(sources):
    m = zring.mix(sources, [3, 2, 1])
    with zring.DataLoader(m, batch_size=B, mode=1, seed=9) as dl:
        ref = _run(dl, 12)
    with zring.DataLoader(m, batch_size=B, mode=1, seed=9) as dl:
        _run(dl, 5)
        state = dl.state()
    with zring.DataLoader(m, state=state) as dl:
        again = _run(dl, 7)
    for (s1, src1, i1, b1), (s2, src2, i2, b2) in zip(ref[5:], again):
        assert s1 == s2
        np.testing.assert_array_equal(src1, src2)
        np.testing.assert_array_equal(b1["x"], b2["x"])
    parts = []
    for k in range(3):
        with zring.DataLoader(m, batch_size=B, mode=1, seed=9, shard=(k, 3)) as dl:
            parts.append(_run(dl, 4))
    for t in range(4):
        np.testing.assert_array_equal(np.concatenate([p[t][3]["x"] for p in parts]), ref[t][3]["x"])
        np.testing.assert_array_equal(np.concatenate([p[t][1] for p in parts]), ref[t][1])


def test_bad_mixtures_are_value_errors(sources, tmp_path):
    for weights, match in (([1, 2], "2 weights for 3 sources"), ([1, 0, 1], "positive"),
                           ([1, -1, 1], "positive"), ([1, float("nan"), 1], "positive")):
        with pytest.raises(ValueError, match=match):
            zring.mix(sources, weights)
    zring.write_dataset(tmp_path / "f32", np.zeros(LENGTHS[1], np.float32))
    with pytest.raises(ValueError, match="source 1 stream 'x'"):
        zring.mix([sources[0], {"x": zring.Dataset(tmp_path / "f32"), "r": sources[1]["r"]}], [1, 1])
    with pytest.raises(ValueError, match="source 1 has streams"):
        zring.mix([sources[0], {"x": sources[1]["x"]}], [1, 1])
    with pytest.raises(ValueError, match="less than one row"):
        zring.DataLoader(zring.mix(sources, [1000, 1, 1]), batch_size=B)
    with pytest.raises(ValueError, match="another mixture"):
        state = {"sampler": {"step": 0, "batch_size": B, "mode": 1, "seed": 0},
                 "mixture": {"weights": [0.5, 0.5], "lengths": [1, 2]}}
        zring.DataLoader(zring.mix(sources, [1, 1, 1]), state=state)


def test_zring_jax_checkpoints_a_mixture(sources):
    zjax = pytest.importorskip("zring.jax")
    pytest.importorskip("jax")
    m = zring.mix([{"x": s["x"]} for s in sources], [2, 1, 1])
    with zring.DataLoader(m, batch_size=B, mode=2, seed=2) as dl:
        ref = [np.asarray(next(dl)["x"]) for _ in range(8)]
    dl = zring.DataLoader(m, batch_size=B, mode=2, seed=2)
    batches = zjax.device_prefetch(dl)
    for t in range(3):
        np.testing.assert_array_equal(np.asarray(next(batches)["x"]), ref[t])
    state = batches.state()
    batches.close()
    assert state["step"] == 3 and state["mixture"]["lengths"] == list(LENGTHS)
    with zjax.restore_loader(m, state) as again:
        for t in range(3, 8):
            np.testing.assert_array_equal(next(again)["x"], ref[t])
    other = zring.mix([{"x": s["x"]} for s in sources], [1, 1, 1])
    with pytest.raises((ValueError, zjax.StateMismatchError)):
        zjax.restore_loader(other, state)
