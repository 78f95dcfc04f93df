"""DataLoader transforms on the transform workers: several steps at once,
results strictly in step order, exact resume, errors at their own step,
bounded read-ahead and a clean shutdown.

Every wait has a deadline, so a deadlock fails the test instead of hanging
it; nothing here asserts throughput.
"""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import zring

PREFIX = "zring-transform"
DEADLINE = 30.0  # seconds; only reached when something is stuck


@pytest.fixture
def streams(tmp_path):
    zring.write_dataset(tmp_path / "x", np.arange(200 * 6, dtype=np.float32).reshape(200, 6))
    zring.write_dataset(tmp_path / "y", np.arange(200, dtype=np.int64))
    zring.write_ragged(tmp_path / "r", [np.full(i % 5 + 1, i, dtype=np.int16) for i in range(200)])
    out = {"x": zring.Dataset(tmp_path / "x"), "y": zring.Dataset(tmp_path / "y"),
           "r": zring.RaggedDataset(tmp_path / "r")}
    yield out
    for d in out.values():
        d.close()


def _threads():
    """The transform worker threads alive now."""
    return {t for t in threading.enumerate() if t.name.startswith(PREFIX)}


def _in_thread(fn, timeout=DEADLINE):
    """fn() on another thread, failing the test if it has not returned by the deadline."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised below, on the test's thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _wait_for(cond, what, timeout=DEADLINE):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


def _copy(batch):
    """A deep copy of a batch dict (the loader's buffers belong to the caller, but be explicit)."""
    return {k: (tuple(np.copy(p) for p in v) if isinstance(v, tuple) else np.copy(v))
            for k, v in batch.items()}


def _eq(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], tuple):
            assert len(a[k]) == len(b[k])
            for x, y in zip(a[k], b[k]):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(a[k], b[k])


def _jitter(batch):
    """A transform whose duration depends on the batch, so workers finish out of order.

    It returns new arrays (not views of the loader's buffers) derived from
    every stream, so the comparison also checks the transform saw the right batch.
    """
    y = batch["y"]
    time.sleep(0.001 * (int(y[0]) % 5))
    values, splits = batch["r"]
    return {"x": batch["x"] * 2, "y": y + 1, "r": (values.astype(np.int32) - 1, splits.copy())}


def _take(loader, n):
    return _in_thread(lambda: [_copy(next(loader)) for _ in range(n)])


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_workers_keep_step_order(streams, mode):
    """Four workers give batch for batch what the consumer-thread transform and
    the identity loader (transformed afterwards) give."""
    kw = dict(batch_size=8, mode=mode, seed=5, num_workers=2, prefetch_size=2)
    with zring.DataLoader(streams, transform=_jitter, transform_workers=4, **kw) as dl:
        assert len(_threads()) >= 4
        got = _take(dl, 40)
        steps_returned = dl.last_step
    with zring.DataLoader(streams, transform=_jitter, transform_workers=0, **kw) as dl:
        serial = _take(dl, 40)
    with zring.DataLoader(streams, **kw) as dl:
        plain = [_jitter(b) for b in _take(dl, 40)]
    assert steps_returned == 39
    for a, b, c in zip(got, serial, plain):
        _eq(a, b)
        _eq(a, c)


def test_transforms_run_concurrently_on_named_threads(streams):
    """Each transform waits at a barrier for two others: this only completes if
    three steps are transformed at once (a serial transform breaks the barrier)."""
    barrier = threading.Barrier(3, timeout=DEADLINE)
    names = set()

    def meet(batch):
        names.add(threading.current_thread().name)
        barrier.wait()
        return batch["y"].copy()

    dl = zring.DataLoader({"y": streams["y"]}, batch_size=4, mode=0, num_workers=1,
                          transform=meet, transform_workers=3)
    try:
        got = _in_thread(lambda: [next(dl) for _ in range(12)])
    finally:
        barrier.abort()  # release any worker still waiting, so close() can join it
        _in_thread(dl.close)
    for step, y in enumerate(got):
        np.testing.assert_array_equal(y, np.arange(4 * step, 4 * step + 4))
    assert names and all(n.startswith(PREFIX) for n in names)


