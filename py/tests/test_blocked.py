"""Mode 3 (blocked) from Python: each cycle visits every record once, a
batch comes from one window of blocks of consecutive records, a state
resumes exactly (block shape included), two shards of an unsplit state
concatenate to the global batch, and shards started with ``shard=`` draw
from blocks of their own."""

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


def test_resume_with_the_states_own_shape_is_accepted_and_another_refused(ys):
    """Regression: resuming with the same ``block_records=``/``window_blocks=``
    was refused (a state fixes the shape, and any value given with one was
    taken for a conflict). The state's own values are accepted and resume
    exactly; another value is a ValueError naming both."""
    with _loader(ys) as dl:
        for _ in range(3):
            next(dl)
        state = dl.state()
        want = [next(dl)["y"].copy() for _ in range(20)]
    for kw in ({"block_records": 10, "window_blocks": 4}, {"block_records": 10}, {"window_blocks": 4}):
        with zring.DataLoader({"y": ys}, state=state, num_workers=1, **kw) as dl2:
            for w in want:
                np.testing.assert_array_equal(next(dl2)["y"], w)
    with pytest.raises(ValueError, match="block_records=11 conflicts with the state.*block_records=10"):
        zring.DataLoader({"y": ys}, state=state, block_records=11)
    with pytest.raises(ValueError, match="window_blocks=5 conflicts with the state.*window_blocks=4"):
        zring.DataLoader({"y": ys}, state=state, block_records=10, window_blocks=5)
    with zring.DataLoader({"y": ys}, batch_size=BATCH, mode=2, seed=5) as cyclic:
        other = cyclic.state()
    with pytest.raises(ValueError, match="block_records=10 conflicts with the state.*mode 3 only"):
        zring.DataLoader({"y": ys}, state=other, block_records=10)


def test_mode_3_at_prefetch_size_1_does_not_hang(ys):
    """Regression: a mode-3 loader with ``prefetch_size=1`` hung forever in
    ``next()`` (the consumer's wakeup went to the window-prefetch thread
    instead of a worker). A watchdog thread fails the test instead of
    hanging it."""
    import threading

    out: list = []

    def run():
        with _loader(ys, prefetch_size=1, num_workers=1) as dl:
            out.extend(next(dl)["y"].copy() for _ in range(1000))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "mode 3 with prefetch_size=1 did not deliver 1000 steps within 60 s"
    assert len(out) == 1000
    s = zring.Sampler(N, BATCH, zring.Sampler.Mode.BLOCKED, seed=5, block_records=10, window_blocks=4)
    for k in (0, 1, 499, 999):
        np.testing.assert_array_equal(out[k], s.batch(k))


def test_two_shards_of_an_unsplit_state_concatenate_to_the_global_batch(ys):
    """A state saved without shards (or before mode 3 split its cycles per
    shard) resumes on any shard count, the shards' slices making its global
    batches; a run started with ``shard=`` splits its cycles instead, so
    its batches are others."""
    with _loader(ys) as full:
        state = full.state()
        whole = [next(full)["y"].copy() for _ in range(30)]
    parts, split = [], []
    for i in range(2):
        with zring.DataLoader({"y": ys}, state=state, shard=(i, 2), num_workers=1) as dl:
            parts.append([next(dl)["y"].copy() for _ in range(30)])
        with _loader(ys, shard=(i, 2)) as dl:
            split.append([next(dl)["y"].copy() for _ in range(30)])
    for step in range(30):
        np.testing.assert_array_equal(np.concatenate([parts[0][step], parts[1][step]]), whole[step])
    assert any((np.concatenate([split[0][k], split[1][k]]) != whole[k]).any() for k in range(30))


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


def test_shards_draw_from_blocks_of_their_own_and_resume_with_their_count(ys):
    """With ``shard=(k, 4)`` the cycles are split: each rank's rows come
    from its own blocks (a quarter of them), the ranks' rows of a cycle are
    every record once, and the state resumes only with 4 shards."""
    rows, states = [], []
    for k in range(4):
        with _loader(ys, shard=(k, 4)) as dl:
            mine = [next(dl)["y"].copy() for _ in range(N // BATCH)]
            states.append(dl.state())
        rows.append(np.concatenate(mine))
        # Its own blocks only: a quarter of the 100 blocks of 10, and the
        # two it shares at the cuts of the cycle's block order.
        assert len(np.unique(rows[-1] // 10)) <= 100 // 4 + 2, k
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(N))
    assert states[0]["sampler"]["blocks"] == {"block_records": 10, "window_blocks": 4, "shards": 4}
    with _loader(ys, shard=(1, 4)) as dl:
        for _ in range(3):
            next(dl)
        state = dl.state()
        want = [next(dl)["y"].copy() for _ in range(10)]
    with zring.DataLoader({"y": ys}, state=state, shard=(1, 4), num_workers=1) as dl2:
        for w in want:
            np.testing.assert_array_equal(next(dl2)["y"], w)
    with pytest.raises(ValueError, match="split for 4 shards.*shard=\\(k, 4\\)"):
        zring.DataLoader({"y": ys}, state=state, shard=(0, 2))


_PACKED_DIGEST = """
import hashlib, json, sys
import zring
docs = zring.RaggedDataset(sys.argv[1], **json.loads(sys.argv[2]))
h = hashlib.sha256()
with zring.DataLoader(zring.pack(docs, 1024, labels=True), batch_size=8, mode=3, seed=3, num_workers=2) as dl:
    for _ in range(int(sys.argv[3])):
        b = next(dl)
        for k in ("tokens", "labels", "segment_ids", "positions", "loss_mask"):
            h.update(b[k].tobytes())
print(json.dumps({"digest": h.hexdigest(), "reads": docs.read_stats()}, default=str))
"""


def test_packed_rows_in_mode_3_read_the_document_windows_ahead(tmp_path):
    """``zring.pack`` in mode 3 over documents larger than the store's
    memory: the loader reads each window of the document order ahead (the
    store's ``read_stats()`` shows the windows, and the documents come from
    them), and the rows are the same as a loader that reads each document
    on its own (a process reading the store with no budget, through the
    page cache: a budget is the whole process's)."""
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    lens = 300 + (np.arange(120_000) * 7919) % 401  # 64-document blocks of about 64 KB
    docs = [rng.integers(0, 60_000, size=n, dtype=np.uint16) for n in lens]
    zring.write_ragged(tmp_path / "docs", docs, codec="raw")
    steps = 2500

    def run(budget: dict) -> dict:
        out = subprocess.run([sys.executable, "-c", _PACKED_DIGEST, str(tmp_path / "docs"), json.dumps(budget),
                              str(steps)], capture_output=True, text=True, check=True, timeout=300)
        return json.loads(out.stdout)

    want = run({})
    assert want["reads"]["window_bytes"] == 0 and want["reads"]["policy"] != "direct", want["reads"]
    got = run({"cache_bytes": 110 << 20})  # below the 120 MB of documents
    r = got["reads"]
    assert r["policy"] == "direct" and r["window_bytes"] > 0, r
    assert r["cache_hits"] >= 30_000 and r["cache_misses"] <= 2 * steps, r
    assert got["digest"] == want["digest"]
