"""zring.schedule: mixture weights as a function of the step.

Before schedules a mixture's weights were fixed for the run, and a state
resumed under other weights was refused (MixtureMismatch). These tests hold
the documented rule (zring._schedule): after t steps each source's target
is B times the integral of its weight, the rows so far are the targets'
largest-remainder rounding (every source a row per batch or more), so within
a row of them, and each step is a function of its number (resume and seek
exact); a state resumed under another schedule keeps every step before its
step and follows the new weights from there; only sources of other lengths
are refused.
"""

import json

import numpy as np
import pytest

import zring
from zring._schedule import allocation, pieces_targets

B = 32
LENGTHS = (400, 300, 200)


@pytest.fixture
def sources(tmp_path):
    out = []
    for k, n in enumerate(LENGTHS):
        zring.write_dataset(tmp_path / f"x{k}", np.arange(n, dtype=np.int64) * 10 + k)
        out.append({"x": zring.Dataset(tmp_path / f"x{k}")})
    return out


def _check_step(pieces, t, counts, total):
    """Step t's counts are the loader's pure function of the step, and the
    rows so far (``total``, after step t) are the NumPy targets rounded down
    or up: the largest remainders, but for float noise between remainders
    that are equal in exact arithmetic."""
    want = allocation(pieces, B, (t + 1) * B) - allocation(pieces, B, t * B)
    np.testing.assert_array_equal(counts, want, err_msg=f"step {t}")
    target = pieces_targets(pieces, t + 1, B)
    assert np.all((total == np.floor(target)) | (total == np.ceil(target))), (t, total, target)


def _pieces(schedule):
    return [{"from": 0, "points": [{"step": s, "weights": list(np.asarray(w) / np.sum(w))}
                                   for s, w in schedule.corners]}]


def _steps(dl, n):
    out = []
    for _ in range(n):
        next(dl)
        out.append((dl.last_step, dl.last_sources.copy(), dl.last_indices.copy()))
    return out


def test_each_step_is_the_rounding_of_the_integral(sources):
    s = zring.schedule([(0, [0.6, 0.3, 0.1]), (40, [0.2, 0.3, 0.5]), (80, [0.3, 0.6, 0.1])])
    pieces = _pieces(s)
    with zring.DataLoader(zring.mix(sources, s), batch_size=B, mode=2, seed=3) as dl:
        got = _steps(dl, 120)
    total = np.zeros(3, np.int64)
    for t, (step, src, idx) in enumerate(got):
        assert step == t
        counts = np.bincount(src, minlength=3)
        total += counts
        _check_step(pieces, t, counts, total)
        # Rows name their own source's records.
        np.testing.assert_array_equal(idx * 10 + src, idx * 10 + src)
    # A step's share is the weights at its middle: step 20 of the ramp.
    mid = s.weights_at(20.5) * B
    assert np.all(np.abs(np.bincount(got[20][1], minlength=3) - mid) <= 2)


def test_a_stepped_schedule_holds_each_stair(sources):
    s = zring.schedule({0: [1, 1, 2], 10: [0, 1, 0], 20: [1, 1, 1]}, interpolate="step")
    assert s.corners[1:3] == [(10, [1.0, 1.0, 2.0]), (10, [0.0, 1.0, 0.0])]
    with zring.DataLoader(zring.mix(sources, s), batch_size=B, mode=2, seed=3) as dl:
        got = _steps(dl, 25)
    for t in range(10, 20):
        np.testing.assert_array_equal(np.bincount(got[t][1], minlength=3), [0, B, 0])
    m = zring.mix(sources, s)
    np.testing.assert_array_equal(m.allocation(15 * B, B), [80, 80 + 5 * B, 160])


def test_resume_and_seek_are_exact_and_shards_take_their_slices(sources):
    s = zring.schedule([(0, [0.7, 0.2, 0.1]), (50, [0.1, 0.2, 0.7])])
    m = zring.mix(sources, s)
    with zring.DataLoader(m, batch_size=B, mode=2, seed=4) as dl:
        first = _steps(dl, 30)
        state = json.loads(json.dumps(dl.state()))
        rest = _steps(dl, 30)
    with zring.DataLoader(m, state=state) as dl:
        again = _steps(dl, 30)
    for a, b in zip(rest, again):
        assert a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    with zring.DataLoader(m, state=state, shard=(1, 4)) as dl:
        part = _steps(dl, 5)
    for a, b in zip(rest, part):
        np.testing.assert_array_equal(a[2][8:16], b[2])
    assert first[0][0] == 0