def test_identity_and_zero_workers_start_no_threads(streams):
    before = _threads()
    with zring.DataLoader(streams, batch_size=4, transform_workers=3) as dl:  # identity
        next(dl)
        assert _threads() == before
    with zring.DataLoader(streams, batch_size=4, transform=_jitter, transform_workers=0) as dl:
        next(dl)
        assert _threads() == before
        main = threading.current_thread().name
        seen = []
        dl.transform = lambda b: seen.append(threading.current_thread().name)
        next(dl)
        assert seen == [main]  # transform_workers=0: on the consumer thread


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_resume_is_exact_while_workers_run_ahead(streams, mode):
    kw = dict(batch_size=8, mode=mode, seed=13, num_workers=2, prefetch_size=3)
    with zring.DataLoader(streams, transform=_jitter, transform_workers=0, **kw) as dl:
        straight = _take(dl, 12)
        indices = []
    with zring.DataLoader(streams, **kw) as dl:
        for _ in range(12):
            next(dl)
            indices.append(dl.last_indices.copy())

    k = 5
    with zring.DataLoader(streams, transform=_jitter, transform_workers=3, **kw) as dl:
        first = _take(dl, k)
        # The workers pull up to transform_workers + prefetch_size steps ahead of
        # the consumer; wait until they have gone past step k.
        _wait_for(lambda: dl.stats()["steps_delivered"] >= k + 3, "the workers to read ahead")
        state = dl.state()
        assert state["sampler"]["step"] == k
        assert dl.last_step == k - 1
        np.testing.assert_array_equal(dl.last_indices, indices[k - 1])
        rest_here = _take(dl, 4)
        assert dl.state()["sampler"]["step"] == k + 4
        assert dl.last_step == k + 3
        np.testing.assert_array_equal(dl.last_indices, indices[k + 3])
    for a, b in zip(first, straight):
        _eq(a, b)
    for transform_workers in (2, 0):
        with zring.DataLoader(streams, transform=_jitter, transform_workers=transform_workers,
                              state=state,
                              num_workers=1, prefetch_size=1) as resumed:
            again = _take(resumed, 7)
            assert resumed.last_step == k + 6
        for a, b in zip(again, straight[k:k + 7]):
            _eq(a, b)
    for a, b in zip(rest_here, straight[k:]):
        _eq(a, b)


@pytest.mark.parametrize("transform_workers", [4, 1, 0])
def test_transform_error_surfaces_at_its_step(streams, transform_workers):
    """Step 5 raises as soon as a worker reaches it, but the error comes out of
    the 6th next(), not before; then the loader goes on with step 6."""
    raised = threading.Event()

    def transform(batch):
        y = batch["y"]
        if int(y[0]) == 5 * 4:  # sequential, batch 4: step 5 starts at record 20
            raised.set()
            raise KeyError("bad batch")
        return y.copy()

    with zring.DataLoader({"y": streams["y"]}, batch_size=4, mode=0, num_workers=2,
                          transform=transform, transform_workers=transform_workers) as dl:
        np.testing.assert_array_equal(_in_thread(lambda: next(dl)), np.arange(4))
        if transform_workers:
            # The workers reach step 5 while the consumer is still at step 1.
            _wait_for(raised.is_set, "the transform of step 5")
        for step in range(1, 5):
            np.testing.assert_array_equal(_in_thread(lambda: next(dl)), np.arange(4 * step, 4 * step + 4))
        with pytest.raises(KeyError, match="bad batch") as info:
            _in_thread(lambda: next(dl))
        notes = " ".join(getattr(info.value, "__notes__", [])) or str(info.value)
        assert "raised by the DataLoader transform at step 5" in notes
        assert dl.last_step == 5
        np.testing.assert_array_equal(dl.last_indices, np.arange(20, 24))
        assert dl.state()["sampler"]["step"] == 6
        np.testing.assert_array_equal(_in_thread(lambda: next(dl)), np.arange(24, 28))
        assert dl.last_step == 6


