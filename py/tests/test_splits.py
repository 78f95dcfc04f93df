"""zring.split: train/validation/test parts of a dataset by record, stable
when the store grows; and the one-pass loader that reads a part once for
evaluation (DataLoader(one_pass=True)), with zring.pack, zring.mix and
zring.jax.global_loader."""

from __future__ import annotations

import numpy as np
import pytest

import zring
from zring._split import assign, parts_of


def _doc(d: int) -> np.ndarray:
    """Document d: tokens d * 100 + j, 1 to 7 of them."""
    return (d * 100 + np.arange(d % 7 + 1)).astype(np.int32)


def _write(path, start: int, stop: int, append: bool = False) -> None:
    zring.write_ragged(str(path), [_doc(d) for d in range(start, stop)], codec="raw", append=append)


def _tokens(records) -> np.ndarray:
    return np.concatenate([_doc(int(d)) for d in records])


def test_weights_become_the_smallest_integer_parts():
    assert parts_of("969,30,1") == [969, 30, 1]
    assert parts_of(" 98, 1 ,1") == [98, 1, 1]
    assert parts_of([0.9, 0.05, 0.05]) == [18, 1, 1]
    assert parts_of("0.969,0.03,0.001") == [969, 30, 1]
    assert parts_of([90, 5, 5]) == [18, 1, 1]
    assert parts_of("100,0,0") == [1, 0, 0]
    for bad in ("", "1,-1", "0,0", "a,b", [1e-9, 1]):
        with pytest.raises(ValueError):
            parts_of(bad)


