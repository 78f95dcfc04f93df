"""zring.mix: weighted mixtures in a DataLoader, each batch within a row of
its shares' rounding and exact over the run, each source covered by its own
sampler, resumable and shardable."""

import hashlib
import threading
import json
from pathlib import Path

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
        # rows are the records named
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


def test_eight_ranks_each_hold_every_share_of_their_32_rows(tmp_path):
    """At 256 rows over 8 ranks, rows grouped by source gave rank 0 only
    source 0 and rank 7 [0, 6, 26]; each rank now holds 0.7/0.2/0.1 of its
    32 rows (22.4, 6.4, 3.2) within a row on every step, and the ranks'
    rows concatenate to the global batch."""
    srcs = []
    for k, n in enumerate((5000, 3000, 2000)):
        zring.write_dataset(tmp_path / f"x{k}", np.arange(n, dtype=np.int64) * 10 + k)
        srcs.append({"x": zring.Dataset(tmp_path / f"x{k}")})
    m = zring.mix(srcs, [0.7, 0.2, 0.1])
    steps = 40
    with zring.DataLoader(m, batch_size=256, mode=2, seed=3) as dl:
        whole = _run(dl, steps)
    ranks = []
    for rank in range(8):
        with zring.DataLoader(m, batch_size=256, mode=2, seed=3, shard=(rank, 8)) as dl:
            ranks.append(_run(dl, steps))
    share = np.array([0.7, 0.2, 0.1]) * 32
    for t in range(steps):
        for rank in range(8):
            counts = np.bincount(ranks[rank][t][1], minlength=3)
            assert np.all(np.abs(counts - share) <= 1), (t, rank, counts)
        np.testing.assert_array_equal(np.concatenate([r[t][3]["x"] for r in ranks]), whole[t][3]["x"])
        np.testing.assert_array_equal(np.concatenate([r[t][1] for r in ranks]), whole[t][1])


def test_a_state_saved_before_interleaving_resumes_grouped(sources):
    """States saved before rows were interleaved have no "order": their runs
    go on with rows source by source, the batches they were saved with."""
    m = zring.mix(sources, [3, 2, 1])
    with zring.DataLoader(m, batch_size=B, mode=2, seed=9) as dl:
        _run(dl, 2)
        state = dl.state()
    assert state["mixture"]["order"] == "Interleaved"
    with zring.DataLoader(m, state=state) as dl:
        interleaved = _run(dl, 3)
    assert any(np.any(np.diff(src) < 0) for _, src, _, _ in interleaved)
    del state["mixture"]["order"]
    with zring.DataLoader(m, state=state) as dl:
        grouped = _run(dl, 3)
        assert dl.state()["mixture"]["order"] == "Grouped"
    for (_, gs, gi, _), (_, s, i, _) in zip(grouped, interleaved):
        assert np.all(np.diff(gs) >= 0), "source by source"
        for k in range(3):
            np.testing.assert_array_equal(gi[gs == k], i[s == k])  # the same records, in other rows


def test_eight_ranks_of_a_packed_mixture_each_hold_every_share(tmp_path):
    """Rows of a packed mixture are allocated by the same mixture: each of 8
    ranks' 32 rows of every step hold 0.7/0.2/0.1 of them within a row."""
    docs = []
    for k in range(3):
        zring.write_ragged(tmp_path / f"d{k}", [np.arange(int(i % 50) + 5, dtype=np.int32) + k
                                                 for i in range(400)])
        docs.append(zring.RaggedDataset(tmp_path / f"d{k}"))
    packed = zring.pack(zring.mix(docs, [0.7, 0.2, 0.1]), 16)
    share = np.array([0.7, 0.2, 0.1]) * 32
    with zring.DataLoader(packed, batch_size=256, mode=2, seed=1) as dl:
        whole = [(next(dl)["tokens"], dl.last_sources.copy()) for _ in range(20)]
    for rank in range(8):
        with zring.DataLoader(packed, batch_size=256, mode=2, seed=1, shard=(rank, 8)) as dl:
            for t in range(20):
                tokens = next(dl)["tokens"]
                counts = np.bincount(dl.last_sources, minlength=3)
                assert np.all(np.abs(counts - share) <= 1), (t, rank, counts)
                np.testing.assert_array_equal(tokens, whole[t][0][32 * rank:32 * (rank + 1)])


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
    with pytest.raises(ValueError, match="the data changed"):
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
    # Other weights are taken from the checkpoint's step on (zring._schedule).
    other = zring.mix([{"x": s["x"]} for s in sources], [1, 1, 1])
    with zjax.restore_loader(other, state) as again:
        next(again)
        pieces = again.state()["mixture"]["schedule"]
    assert [p["from"] for p in pieces] == [0, 3]
    assert np.allclose(pieces[1]["points"][0]["weights"], [1 / 3] * 3)


