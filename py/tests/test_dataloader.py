"""DataLoader behaviour beyond loaderx: resume, sharding, zero-copy, transform errors."""

import threading
import time

import numpy as np
import pytest

import zring


@pytest.fixture
def streams(tmp_path):
    zring.write_dataset(tmp_path / "x", np.arange(100 * 6, dtype=np.float32).reshape(100, 6))
    zring.write_dataset(tmp_path / "y", np.arange(100, dtype=np.int64))
    zring.write_ragged(tmp_path / "r", [np.full(i % 5, i, dtype=np.int16) for i in range(100)])
    out = {"x": zring.Dataset(tmp_path / "x"), "y": zring.Dataset(tmp_path / "y"),
           "r": zring.RaggedDataset(tmp_path / "r")}
    yield out
    for d in out.values():
        d.close()


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def _eq(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], tuple):
            for x, y in zip(a[k], b[k]):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_resume_from_state_gives_identical_batches(streams, mode):
    with zring.DataLoader(streams, batch_size=16, mode=mode, seed=9, num_workers=2) as dl:
        _take(dl, 3)
        state = dl.state()
        expected = [{k: (tuple(np.copy(p) for p in v) if isinstance(v, tuple) else v.copy())
                     for k, v in b.items()} for b in _take(dl, 4)]
    assert set(state["fingerprints"]) == {"x", "y", "r"}
    assert state["fingerprints"]["x"] == streams["x"].fingerprint()
    with zring.DataLoader(streams, state=state, num_workers=1, prefetch_size=1) as dl2:
        for want in expected:
            _eq(next(dl2), want)


def test_state_with_a_conflicting_argument_is_an_error_naming_both(streams):
    """``state=`` fixes batch_size, mode and seed: an explicit argument that
    differs was silently overridden; now it is a ValueError naming both
    values. The state's own values (or none) are fine."""
    with zring.DataLoader(streams, batch_size=16, mode=2, seed=9, num_workers=1) as dl:
        next(dl)
        state = dl.state()
    for kwargs, names in (({"batch_size": 999}, ("batch_size=999", "batch_size=16")),
                          ({"mode": 1}, ("mode=1", "mode=2")),
                          ({"seed": 0}, ("seed=0", "seed=9"))):
        with pytest.raises(ValueError) as info:
            zring.DataLoader(streams, state=state, **kwargs)
        assert all(n in str(info.value) for n in names), str(info.value)
    with zring.DataLoader(streams, batch_size=16, mode=2, seed=9, state=state) as dl:
        assert dl.state()["sampler"]["step"] == 1


def test_resume_over_replaced_records_is_refused(tmp_path):
    """A state over 100 records that were rewritten (same count, other
    values) resumed silently with other records at the saved indices; now
    the stream's fingerprint differs and the resume raises, naming it."""
    zring.write_dataset(tmp_path / "x", np.arange(100, dtype=np.int64))
    with zring.Dataset(tmp_path / "x") as ds, zring.DataLoader({"x": ds}, batch_size=10, mode=2) as dl:
        _take(dl, 3)
        state = dl.state()
    zring.write_dataset(tmp_path / "x", np.arange(100, dtype=np.int64)[::-1].copy(), overwrite=True)
    with zring.Dataset(tmp_path / "x") as ds:
        assert len(ds) == 100
        with pytest.raises(ValueError, match=r'stream "x" changed since the state was saved'):
            zring.DataLoader({"x": ds}, state=state)


@pytest.mark.parametrize("transform_workers", [0, 2])
def test_resume_over_a_grown_store_finishes_the_cycle_then_adds_the_new_records(tmp_path, transform_workers):
    """A store that grew by appends could not be resumed at all (the length
    differed). Now the cycle under way finishes exactly as in the
    uninterrupted run, and the new records join from the next cycle."""
    n, b = 200, 16  # cyclic: 12 steps per cycle over 200 records
    zring.write_dataset(tmp_path / "x", np.arange(n, dtype=np.int64))
    kw = {"transform": (lambda batch: batch), "transform_workers": transform_workers}
    with zring.Dataset(tmp_path / "x") as ds, zring.DataLoader({"x": ds}, batch_size=b, mode=2, **kw) as dl:
        _take(dl, 5)
        state = dl.state()
        uninterrupted = [next(dl)["x"].copy() for _ in range(7)]
    zring.write_dataset(tmp_path / "x", np.arange(n, n + 40, dtype=np.int64), append=True)
    with zring.Dataset(tmp_path / "x") as ds, zring.DataLoader({"x": ds}, state=state, **kw) as dl:
        assert len(ds) == 240
        for want in uninterrupted:
            np.testing.assert_array_equal(next(dl)["x"], want)
        assert dl.last_step == 11
        after = dl.state()
        assert after["sampler"]["length"] == 240 and after["fingerprints"]["x"]["records"] == 240
        cycle = np.concatenate([next(dl)["x"] for _ in range(15)])
    np.testing.assert_array_equal(np.sort(cycle), np.arange(240))