def test_every_whole_period_holds_each_part_exactly_and_growth_keeps_every_record_in_its_part():
    parts = [17, 2, 1]
    which = assign(20 * 500 + 7, parts, seed=3)
    whole = which[: 20 * 500].reshape(500, 20)
    for k, w in enumerate(parts):
        assert np.all((whole == k).sum(axis=1) == w)
    # Interleaved, not cut into ranges: the small parts are spread through.
    assert np.unique(np.flatnonzero(which == 2) // 1000).size == 10
    grown = assign(20 * 500 + 7 + 1234, parts, seed=3)
    assert np.array_equal(grown[: which.size], which)
    assert not np.array_equal(assign(which.size, parts, seed=4), which), "another seed, another split"


def test_parts_are_disjoint_complete_views_that_read_their_records(tmp_path):
    _write(tmp_path / "d", 0, 2003)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    train, valid, test = zring.split(ds, "969,30,1")
    every = np.concatenate([p.records for p in (train, valid, test)])
    assert np.array_equal(np.sort(every), np.arange(2003)), "disjoint and complete"
    for part, w in zip((train, valid, test), (969, 30, 1)):
        assert np.all(np.diff(part.records.astype(np.int64)) > 0), "in store order"
        assert abs(len(part) - w * 2003 / 1000) <= w
        assert np.array_equal(part[0], _doc(int(part.records[0])))
        assert np.array_equal(part[-1], _doc(int(part.records[-1])))
    values, splits = valid[[3, 0, 5]]
    assert np.array_equal(values, _tokens(valid.records[[3, 0, 5]]))
    padded, lengths = valid.getitems_padded([1, 2])
    assert np.array_equal(padded[0, : lengths[0]], _doc(int(valid.records[1])))
    with pytest.raises(IndexError):
        valid[len(valid)]
    # Fixed-shape datasets and dicts of streams split alike.
    zring.write_dataset(str(tmp_path / "f"), np.arange(2003, dtype=np.int64)[:, None], codec="raw")
    fixed = zring.Dataset(str(tmp_path / "f"))
    parts = zring.split({"x": fixed, "t": ds}, "969,30,1")
    assert np.array_equal(parts[1]["x"].records, valid.records)
    assert np.array_equal(parts[1]["x"][:][:, 0], valid.records.astype(np.int64))
    assert isinstance(parts[1]["x"], zring.Dataset) and isinstance(valid, zring.RaggedDataset)


def test_ranges_are_parts_as_given_and_grow_only_where_open(tmp_path):
    _write(tmp_path / "d", 0, 100)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    a, b, c = zring.split(ds, [(0, 60), (60, 150), (150, None)])
    assert np.array_equal(a.records, np.arange(60)) and np.array_equal(b.records, np.arange(60, 100))
    assert len(c) == 0
    with pytest.raises(ValueError, match="overlap"):
        zring.split(ds, [(0, 60), (50, None)])
    with pytest.raises(ValueError):
        zring.split(ds, [(5, 2)])


def test_a_grown_store_keeps_each_part_and_its_loader_state_resumes(tmp_path):
    path = tmp_path / "d"
    _write(path, 0, 3000)
    ds = zring.RaggedDataset(str(path))
    old = zring.split(ds, "969,30,1", seed=5)
    loader = zring.DataLoader({"x": old[0]}, batch_size=64, mode=2, seed=1)
    for _ in range(10):
        next(loader)
    state = loader.state()
    # The steps the saved run takes up to the end of its cycle.
    per_cycle = len(old[0]) // 64
    want = [loader.next()["x"][0].copy() for _ in range(per_cycle - 10)]
    loader.close()

    _write(path, 3000, 4000, append=True)
    grown_ds = zring.RaggedDataset(str(path))
    new = zring.split(grown_ds, "969,30,1", seed=5)
    added = np.concatenate([p.records[len(o):] for o, p in zip(old, new)])
    for o, p in zip(old, new):
        assert np.array_equal(p.records[: len(o)], o.records), "old records stay, in place"
    assert np.array_equal(np.sort(added), np.arange(3000, 4000)), "each new record in one part"
    resumed = zring.DataLoader({"x": new[0]}, state=state)
    for w in want:
        assert np.array_equal(resumed.next()["x"][0], w)
    # The next cycle draws from the grown part.
    seen = []
    for _ in range(len(new[0]) // 64):
        resumed.next()
        seen.append(resumed.last_indices)
    seen = np.concatenate(seen)
    assert seen.max() >= len(old[0])
    resumed.close()
    with pytest.raises(ValueError, match="changed"):
        zring.DataLoader({"x": new[1]}, state=state)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_every_mode_draws_from_the_part_alone(tmp_path, mode):
    _write(tmp_path / "d", 0, 3000)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    train, valid = zring.split(ds, "90,10")
    loader = zring.DataLoader({"x": valid}, batch_size=30, mode=mode, seed=2, block_records=16, window_blocks=2) \
        if mode == 3 else zring.DataLoader({"x": valid}, batch_size=30, mode=mode, seed=2)
    seen = []
    for _ in range(len(valid) // 30):
        values, _ = next(loader)["x"]
        idx = loader.last_indices
        assert np.array_equal(values, _tokens(valid.records[idx]))
        seen.append(idx)
    seen = np.concatenate(seen)
    assert seen.max() < len(valid)
    if mode in (2, 3):
        assert np.unique(seen).size == seen.size, "without replacement within a cycle"
    loader.close()


def _one_pass(dl) -> list:
    out = []
    for b in dl:
        out.append((dl.last_step, dl.last_indices.copy(), dl.last_valid, b))
    with pytest.raises(StopIteration):
        next(dl)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_one_pass_reads_each_record_once_and_stops(tmp_path, workers):
    _write(tmp_path / "d", 0, 1003)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    transform = (lambda b: b) if workers else None
    kw = {} if transform is None else {"transform": transform, "transform_workers": workers}
    dl = zring.DataLoader({"x": ds}, batch_size=64, one_pass=True, **kw)
    assert len(dl) == 16
    got = _one_pass(dl)
    assert [g[0] for g in got] == list(range(16))
    assert np.array_equal(np.concatenate([g[1] for g in got]), np.arange(1003))
    assert [g[2] for g in got] == [64] * 15 + [43]
    values, splits = got[-1][3]["x"]
    assert splits.size == 44 and np.array_equal(values, _tokens(range(960, 1003)))
    dl.close()

    dl = zring.DataLoader({"x": ds}, batch_size=64, one_pass=True, last_batch="drop", **kw)
    got = _one_pass(dl)
    assert len(got) == len(dl) == 15 and got[-1][2] == 64
    dl.close()

    dl = zring.DataLoader({"x": ds}, batch_size=64, one_pass=True, last_batch="pad", **kw)
    got = _one_pass(dl)
    assert len(got) == 16 and got[-1][2] == 43 and got[-1][1].size == 64
    assert np.array_equal(got[-1][1][:43], np.arange(960, 1003))
    dl.close()


def test_one_pass_shards_cover_the_pass_once_and_resume_in_it(tmp_path):
    _write(tmp_path / "d", 0, 1003)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    _, valid = zring.split(ds, [(0, 900), (900, None)])
    rows = []
    for k in range(4):
        got = _one_pass(zring.DataLoader({"x": valid}, batch_size=16, shard=(k, 4), one_pass=True))
        assert len(got) == 7  # 103 records
        assert [g[1].size for g in got[:-1]] == [4] * 6
        rows.append(np.concatenate([g[1] for g in got]))
    # Last batch: 7 records, so shards 0 and 1 get 4 and 3, the others none.
    assert [r.size - 24 for r in rows] == [4, 3, 0, 0]
    assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(103))

    dl = zring.DataLoader({"x": valid}, batch_size=16, one_pass=True)
    next(dl), next(dl)
    state = dl.state()
    rest = _one_pass(zring.DataLoader({"x": valid}, one_pass=True, state=state))
    assert [g[0] for g in rest] == [2, 3, 4, 5, 6]
    assert np.array_equal(np.concatenate([g[1] for g in rest]), np.arange(32, 103))


def test_one_pass_refuses_what_it_cannot_read_once(tmp_path):
    _write(tmp_path / "a", 0, 100)
    _write(tmp_path / "b", 0, 100)
    a, b = zring.RaggedDataset(str(tmp_path / "a")), zring.RaggedDataset(str(tmp_path / "b"))
    with pytest.raises(ValueError, match="mode 0"):
        zring.DataLoader({"x": a}, batch_size=8, mode=2, one_pass=True)
    with pytest.raises(ValueError, match="last_batch"):
        zring.DataLoader({"x": a}, batch_size=8, one_pass=True, last_batch="short")
    with pytest.raises(ValueError, match="mixture"):
        zring.DataLoader(zring.mix([a, b], [1, 1]), batch_size=8, one_pass=True)
    with pytest.raises(ValueError, match="concat"):
        zring.DataLoader(zring.pack(a, 8, mode="first_fit", pad_id=-1), batch_size=8, one_pass=True)
    state = zring.DataLoader({"x": a}, batch_size=8, mode=2).state()
    with pytest.raises(ValueError, match="mode 0"):
        zring.DataLoader({"x": a}, one_pass=True, state=state)
    with pytest.raises(TypeError, match="endless"):
        len(zring.DataLoader({"x": a}, batch_size=8))
    with pytest.raises(TypeError, match="not a part"):
        zring.split(zring.split(a, "1,1")[0], "1,1")


@pytest.mark.parametrize("last_batch", ["partial", "pad"])
def test_a_packed_pass_holds_every_token_and_label_of_the_part_once(tmp_path, last_batch):
    _write(tmp_path / "d", 0, 2000)
    ds = zring.RaggedDataset(str(tmp_path / "d"))
    _, valid, _ = zring.split(ds, "969,30,1")
    stream = np.concatenate([np.append(_doc(int(d)), -2) for d in valid.records])  # EOD -2
    packed = zring.pack(valid, 16, labels=True, eod_id=-2, pad_id=-1)
    dl = zring.DataLoader(packed, batch_size=8, one_pass=True, last_batch=last_batch)
    rows = -(-stream.size // 16)
    assert len(dl) == -(-rows // 8)
    tokens, pairs = [], []
    for b in _one_pass_batches(dl):
        real = b["segment_ids"] > 0
        tokens.append(b["tokens"][real])
        assert np.all(b["tokens"][~real] == -1) and np.all(b["loss_mask"][~real] == 0)
        m = b["loss_mask"] == 1
        pairs.append(np.stack([b["tokens"][m], b["labels"][m]], axis=1))
    assert np.array_equal(np.concatenate(tokens), stream), "every token once, in order"
    assert np.array_equal(np.concatenate(pairs), np.stack([stream[:-1], stream[1:]], axis=1)), \
        "every label inside the pass once"
    dl.close()


def _one_pass_batches(dl):
    while True:
        try:
            yield next(dl)
        except StopIteration:
            return


def test_mixtures_of_parts_and_parts_of_mixtures(tmp_path):
    _write(tmp_path / "a", 0, 3000)
    _write(tmp_path / "b", 5000, 7000)
    a, b = zring.RaggedDataset(str(tmp_path / "a")), zring.RaggedDataset(str(tmp_path / "b"))
    train_a, valid_a = zring.split(a, "9,1")
    train_b, valid_b = zring.split(b, "9,1")
    # Megatron's blend_per_split: other weights per part.
    for m, parts in ((zring.mix([train_a, train_b], [0.7, 0.3]), (train_a, train_b)),
                     (zring.mix([valid_a, valid_b], [0.5, 0.5]), (valid_a, valid_b))):
        dl = zring.DataLoader(zring.pack(m, 32), batch_size=8, mode=2)
        next(dl)
        dl.close()
        dl = zring.DataLoader(m, batch_size=20, mode=2)
        for _ in range(5):
            values, splits = next(dl)["tokens"]
            docs = [int(parts[s].records[i]) + 5000 * s for s, i in zip(dl.last_sources, dl.last_indices)]
            assert np.array_equal(values, _tokens(docs))
        dl.close()
    train, valid = zring.split(zring.mix([a, b], [0.7, 0.3]), "9,1")
    assert np.array_equal(valid.sources[1]["tokens"].records, valid_b.records)
    assert valid.lengths == [len(valid_a), len(valid_b)] and list(valid.weights) == [0.7, 0.3]
    assert zring.split(zring.mix([a, b], [1, 1]), "1,0")[1] is None, "a part with an empty source"


def test_global_loader_reads_a_part(tmp_path):
    zjax = pytest.importorskip("zring.jax")
    import jax
    from jax.sharding import SingleDeviceSharding

    zring.write_dataset(str(tmp_path / "f"), np.arange(4000, dtype=np.int64)[:, None], codec="raw")
    ds = zring.Dataset(str(tmp_path / "f"))
    train, valid = zring.split({"x": ds}, "9,1")
    sharding = SingleDeviceSharding(jax.devices()[0])
    gl = zjax.global_loader(valid, 16, sharding, mode=2, seed=3)
    want = zring.DataLoader(valid, batch_size=16, mode=2, seed=3)
    for _ in range(5):
        got = np.asarray(next(gl)["x"])
        assert np.array_equal(got, next(want)["x"])
    state = gl.state()
    with pytest.raises(zjax.StateMismatchError):
        zjax.global_loader(train, 16, sharding, state=state)
    gl.close()
    want.close()


def test_global_loader_reads_a_part_once_padded(tmp_path):
    zjax = pytest.importorskip("zring.jax")
    import jax
    from jax.sharding import SingleDeviceSharding

    zring.write_dataset(str(tmp_path / "f"), np.arange(4000, dtype=np.int64)[:, None], codec="raw")
    ds = zring.Dataset(str(tmp_path / "f"))
    _, valid = zring.split({"x": ds}, "9,1")
    n = len(valid["x"])
    sharding = SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(ValueError, match="pad"):
        zjax.global_loader(valid, 64, sharding, one_pass=True)
    gl = zjax.global_loader(valid, 64, sharding, one_pass=True, last_batch="pad")
    batches = [np.asarray(b["x"])[:, 0] for b in gl]
    assert len(batches) == -(-n // 64) and all(b.size == 64 for b in batches)
    real = n - (len(batches) - 1) * 64
    got = np.concatenate(batches[:-1] + [batches[-1][:real]])
    assert np.array_equal(got, valid["x"].records.astype(np.int64))
    gl.close()