GOLDEN = Path(__file__).parent / "data" / "mix_golden.json"


def test_the_rust_loader_gives_the_batches_the_python_mixture_gave(tmp_path):
    """Plans recorded from the Python mixture loader this one replaced (see the
    fixture's "recorded_with"): 11 mixtures (2, 3 and 100 sources, prime
    lengths, every mode, shards) at steps from 0 to 123,457 give the same
    sources and indices, so checkpoints of that loader restore."""
    golden = json.loads(GOLDEN.read_text())
    made: dict[int, zring.Dataset] = {}

    def ds(n: int) -> zring.Dataset:
        if n not in made:
            zring.write_dataset(tmp_path / f"d{n}", np.zeros(n, np.uint8))
            made[n] = zring.Dataset(tmp_path / f"d{n}")
        return made[n]

    for case in golden["cases"]:
        m = zring.mix([{"x": ds(n)} for n in case["lengths"]], case["weights"])
        np.testing.assert_array_equal(m.weights, case["normalized"])
        for step, want in case["steps"].items():
            state = {"sampler": {"step": int(step), "batch_size": case["batch_size"], "mode": case["mode"],
                                 "seed": case["seed"]},
                     "shard": {"index": case["shard"][0], "count": case["shard"][1]},
                     "mixture": {"weights": case["normalized"], "lengths": case["lengths"]}}
            with zring.DataLoader(m, state=state, num_workers=1, prefetch_size=1) as dl:
                next(dl)
                src, idx = dl.last_sources, dl.last_indices.astype(np.int64)
            what = f"{len(case['lengths'])} sources, mode {case['mode']}, shard {case['shard']}, step {step}"
            if "sha256" in want:
                got = hashlib.sha256(src.astype("<i8").tobytes() + idx.astype("<i8").tobytes()).hexdigest()
                assert np.bincount(src, minlength=len(case["lengths"])).tolist() == want["counts"], what
                assert got == want["sha256"], what
            else:
                assert src.tolist() == want["sources"], what
                assert idx.tolist() == want["indices"], what


def test_a_transform_runs_on_its_workers_and_its_error_surfaces_at_its_step(sources):
    seen_threads = set()

    def transform(batch):
        seen_threads.add(threading.current_thread().name)
        if transform.calls == 3:  # one worker: calls come in step order
            transform.calls += 1
            raise KeyError("bad row")
        transform.calls += 1
        return batch["x"]

    transform.calls = 0
    m = zring.mix(sources, [0.5, 0.3, 0.2])
    with zring.DataLoader(m, batch_size=B, mode=2, seed=1, num_workers=2, transform=transform,
                          transform_workers=1) as ref_dl:
        got = []
        while True:
            try:
                got.append((ref_dl.last_step, next(ref_dl)))
            except KeyError as e:
                assert "raised by the DataLoader transform at step 3" in str(e.__notes__)
                break
        # the step after the failed one comes next, from the same sources
        assert next(ref_dl) is not None and ref_dl.last_step == 4
        assert ref_dl.last_sources is not None and len(ref_dl.last_sources) == B
    assert len(got) == 3
    assert seen_threads and all(n.startswith("zring-transform-") for n in seen_threads)
    assert not [t for t in threading.enumerate() if t.name.startswith("zring-")], "close() joins every thread"


def test_stats_and_cache_bytes_cover_every_source(sources):
    m = zring.mix(sources, [1, 1, 1])
    with zring.DataLoader(m, batch_size=B, mode=1, seed=1, cache_bytes=1 << 20) as dl:
        for _ in range(5):
            next(dl)
        stats = dl.stats()
        assert sorted(stats["reads"]) == sorted(f"{k}/{n}" for k in range(3) for n in ("x", "r"))
        assert stats["steps_delivered"] >= 5
        # One budget for the process, stated by the loader; no extra handles.
        assert all(r["budget_bytes"] == 1 << 20 for r in stats["reads"].values()), stats["reads"]
        assert not hasattr(dl, "_own")
    assert zring.set_cache_bytes(None) is None, "the loader withdrew its statement at close"