@pytest.mark.parametrize("transform_workers", [3, 0])
def test_gather_error_surfaces_at_its_step_and_poisons(tmp_path, transform_workers):
    """A corrupt record fails its step's gather: earlier steps still come out
    transformed and in order, that step raises the store error, later calls
    raise PoisonedError, and state() names the failed step."""
    path = tmp_path / "s"
    zring.write_dataset(path, np.arange(4000, dtype=np.int32).reshape(100, 40), codec="raw")
    with zring.Zrecord(path) as z:  # one checksum per record (format 2 checks blocks of 26)
        z.compact(format=1)
    chunk = sorted(path.glob("chunk-*.zr"))[0]
    with open(chunk, "r+b") as f:  # a byte inside record 30 (160 bytes per record)
        f.seek(160 * 30 + 3)
        b = f.read(1)
        f.seek(160 * 30 + 3)
        f.write(bytes([b[0] ^ 0xFF]))
    with zring.Dataset(path) as ds:
        dl = zring.DataLoader({"a": ds}, batch_size=4, mode=0, num_workers=2,
                              transform=lambda b: b["a"][:, 0] // 40, transform_workers=transform_workers)
        try:
            for step in range(7):  # step 7 holds records 28..31
                np.testing.assert_array_equal(_in_thread(lambda: next(dl)), np.arange(4 * step, 4 * step + 4))
            with pytest.raises(zring.ChecksumError, match="record 30"):
                _in_thread(lambda: next(dl))
            assert dl.last_step == 6
            assert dl.state()["sampler"]["step"] == 7
            with pytest.raises(zring.PoisonedError):
                _in_thread(lambda: next(dl))
            assert dl.state()["sampler"]["step"] == 7
        finally:
            _in_thread(dl.close)


def test_read_ahead_is_bounded(streams):
    calls = []
    lock = threading.Lock()

    def count(batch):
        with lock:
            calls.append(int(batch["y"][0]))
        return batch

    workers, prefetch, k = 3, 2, 4
    with zring.DataLoader({"y": streams["y"]}, batch_size=4, mode=0, num_workers=1,
                          prefetch_size=prefetch, transform=count, transform_workers=workers) as dl:
        _take(dl, k)
        # Once every worker waits with the read-ahead full, no transform can
        # start until the next next(): the count is final.
        _wait_for(dl._pool.quiet, "the workers to fill the read-ahead")
        assert len(calls) == k + workers + prefetch
        _take(dl, 1)
        _wait_for(lambda: len(calls) > k + workers + prefetch and dl._pool.quiet(), "one more step after a next()")
        assert len(calls) == k + 1 + workers + prefetch


def test_close_while_transforms_run_joins_every_thread(streams):
    before = _threads()

    def slow(batch):
        time.sleep(0.004)
        return batch

    dl = zring.DataLoader(streams, batch_size=16, num_workers=2, transform=slow, transform_workers=4)
    ours = _threads() - before
    assert len(ours) == 4
    _take(dl, 3)
    _in_thread(dl.close)
    assert not (ours & _threads()), "close() left transform threads running"
    assert not any(t.is_alive() for t in ours)
    _in_thread(dl.close)  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        next(dl)
    with pytest.raises(ValueError, match="closed"):
        dl.state()


def test_close_from_another_thread_wakes_a_waiting_next(streams):
    release = threading.Event()

    def stuck(batch):
        release.wait(DEADLINE)
        return batch

    before = _threads()
    dl = zring.DataLoader(streams, batch_size=8, num_workers=1, transform=stuck, transform_workers=2)
    errors = []

    def consume():
        try:
            next(dl)
        except ValueError as exc:
            errors.append(exc)

    pool = dl._pool
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    _wait_for(lambda: pool.consumers_waiting == 1, "next() to wait for its step")
    closer = threading.Thread(target=dl.close, daemon=True)
    closer.start()
    _wait_for(lambda: pool._stop, "close() to start")
    release.set()  # the transforms in progress return; close() then joins their threads
    closer.join(DEADLINE)
    consumer.join(DEADLINE)
    assert not closer.is_alive() and not consumer.is_alive()
    assert errors and "closed" in str(errors[0])
    assert _threads() <= before


def test_unclosed_loader_is_collected_without_hanging(streams):
    before = _threads()

    def slow(batch):
        time.sleep(0.004)
        return batch["y"].copy()

    dl = zring.DataLoader(streams, batch_size=16, num_workers=2, transform=slow, transform_workers=3)
    ours = _threads() - before
    assert len(ours) == 3
    _in_thread(lambda: [next(dl) for _ in range(2)])
    del dl
    _in_thread(gc.collect)
    _wait_for(lambda: not any(t.is_alive() for t in ours), "the workers of a collected loader to exit", 10)


def test_loader_collected_on_its_own_worker_thread_does_not_hang(streams):
    """A DataLoader in a reference cycle is finalised by whichever thread runs
    the cyclic collector, possibly one of its own workers (which cannot join
    itself): the workers must still all exit."""
    collect = threading.Event()
    collected = threading.Event()

    def maybe_collect(batch):
        # Sequential order: step k holds labels 8k..8k+7. Steps 0 and 1 are
        # consumed below; every later step waits until the loader is
        # unreachable, so a worker is inside transform when collect is set
        # (without the wait, read-ahead may have transformed every step the
        # queue allows before then, and no worker would ever run the collector).
        if batch["y"][0] >= 16:
            collect.wait(DEADLINE)
        if collect.is_set() and not collected.is_set():
            gc.collect()
            collected.set()
        return batch

    before = _threads()
    gc.disable()  # only the worker's explicit gc.collect() may finalise the cycle
    try:
        dl = zring.DataLoader(streams, batch_size=8, num_workers=1, transform=maybe_collect,
                              transform_workers=2, prefetch_size=1, mode=0)
        dl.me = dl  # a cycle: only the cyclic collector frees it
        ref = weakref.ref(dl)
        ours = _threads() - before
        _in_thread(lambda: [next(dl) for _ in range(2)])
        del dl
        collect.set()
        _wait_for(collected.is_set, "a worker to run the collector")
        assert ref() is None
    finally:
        gc.enable()
    _wait_for(lambda: not any(t.is_alive() for t in ours), "the workers of a collected loader to exit", 10)


def test_next_after_the_with_block_raises(streams):
    with zring.DataLoader(streams, batch_size=4, transform=_jitter, transform_workers=2) as dl:
        next(dl)
    with pytest.raises(ValueError, match="closed"):
        next(dl)


@pytest.mark.parametrize("bad", ["2", 1.5, True, [2]])
def test_transform_workers_must_be_an_int(streams, bad):
    before = _threads()
    with pytest.raises(TypeError, match="transform_workers must be an int"):
        zring.DataLoader(streams, transform=_jitter, transform_workers=bad)
    assert _threads() == before


def test_transform_workers_must_not_be_negative(streams):
    with pytest.raises(ValueError, match="transform_workers must be >= 0"):
        zring.DataLoader(streams, transform=_jitter, transform_workers=-1)
    with pytest.raises(ValueError, match="transform_workers"):
        zring.DataLoader(streams, transform_workers=-2)  # checked even with the identity
    with zring.DataLoader(streams, transform=_jitter, transform_workers=np.int64(2)) as dl:
        next(dl)