def test_ragged_stream_matches_dataset(streams):
    with zring.DataLoader(streams, batch_size=10, mode=2, seed=3) as dl:
        for _ in range(4):
            batch = next(dl)
            values, splits = batch["r"]
            ref_v, ref_s = streams["r"][dl.last_indices]
            np.testing.assert_array_equal(values, ref_v)
            np.testing.assert_array_equal(splits, ref_s)
            assert splits.dtype == np.int64
            np.testing.assert_array_equal(batch["y"], dl.last_indices.astype(np.int64))


def test_batches_are_zero_copy_and_writable(streams):
    with zring.DataLoader({"x": streams["x"]}, batch_size=8, mode=0) as dl:
        a = next(dl)["x"]
        assert not a.flags.owndata  # a view of the loader's buffer
        base = a
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert type(base).__name__ == "BatchBuffer"
        a[:] = -1  # the batch belongs to the caller
        b = next(dl)["x"]
        assert (a == -1).all()
        np.testing.assert_array_equal(b, streams["x"][8:16])
    # batches outlive the loader
    assert (a == -1).all() and b.sum() == streams["x"][8:16].sum()


def test_shards_split_the_global_batch(streams):
    with zring.DataLoader(streams, batch_size=12, mode=1, seed=4) as full:
        whole = [next(full)["y"].copy() for _ in range(3)]
    parts = []
    for i in range(3):
        with zring.DataLoader({"y": streams["y"]}, batch_size=12, mode=1, seed=4, shard=(i, 3)) as dl:
            parts.append([next(dl)["y"].copy() for _ in range(3)])
    for step in range(3):
        np.testing.assert_array_equal(np.concatenate([p[step] for p in parts]), whole[step])


def test_transform_error_surfaces_with_step(streams):
    calls = []

    def transform(batch):
        calls.append(1)
        if len(calls) == 3:
            raise KeyError("boom")
        return {"n": len(batch["y"])}

    # Counting calls names the step only when calls come in step order: the
    # consumer-thread transform (parallel transforms: test_transforms.py).
    with zring.DataLoader(streams, batch_size=4, mode=0, transform=transform, transform_workers=0) as dl:
        assert next(dl) == {"n": 4}
        assert next(dl) == {"n": 4}
        t0 = time.monotonic()
        with pytest.raises(KeyError, match="boom") as info:
            next(dl)
        assert time.monotonic() - t0 < 30
        notes = " ".join(getattr(info.value, "__notes__", [])) or str(info.value)
        assert "step 2" in notes
        assert next(dl) == {"n": 4}  # the loader goes on


def test_stats_and_close(streams):
    dl = zring.DataLoader({"y": streams["y"]}, batch_size=5, mode=0)
    _take(dl, 6)
    st = dl.stats()
    assert st["steps_delivered"] == 6
    assert st["records_gathered"] >= 30
    assert {"p50_us", "p99_us", "p999_us"} <= st["wait"].keys()
    # The gather threads' CPU time: some, and part of the process's.
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    assert 0 < st["cpu_s"] <= ru.ru_utime + ru.ru_stime
    assert st["window_cpu_s"] == 0  # no window thread outside mode 3
    dl.close()
    dl.close()
    with pytest.raises(ValueError, match="closed"):
        next(dl)


def test_close_from_another_thread_does_not_hang(streams):
    dl = zring.DataLoader(streams, batch_size=32, mode=1, prefetch_size=2, num_workers=2)
    next(dl)
    t = threading.Thread(target=dl.close)
    t.start()
    t.join(30)
    assert not t.is_alive()


def test_sampler_seek_and_state():
    s = zring.Sampler(50, 8, zring.Sampler.Mode.CYCLIC, seed=1)
    batches = [s.next() for _ in range(5)]
    s.seek(2)
    np.testing.assert_array_equal(s.next(), batches[2])
    st = s.state()
    assert st["step"] == 3
    r = zring.Sampler.from_state(st)
    np.testing.assert_array_equal(r.next(), batches[3])
    np.testing.assert_array_equal(zring.Sampler(3, 8, 0).next(), [0, 1, 2])


def _loader_threads(expect):
    """The loader threads running, once they number ``expect`` or 10 s have
    passed (a new thread takes its name once it first runs)."""
    deadline = time.monotonic() + 10
    while (n := _count_loader_threads()) != expect and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def _count_loader_threads():
    import os
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sum(n.startswith("zring-loader-") for n in names)


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="needs CPU affinity")
def test_the_default_workers_follow_the_cpus_the_process_may_use(streams):
    import os
    before = os.sched_getaffinity(0)
    try:
        for cpus in ({min(before)}, before):
            os.sched_setaffinity(0, cpus)
            loader = zring.DataLoader({"x": streams["x"]}, batch_size=10, mode=2)
            next(loader)
            assert _loader_threads(min(4, len(cpus))) == min(4, len(cpus)), cpus
            loader.close()
            explicit = zring.DataLoader({"x": streams["x"]}, num_workers=3, batch_size=10, mode=2)
            next(explicit)
            assert _loader_threads(3) == 3
            explicit.close()
    finally:
        os.sched_setaffinity(0, before)