def test_prime_lengths_and_a_hundred_sources(tmp_path):
    lengths = [4099, 101, 53] + [7 + 2 * k for k in range(97)]
    weights = [0.5] + list(np.linspace(0.001, 1 / 99 - 0.001, 99))
    sources = []
    for k, n in enumerate(lengths):
        zring.write_dataset(tmp_path / f"s{k}", np.arange(n, dtype=np.int64) * 1000 + k)
        sources.append({"x": zring.Dataset(tmp_path / f"s{k}")})
    m = zring.mix(sources, weights)
    with zring.DataLoader(m, batch_size=1024, mode=2, seed=5, num_workers=2) as dl:
        total = np.zeros(100, np.int64)
        for t in range(6):
            x = next(dl)["x"]
            src, idx = dl.last_sources, dl.last_indices.astype(np.int64)
            np.testing.assert_array_equal(x, idx * 1000 + src)
            counts = np.bincount(src, minlength=100)
            total += counts
            assert counts.min() >= 1, "every source has a row in every batch"
            np.testing.assert_array_equal(total, m.allocation((t + 1) * 1024))


def test_the_readmes_rounding_holds_at_point_seven_of_256(tmp_path):
    # The README said each batch holds weight × 256 rows "rounded down or up";
    # at 0.7/0.2/0.1 "web" got 178 rows for 179.2. What it says now: the
    # running totals are the shares rounded down or up, and a batch holds its
    # share rounded down or up, or one row further.
    made = []
    for k, n in enumerate((7000, 2000, 1000)):
        zring.write_dataset(tmp_path / f"s{k}", np.zeros(n, np.uint8))
        made.append({"x": zring.Dataset(tmp_path / f"s{k}")})
    m = zring.mix(made, [0.7, 0.2, 0.1])
    share = m.weights * 256
    totals = np.array([m.allocation(t * 256) for t in range(3001)])
    counts = np.diff(totals, axis=0)
    assert np.all(counts >= np.floor(share) - 1) and np.all(counts <= np.ceil(share) + 1)
    assert (counts[:, 0] == 178).any(), "one row below 179.2 rounded down happens"
    exact = np.outer(np.arange(3001), share)
    assert np.all((totals == np.floor(exact)) | (totals == np.ceil(exact)))
    # The loader's batches are those allocations.
    with zring.DataLoader(m, batch_size=256, num_workers=1, seed=3) as dl:
        for t in range(40):
            next(dl)
            np.testing.assert_array_equal(np.bincount(dl.last_sources, minlength=3), counts[t])


def test_sources_of_under_a_row_per_batch_get_their_share_over_the_steps(sources):
    # 0.001 and 0.0001 of 256 rows are 0.256 and 0.0256 rows per batch, which
    # mix refused before. Each source's rows so far stay within a row of its
    # share at every step, the loader delivers those counts, and a run
    # resumed from a saved state (whole or by two shards) continues exactly.
    w = [0.9989, 0.001, 0.0001]
    m = zring.mix(sources, w)
    totals = np.array([m.allocation(t * 256, batch_size=256) for t in range(20_001)])
    exact = np.outer(np.arange(20_001) * 256, m.weights)
    assert np.abs(totals - exact).max(axis=0).max() < 1
    assert np.all(np.diff(totals, axis=0) >= 0) and np.all(totals.sum(axis=1) == np.arange(20_001) * 256)
    assert (np.diff(totals[:, 2]) == 0).sum() > 19_000, "the tiniest source is in few batches"
    np.testing.assert_array_equal(m.allocation(256), [256, 0, 0])  # without batch_size: Hamilton
    with zring.DataLoader(m, batch_size=256, mode=2, seed=4, num_workers=2) as dl:
        total = np.zeros(3, np.int64)
        for t in range(300):
            next(dl)
            total += np.bincount(dl.last_sources, minlength=3)
            np.testing.assert_array_equal(total, totals[t + 1])
        state = dl.state()
        want = _run(dl, 5)
    with zring.DataLoader(m, batch_size=256, mode=2, seed=4, state=state) as dl:
        for (step, src, idx, b), (s2, src2, idx2, b2) in zip(want, _run(dl, 5)):
            assert step == s2
            np.testing.assert_array_equal(src, src2)
            np.testing.assert_array_equal(idx, idx2)
            np.testing.assert_array_equal(b["x"], b2["x"])
    halves = []
    for k in range(2):
        with zring.DataLoader(m, batch_size=256, mode=2, seed=4, state=state, shard=(k, 2)) as dl:
            halves.append(_run(dl, 5))
    for (_, src, idx, b), lo, hi in zip(want, halves[0], halves[1]):
        np.testing.assert_array_equal(np.concatenate([lo[1], hi[1]]), src)
        np.testing.assert_array_equal(np.concatenate([lo[3]["x"], hi[3]["x"]]), b["x"])