def test_a_new_schedule_takes_over_at_the_saved_step(sources):
    old = zring.schedule([(0, [0.7, 0.2, 0.1]), (100, [0.1, 0.2, 0.7])])
    new = zring.schedule([(0, [0.2, 0.6, 0.2])])
    with zring.DataLoader(zring.mix(sources, old), batch_size=B, mode=2, seed=4) as dl:
        before = _steps(dl, 40)
        state = dl.state()
        after_old = _steps(dl, 1)
    with zring.DataLoader(zring.mix(sources, new), state=state) as dl:
        after = _steps(dl, 40)
        saved = dl.state()
    pieces = saved["mixture"]["schedule"]
    assert [p["from"] for p in pieces] == [0, 40]
    # Every source's stream goes on where the old run left it.
    for k in range(3):
        assert after_old[0][2][after_old[0][1] == k][0] == after[0][2][after[0][1] == k][0]
    total = allocation(pieces, B, 40 * B)
    for t, src, _ in after:
        counts = np.bincount(src, minlength=3)
        total += counts
        _check_step(pieces, t, counts, total)
    # From step 40 on each step holds 0.2/0.6/0.2 of 32 rows (6.4, 19.2, 6.4).
    assert all(np.all(np.abs(np.bincount(s, minlength=3) - [6.4, 19.2, 6.4]) < 2) for _, s, _ in after)
    # Resumed again under the same new weights: it goes on with the same pieces.
    with zring.DataLoader(zring.mix(sources, new), state=saved) as dl:
        next(dl)
        assert dl.state()["mixture"]["schedule"] == pieces
    # And a state resumed at its own step 0 just takes the new weights
    # (fixed ones here: no schedule left).
    with zring.DataLoader(zring.mix(sources, old), batch_size=B, mode=2, seed=4) as dl:
        start = dl.state()
    with zring.DataLoader(zring.mix(sources, new), state=start) as dl:
        next(dl)
        mixture = dl.state()["mixture"]
    assert "schedule" not in mixture and np.allclose(mixture["weights"], [0.2, 0.6, 0.2])
    assert len(before) == 40


def test_fixed_weights_resumed_under_other_fixed_weights(sources):
    with zring.DataLoader(zring.mix(sources, [1, 1, 1]), batch_size=B, mode=2, seed=4) as dl:
        _steps(dl, 10)
        state = dl.state()
        assert "schedule" not in state["mixture"]
    with zring.DataLoader(zring.mix(sources, [0.5, 0.25, 0.25]), state=state) as dl:
        got = _steps(dl, 10)
        pieces = dl.state()["mixture"]["schedule"]
    assert [p["from"] for p in pieces] == [0, 10]
    for _, src, _ in got:
        assert np.all(np.abs(np.bincount(src, minlength=3) - [16, 8, 8]) <= 1)


def test_only_changed_data_is_refused(sources, tmp_path):
    s = zring.schedule([(0, [0.5, 0.3, 0.2]), (10, [0.2, 0.3, 0.5])])
    with zring.DataLoader(zring.mix(sources, s), batch_size=B, mode=2, seed=4) as dl:
        next(dl)
        state = dl.state()
    zring.write_dataset(tmp_path / "short", np.arange(150, dtype=np.int64))
    other = [sources[0], sources[1], {"x": zring.Dataset(tmp_path / "short")}]
    with pytest.raises(ValueError, match="the data changed"):
        zring.DataLoader(zring.mix(other, s), state=state)


def test_small_weights_under_a_schedule(sources):
    """A source ramping from 0.001 to 0.05 at 32 rows (0.03 to 1.6 rows a
    step) takes the rounding tree: counts are whole and add up, and each
    source stays within a row of its target over 400 steps."""
    s = zring.schedule([(0, [0.899, 0.1, 0.001]), (300, [0.85, 0.1, 0.05])])
    pieces = _pieces(s)
    with zring.DataLoader(zring.mix(sources, s), batch_size=B, mode=2, seed=4) as dl:
        got = _steps(dl, 400)
    total = np.zeros(3, np.int64)
    for t, (_, src, _) in enumerate(got):
        total += np.bincount(src, minlength=3)
        assert np.all(np.abs(total - pieces_targets(pieces, t + 1, B)) < 1), (t, total)
    m = zring.mix(sources, s)
    np.testing.assert_array_equal(m.allocation(400 * B, B), total)


def test_bad_schedules_are_value_errors(sources):
    for points, match in (([], "at least one"), ([(5, [1, 1, 1])], "starts at step 0"),
                          ([(0, [1, 1, 1]), (0, [1, 1, 1])], "not after"), ([(0, [1, 1])], "2 weights a point"),
                          ([(0, [1, -1, 1])], ">= 0"), ([(0, [0, 0, 0])], "not all 0"),
                          ([(0, [1, 1, 0]), (9, [1, 2, 0])], "source 2 has weight 0 at every point")):
        with pytest.raises(ValueError, match=match):
            zring.mix(sources, zring.schedule(points))
    with pytest.raises(ValueError, match="interpolate"):
        zring.schedule([(0, [1, 1, 1])], interpolate="cubic")


def test_global_loader_follows_a_schedule_and_resumes_it(sources):
    """zring.jax checkpoints held only a mixture's fixed weights: a
    scheduled run's checkpoint must carry the schedule, or the resumed run
    would take the mean weights as its past."""
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = pytest.importorskip("jax")
    import zring.jax as zjax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    s = zring.schedule([(0, [0.7, 0.2, 0.1]), (20, [0.1, 0.2, 0.7])])
    m = zring.mix(sources, s)
    with zring.DataLoader(m, batch_size=B, mode=2, seed=6) as dl:
        want = [np.asarray(next(dl)["x"]) for _ in range(30)]
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))
    with zjax.global_loader(m, B, sharding, mode=2, seed=6, num_workers=1) as g:
        for t in range(12):
            np.testing.assert_array_equal(np.asarray(next(g)["x"]), want[t])
        state = json.loads(json.dumps(g.state()))
    assert state["mixture"]["schedule"][0]["from"] == 0
    with zjax.global_loader(m, B, sharding, state=state, num_workers=1) as g:
        for t in range(12, 30):
            np.testing.assert_array_equal(np.asarray(next(g)["x"]), want[t])
