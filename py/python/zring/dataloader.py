"""The endless, step-based loader (loaderx's ``DataLoader``).

Gathering runs in Rust threads that work a few steps ahead; the next raw
batch is waited for with the GIL released and each stream's bytes are
wrapped as a NumPy array without copying. The wait looks for signals every
50 ms, so Ctrl-C raises ``KeyboardInterrupt`` in a ``next()`` blocked on a
slow step (the step stays next); :meth:`DataLoader.state`,
:meth:`DataLoader.stats` and :meth:`DataLoader.close` from another thread
never wait with the GIL held.

A ``transform`` (anything but the default identity) runs on the loader's
*transform workers*: ``transform_workers`` Python threads (named
``zring-transform-...``; default: as many as ``num_workers``). Each worker
takes the next raw batch from the Rust loader (waiting without the GIL),
calls ``transform`` on it with no lock held, and files the result under its
step; ``next()`` hands results out strictly in step order. So a transform
that releases the GIL (NumPy, OpenCV, I/O) runs on several steps at once,
and on a free-threaded build any transform does. At most ``transform_workers
+ prefetch_size`` steps are taken from the Rust loader and not yet returned
by ``next()``, which bounds memory. ``transform_workers=0`` calls
``transform`` on the consumer thread instead, inside ``next()``. (loaderx
calls it on its gather threads and returns batches in the order they
finish.) The workers are daemon threads; :meth:`DataLoader.close`, leaving a
``with`` block, garbage collection of the loader and interpreter exit all
stop and join them.

Ordering, errors and resume are the same in both arrangements:

* an exception raised by ``transform`` surfaces at the ``next()`` call that
  would have returned that step, with the note "raised by the DataLoader
  transform at step N"; the following ``next()`` returns step N + 1;
* a failure of the Rust loader (a corrupt record, ...) surfaces at the
  ``next()`` for the failed step and poisons the loader: later calls raise
  :class:`zring.PoisonedError`, and :meth:`DataLoader.state` names the failed
  step, so a loader rebuilt from it retries that step;
* :meth:`DataLoader.state` and :attr:`DataLoader.last_indices` /
  :attr:`DataLoader.last_step` describe the consumer's position, not how
  far the workers have read ahead.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from . import _util, _zring
from ._mix import Mixture
from ._pack import Packed, _views as _packed_views
from .dataset import Dataset, RaggedDataset, _rank_parts as _dataset_rank_parts


def _identity(batch: Any) -> Any:
    return batch


def _nonneg(name: str, value: Any, minimum: int = 0, maximum: int = _util.U64_MAX) -> int:
    """An int argument from ``minimum`` to ``maximum`` (a u64 by default): see
    :func:`zring._util.integer`."""
    return _util.integer(value, name, minimum, maximum)


def _default_workers() -> int:
    """``DataLoader``'s default ``num_workers``: the CPUs this process may
    run on (its affinity), at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _worker_count(value: Any, default: int) -> int:
    """``transform_workers``: None (the default), or an int >= 0; no floats or bools."""
    if value is None:
        return default
    if not _util.is_int(value):
        raise TypeError(
            f"transform_workers must be an int >= 0 (0 runs transform on the consumer thread) "
            f"or None, got {type(value).__name__} {value!r}"
        )
    if value < 0:
        raise ValueError(
            f"transform_workers must be >= 0 (0 runs transform on the consumer thread), got {value}"
        )
    return int(value)


def _with_note(exc: BaseException, step: int) -> BaseException:
    """``exc`` carrying the transform note (or, before Python 3.11, wrapped in a RuntimeError)."""
    note = f"raised by the DataLoader transform at step {step}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return exc
    wrapped = RuntimeError(f"{note}: {exc!r}")
    wrapped.__cause__ = exc
    return wrapped


def _wrap(views: list[tuple[str, Any]], indices: np.ndarray, columns: list[Any]) -> dict[str, Any]:
    """The batch dict over the columns of one raw ``Loader.next()`` result (no copies)."""
    batch: dict[str, Any] = {}
    for (name, ds), (_, data, offsets) in zip(views, columns):
        if offsets is None:
            batch[name] = data.view(ds.dtype).reshape((len(indices), *ds.shape))
        else:
            values = data.view(ds.dtype).reshape((-1, *ds.item_shape))
            row_bytes = ds.row_bytes or 1
            batch[name] = (values, (offsets // np.uint64(row_bytes)).astype(np.int64))
    return batch


def _datasets(streams: Any) -> list[tuple[str, Any]]:
    """``(label, dataset)`` for every dataset a loader over ``streams`` reads."""
    if isinstance(streams, Packed):
        return [(f"source {k}" if len(streams.datasets) > 1 else "the packed source", ds)
                for k, ds in enumerate(streams.datasets)]
    if isinstance(streams, Mixture):
        return [(f"source {k} stream {name!r}", ds)
                for k, src in enumerate(streams.sources) for name, ds in src.items()]
    return [(f"stream {name!r}", ds) for name, ds in streams.items()]


def _split(value: Any) -> tuple[int, int]:
    """A ``rank_parts`` argument checked: a ``(rank, ranks)`` pair, ``0 <= rank < ranks``."""
    rank, ranks = _dataset_rank_parts(value)
    if not 0 <= rank < ranks:
        raise ValueError(f"rank_parts=({rank}, {ranks}): need 0 <= rank < ranks")
    return rank, ranks


def rank_split(streams: Any, rank_parts: Any = None) -> tuple[int, int] | None:
    """The ``(rank, ranks)`` a loader over ``streams`` is, or None for a
    loader over whole datasets.

    Read from the datasets: each opened with ``rank_parts=(rank, ranks)``
    holds only that rank's parts, so a loader over it can only be that
    rank's loader. ``rank_parts``, when given, must be theirs.

    Raises:
        ValueError: datasets opened with different splits, some with one and
            some without, or none with the ``rank_parts`` given (the message
            names the dataset and says how to open it).
    """
    given = None if rank_parts is None else _split(rank_parts)
    found = _datasets(streams)
    splits = {getattr(ds, "rank_parts", None) for _, ds in found}
    if given is None and len(splits) <= 1:
        return next(iter(splits), None)
    want = given if given is not None else next(s for s in splits if s is not None)
    for label, ds in found:
        have = getattr(ds, "rank_parts", None)
        if have == want:
            continue
        if have is not None:
            raise ValueError(
                f"{label} ({ds.path}) was opened with rank_parts={have}, "
                + (f"the loader was given rank_parts={want}" if given is not None else
                   f"another with rank_parts={want}")
                + "; a rank's loader reads every dataset with the same (rank, ranks)"
            )
        if not isinstance(ds._s, _zring.Parts):
            raise ValueError(
                f"{label} ({ds.path}) is one store, not a dataset of parts: every rank would read all of it. "
                f"rank_parts={want} splits datasets of parts (zring.parts) among the ranks; write it as parts, "
                "or read it with shard= in a loader without rank_parts"
            )
        raise ValueError(
            f"{label} ({ds.path}) was opened over all its parts; open it with "
            f"{type(ds).__name__}(path, rank_parts={want}) so that this rank reads only its own parts"
        )
    return want


def _saved_split(state: Mapping[str, Any]) -> tuple[int, int] | None:
    saved = state.get("rank_parts")
    if saved is None:
        return None
    try:
        return int(saved["rank"]), int(saved["ranks"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"the state's rank_parts is not {{'rank': r, 'ranks': n}}: {saved!r}") from None


def rank_state_problem(state: Mapping[str, Any], have: tuple[int, int] | None) -> str | None:
    """Why a state saved by a loader of one rank split cannot resume in a
    loader of split ``have`` (None: whole datasets), or None when it can.
    One rank of one is the whole dataset."""
    saved = _saved_split(state)
    one = (0, 1)
    if (saved or one) == (have or one):
        return None
    if saved is None:
        return (f"the state was saved by a loader over whole datasets, this loader is rank {have[0]} of {have[1]} "
                f"(rank_parts={have}) and reads only its parts; resume the state over the whole datasets "
                "(no rank_parts), or start this run without state=")
    if have is None:
        return (f"the state was saved by rank {saved[0]} of {saved[1]} (rank_parts={saved}); open the datasets "
                f"with rank_parts={saved} to resume it")
    if saved[1] != have[1]:
        return (f"the state was saved by rank {saved[0]} of {saved[1]} ranks, this loader is rank {have[0]} of "
                f"{have[1]}: a run keeps its rank count, since each rank's cycle walks its own parts (another "
                f"count assigns other parts to each rank); resume with {saved[1]} ranks, or start a new run "
                f"(no state=) with {have[1]}")
    return (f"the state was saved by rank {saved[0]} of {saved[1]}, this loader reads rank {have[0]}'s parts: "
            f"resume each rank from the state it saved")


# Transform pools still running; closed at interpreter exit while their
# (daemon) threads can still be joined. Later, during finalisation, a daemon
# thread may be frozen for good, so joining it from a __del__ could hang.
_LIVE: "weakref.WeakSet[_TransformPool]" = weakref.WeakSet()
_SEQ = itertools.count()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE):
        pool.close()


# The outcomes a worker files under a step.
_OK, _TRANSFORM_ERROR, _LOADER_ERROR = 0, 1, 2

# How long a blocked wait sleeps before re-checking the stop flag. Every wait
# is also woken by a notify; the timeout only bounds a missed one.
_POLL = 0.1


class _TransformPool:
    """Threads that pull raw batches from a Rust ``Loader``, apply the
    transform, and hand the results out in step order.

    It holds no reference to its :class:`DataLoader`, so an unclosed loader
    can still be garbage-collected (its ``__del__`` closes the pool).

    Locking: one lock (under the conditions ``_ready``, where the consumer
    waits for its step, and ``_room``, where workers wait for room to read
    ahead) guards the counters and the ``_done`` buffer and is held only for
    bookkeeping, and each event wakes only the thread it concerns. ``_pull``
    serialises ``Loader.next()`` calls (the Rust loader serialises them
    anyway) so that the step of a failed pull is known. ``transform`` is
    called with no lock held, so on a free-threaded build the workers run it
    truly in parallel.
    """

    def __init__(self, loader: Any, views: list[tuple[str, Any]], transform: Callable[[Any], Any],
                 workers: int, ahead: int, first_step: int, cut: Callable[..., Any] | None = None):
        self._loader = loader
        self._views = views
        self._cut = cut  # a one-pass loader's cut of its last batch
        self._transform = transform
        self._ahead = ahead  # steps pulled (or being pulled) and not yet consumed, at most
        lock = threading.Lock()
        self._ready = threading.Condition(lock)  # the consumer waits here for its step
        self._room = threading.Condition(lock)  # workers wait here for room to read ahead
        self._pull = threading.Lock()
        self._done: dict[int, tuple[int, Any, Any]] = {}  # step -> (outcome, value, (indices, sources))
        self._claimed = 0  # pulls started, in total
        self._consumed = 0  # results handed to the consumer, in total
        self._next_pull = first_step  # the step the next Loader.next() returns
        self.next_step = first_step  # the step the consumer's next next() returns
        self._broken = False  # a pull failed (or the loader closed); nobody pulls again
        self._failed_step: int | None = None  # the step whose pull failed
        self._stop = False
        self._waiting = 0  # workers waiting for room to read ahead
        self.consumers_waiting = 0  # next() calls waiting for their step (for tests)
        self._pid = os.getpid()
        seq = next(_SEQ)
        self._threads = [
            threading.Thread(target=self._work, name=f"zring-transform-{seq}.{i}", daemon=True)
            for i in range(workers)
        ]
        _LIVE.add(self)
        for t in self._threads:
            t.start()

    # -- workers ---------------------------------------------------------

    def _work(self) -> None:
        room = self._room
        while True:
            with room:
                self._waiting += 1
                while not (self._stop or self._broken) and self._claimed - self._consumed >= self._ahead:
                    room.wait(_POLL)
                self._waiting -= 1
                if self._stop or self._broken:
                    return
                self._claimed += 1
            if not self._take_and_transform():
                return

    def quiet(self) -> bool:
        """Whether every worker waits for room with the read-ahead full: then
        no transform starts until the consumer takes a step (for tests)."""
        with self._room:
            return self._waiting == len(self._threads) and self._claimed - self._consumed >= self._ahead

    def _take_and_transform(self) -> bool:
        """Pull one raw batch, transform it, file the outcome; False to stop."""
        while not self._pull.acquire(timeout=_POLL):
            if self._stop:
                return False
        try:
            if self._stop or self._broken:
                return False
            step = self._next_pull
            try:
                step, indices, columns, sources = self._loader.next()  # waits with the GIL released
            except BaseException as exc:  # the loader failed (or was closed under us)
                with self._ready:
                    self._broken = True
                    if not self._stop:
                        self._failed_step = step
                        self._done[step] = (_LOADER_ERROR, exc, None)
                    self._ready.notify_all()
                    self._room.notify_all()
                return False
            self._next_pull = step + 1
        finally:
            self._pull.release()
        try:
            batch = _wrap(self._views, indices, columns)
            if self._cut is not None:
                batch, indices = self._cut(step, batch, indices)
            outcome, value = _OK, self._transform(batch)
        except BaseException as exc:  # delivered to the consumer at this step
            outcome, value = _TRANSFORM_ERROR, exc
        with self._ready:
            if self._stop:
                return False
            self._done[step] = (outcome, value, (indices, sources))
            if step == self.next_step:
                self._ready.notify()
        return True

    # -- consumer --------------------------------------------------------

    def next(self) -> tuple[int, Any, Any, int]:
        """The outcome of the consumer's next step: ``(outcome, value, (indices, sources), step)``.

        Raises ValueError once closed. After a failed pull has been delivered,
        returns ``(_LOADER_ERROR, None, None, step)``: the caller asks the
        (poisoned) Rust loader for the error to raise.
        """
        ready = self._ready
        with ready:
            while True:
                if self._stop:
                    raise ValueError("the DataLoader is closed")
                item = self._done.pop(self.next_step, None)
                if item is not None:
                    break
                if self._failed_step is not None and self.next_step >= self._failed_step:
                    # The failure itself was handed out already.
                    return (_LOADER_ERROR, None, None, self.next_step)
                self.consumers_waiting += 1
                ready.wait(_POLL)
                self.consumers_waiting -= 1
            step = self.next_step
            self._consumed += 1
            if item[0] != _LOADER_ERROR:
                self.next_step += 1  # a failed step stays the resume point
            self._room.notify()
        return (*item, step)

    def close(self) -> None:
        """Stop and join every worker (idempotent).

        Two cases only set the stop flag, which every wait sees within
        ``_POLL``: a forked child (it has none of the threads, and a lock may
        have been held by one of them at the moment of fork), and a call from
        a worker itself (the garbage collector can finalise the DataLoader on
        a worker thread, even while that worker holds the lock); the other
        workers then exit on their own.
        """
        self._stop = True
        if os.getpid() != self._pid or threading.current_thread() in self._threads:
            return
        with self._ready:
            self._done.clear()  # release the batches nobody will take
            self._ready.notify_all()
            self._room.notify_all()
        if not sys.is_finalizing():  # by then a daemon thread may be frozen for good
            for t in self._threads:
                t.join()
        _LIVE.discard(self)


_LAST_BATCH = ("partial", "drop", "pad")


def _check_one_pass(streams: Any, mode: int | None, state: Any, last_batch: Any) -> int | None:
    """The mode of a one-pass loader (0), or a ValueError for what it cannot read."""
    if last_batch not in _LAST_BATCH:
        raise ValueError(f"last_batch must be \"partial\", \"drop\" or \"pad\", got {last_batch!r}")
    if isinstance(streams, Mixture) or (isinstance(streams, Packed) and streams.mixture is not None):
        raise ValueError(
            "one_pass=True reads one source once; a mixture's sources each have their own pass: make a one-pass "
            "loader over each source's part (zring.split) and combine the results"
        )
    if isinstance(streams, Packed) and streams.mode != "concat":
        raise ValueError("one_pass=True packs in mode=\"concat\" only (the rows of a first-fit pass are not "
                         "counted ahead); pack the evaluation split with mode=\"concat\"")
    # Packed rows may take a shuffled pass: every cycle of the document order
    # in modes 2 and 3 holds each document once, and the tokens past the
    # pass's end are cut by their place in the stream.
    shuffled = isinstance(streams, Packed)
    allowed = (0, 2, 3) if shuffled else (0,)
    names = {0: "Sequential", 2: "Cyclic", 3: "Blocked"}
    if state is not None:
        saved = state.get("sampler", {}).get("mode") if isinstance(state, Mapping) else None
        if saved not in allowed and saved not in [names[m] for m in allowed]:
            raise ValueError(f"one_pass=True reads in order (mode 0{', or 2 or 3 for packed rows' if shuffled else ''}); "
                             f"the state was saved in mode {saved!r}")
        return mode
    if mode is not None and mode not in allowed:
        raise ValueError(f"one_pass=True reads in order (mode 0{', or 2 or 3 for packed rows' if shuffled else ''}), "
                         f"got mode={mode!r}: leave mode out")
    return 0 if mode is None else mode


class _Pass:
    """One pass of a finite loader (``one_pass=True``): its steps, and the
    cut of its last batch."""

    def __init__(self, loader: "DataLoader", batch_size: int, shard: Mapping[str, Any], last_batch: str):
        packed = loader.packed
        self.packed = packed
        if packed is not None:
            ds = packed.datasets[0]
            idx = ds._records(np.arange(len(ds), dtype=np.uint64))
            per_doc = int(packed.eod_id is not None) + int(packed.bos_id is not None)
            #: The tokens of the pass (EOD/BOS counted).
            self.tokens = int(ds._s.lengths(idx).sum()) // ds.dtype.itemsize + per_doc * len(ds)
            self.length = -(-self.tokens // packed.seq_len)
            batch = batch_size
        else:
            first = next(iter(loader.streams.values()))
            self.length = len(first)
            batch = min(batch_size, self.length)
        full, rest = divmod(self.length, batch)
        self.rest = 0 if last_batch == "drop" else rest
        #: Steps in the pass.
        self.steps = full + (1 if self.rest else 0)
        self.last_batch = last_batch
        count = int(shard.get("count", 1))
        self.local = batch // count
        self.offset = int(shard.get("index", 0)) * self.local

    def valid(self, step: int, rows: int) -> int:
        """Real rows of this process's batch at ``step``."""
        if step == self.steps - 1 and self.rest:
            return min(max(self.rest - self.offset, 0), self.local)
        return rows

    def cut(self, step: int, batch: dict[str, Any], indices: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
        """The batch of ``step`` as the pass delivers it."""
        if step != self.steps - 1:
            return batch, indices
        p = self.packed
        if p is not None:
            # Tokens at or past the pass's end, by their place in the stream.
            at = indices.astype(np.int64)[:, None] * p.seq_len + np.arange(p.seq_len)
            past = at >= self.tokens
            if past.any():
                batch["segment_ids"][past] = 0
                batch["positions"][past] = 0
                if p.pad_id is not None:
                    batch["tokens"][past] = p.pad_id
                if p.labels:
                    label_past = at >= self.tokens - 1
                    batch["loss_mask"][label_past] = 0
                    if p.pad_id is not None:
                        batch["labels"][label_past] = p.pad_id
        if not self.rest or self.last_batch != "partial":
            return batch, indices
        v = self.valid(step, len(indices))
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, tuple):
                values, splits = value
                out[name] = (values[: int(splits[v])], splits[: v + 1])
            else:
                out[name] = value[:v]
        return out, indices[:v]


class DataLoader(_util.Closeable):
    """An endless iterator of batches over named streams (or, with
    ``one_pass=True``, one pass over them in order, for evaluation).

    A batch is a dict ``{name: samples}``: for a :class:`Dataset` stream an
    array ``(B, *shape)``, for a :class:`RaggedDataset` stream a packed
    ``(values, row_splits)``. Every stream is gathered at the same indices,
    so record ``i`` lines up across streams.

    A ``transform`` runs on ``transform_workers`` threads, several steps at
    once, and batches still come out strictly in step order (see the module
    docstring for errors and resume); ``transform_workers=0`` runs it on the
    consumer thread.

    zring additions: ``state=`` with :meth:`state` resumes exactly,
    ``shard=(index, count)`` delivers one contiguous slice of each global
    batch, :meth:`stats` reports the pipeline's timings, ordered parallel
    transforms (``transform_workers=``), and :attr:`last_indices` holds the
    indices of the batch last returned.
    """

    def __new__(cls, streams: Any = None, *args: Any, **kwargs: Any) -> Any:
        # A batch-size or sequence-length ramp: a curriculum loader over a
        # DataLoader of fixed ticks (zring._curriculum).
        from ._curriculum import CurriculumLoader, Ramp

        if cls is DataLoader:
            import inspect

            bound = inspect.signature(DataLoader.__init__).bind(None, streams, *args, **kwargs)
            a = dict(bound.arguments)
            a.pop("self")
            batch, seq = a.get("batch_size"), getattr(streams, "seq_ramp", None)
            if isinstance(batch, Ramp) or seq is not None:
                source = a.pop("streams")
                state, shard = a.pop("state", None), a.pop("shard", None)
                transform = a.pop("transform", _identity)
                a.pop("transform_workers", None)
                a.pop("batch_size", None)
                if not isinstance(batch, Ramp):
                    batch = Ramp({0: 256 if batch is None else int(batch)})
                return CurriculumLoader(DataLoader, source, batch, seq, state=state, shard=shard,
                                        transform=transform, kwargs={**a, "transform_workers": 0})
        return super().__new__(cls)

    def __init__(self, streams: Mapping[str, Dataset | RaggedDataset] | Mixture, num_workers: int | None = None,
                 batch_size: int | None = None, prefetch_size: int = 4, mode: int | None = None,
                 seed: int | None = None,
                 transform: Callable[[dict[str, Any]], Any] = _identity, *,
                 state: dict[str, Any] | None = None, shard: tuple[int, int] | None = None,
                 transform_workers: int | None = None, cache_bytes: int | None = None,
                 block_records: int | None = None, window_blocks: int | None = None,
                 rank_parts: tuple[int, int] | None = None,
                 one_pass: bool = False, last_batch: str = "partial"):
        """Start gathering.

        Args:
            streams: Named datasets, all of the same length; or a
                :func:`zring.mix` mixture of such dicts: then every batch
                holds each source's share of the rows (rounded down or up,
                or one row further; exact over the run; a source of under
                a row per batch gets its rows over the steps), gathered by
                the same Rust workers (see :mod:`zring._mix`), and
                :attr:`last_sources` names each row's source. Or a
                :func:`zring.pack` source of packed token rows: then every
                batch is ``{"tokens", "segment_ids", "positions"}``, each
                ``(B, seq_len)``, packed by the same Rust workers from the
                documents in this loader's ``mode`` and ``seed`` (see
                :mod:`zring._pack`), and :attr:`last_indices` holds the rows'
                numbers in the packed stream.
            num_workers: Gather threads (>= 1). Default: the CPUs this
                process may run on, at most 4 (on cold reads, more gather
                threads than cores cost more CPU per GiB for no more
                throughput: 4 workers on 2 cores took about 1.1-1.4x the
                CPU-seconds per GiB of 2). While ``min(num_workers,
                prefetch_size)`` is below the core count each gather also
                uses zring's decode pool; from there on each thread gathers
                alone.
            batch_size: Records per step (before sharding); default 256. Or
                a :func:`zring.ramp` of the step (a batch-size ramp-up; with
                it, or a ``seq_len`` ramp in :func:`zring.pack`, this returns
                a :class:`zring.CurriculumLoader`: :mod:`zring._curriculum`).
            prefetch_size: Steps gathered ahead of the consumer (>= 1). With
                transform workers, up to ``transform_workers + prefetch_size``
                more steps may be transformed (or being transformed) and
                waiting for the consumer.
            mode: 0 sequential, 1 iid (with replacement), 2 cyclic
                (without), 3 blocked (without, and local: each batch is
                drawn from a window of blocks of consecutive records, the
                windows walking a fresh random order of the blocks each
                cycle; a store reads each block as one large read when its
                window opens, so a dataset far larger than memory is read
                cold at the disk's large-read rate); default 1.
            block_records: Mode 3: consecutive records per block. Default:
                the fewest whose bytes reach 1 MiB (one large read).
            window_blocks: Mode 3: blocks per window. Default: a quarter
                of the first stream's record cache (of its memory budget
                when it reads buffered) in blocks, so the window drawn from
                and the next one, loading, fit in it. Larger windows mix
                batches better (bench-results/randomness.md). A state fixes
                both: given with ``state=``, each must be the state's value.
            seed: Sampler seed; default 42.
            transform: Applied to each batch dict, on the transform workers
                (or on the consumer thread, see ``transform_workers``). It
                may be called from several threads at once, each time on a
                different step's batch. The workers read it once, here.
            state: A dict from :meth:`state`; it fixes batch_size, mode, seed,
                mode 3's block_records and window_blocks, and the next step
                (leave those arguments out, or pass the state's values), and
                carries each stream's fingerprint: a
                stream whose records changed since is refused, and over a
                store that only grew by appends the run finishes the cycle
                under way exactly as it would have and the new records join
                from the next cycle (an iid run: after as many steps as a
                cycle has; sequential: from the next pass, at record 0). A
                mixture resumes only over sources of the saved lengths.
                States saved before fingerprints existed resume as before.
            shard: ``(index, count)``; the count must divide the batch. In
                mode 3 each cycle's blocks are split between the ``count``
                shards, so each reads only the blocks holding its rows; such
                a state resumes only with the same count (a state saved
                before the split, or without ``shard``, resumes with any).
            transform_workers: Threads that call ``transform`` (default
                None: as many as ``num_workers``). ``0`` calls it on the
                consumer thread inside ``next()``. Unused (no thread starts)
                when ``transform`` is the default identity.
            rank_parts: ``(rank, ranks)``: this loader is rank ``rank`` of
                ``ranks``, each reading only its own parts of datasets of
                parts (:mod:`zring.parts`), so a host needs only its own
                parts on disk. Every dataset read (each stream, each source
                of a mixture or of a packed source) must be opened with the
                same ``rank_parts=(rank, ranks)``, which holds that rank's
                parts (assigned by :func:`zring.parts.rank_plan`) as one
                dataset; the loader draws its batches from them in any
                ``mode``, a mixture holding each source's share of this
                rank's rows, and over each cycle of its sampler each rank's
                rows cover its records once, so the ranks' together cover
                every record once. Default: taken from the datasets (a
                loader over datasets opened with ``rank_parts`` is that
                rank's loader). The state records it, and a state saved
                with another rank count (or by another rank) is refused:
                a run keeps its rank count. ``batch_size`` is this rank's
                rows per step; ``shard=`` splits them further among the
                processes of the rank (the same seed in each).
            cache_bytes: The memory budget of the process's store data
                (see :class:`Dataset`): when given, the loader states it for
                the process (so it applies to every open dataset too) until
                it closes. The process's budget is the latest statement
                still live: loaders closed in any order each withdraw only
                their own, and the budget returns to the latest one left
                (or to :func:`zring.set_cache_bytes`'s, a dataset's, or the
                measured budget).
            one_pass: A finite loader for evaluation: it reads the streams
                (or a :func:`zring.pack` of one source, concat mode) once,
                in order (mode 0, which it defaults to; packed rows may also
                take mode 2 or 3, a shuffled pass: each cycle of their
                document order holds every document once), ``len(loader)``
                steps from step 0, then raises
                StopIteration. A batch of ``n`` records holds records ``i *
                n`` up to ``(i + 1) * n``; a packed one the rows of one pass
                over the tokens (``ceil(T / seq_len)`` rows of the ``T``
                tokens, EOD/BOS counted). A state saved during the pass
                resumes it (pass ``one_pass`` and ``last_batch`` again). Not
                for a :func:`zring.mix` mixture (each source has its own
                pass: evaluate each source's split on its own).
            last_batch: With ``one_pass``, what the last batch is when the
                pass does not fill it: ``"partial"`` (default) the records
                left, fewer rows than the others (on each shard its rows of
                them, possibly none); ``"drop"`` no last batch (only full
                ones); ``"pad"`` a full batch whose rows past the pass are
                records from the start again, :attr:`last_valid` saying how
                many rows are real (they come first). In a packed pass the
                last real row's tokens past the pass, and ``"pad"``'s extra
                rows, are marked as padding: ``segment_ids`` and
                ``positions`` 0, ``loss_mask`` 0 (with ``labels``, also at
                the pass's last token, whose label lies past it), and
                ``tokens`` and ``labels`` ``pad_id`` where it is given.

        Raises:
            ValueError: No streams, streams of different lengths, an
                argument out of range (``transform_workers`` < 0,
                ``batch_size`` 0, a ``seed`` < 0 or past 2**64 - 1, a
                ``shard`` or ``rank_parts`` number past 2**32 - 1: the
                message names the argument and its range), a
                ``batch_size``, ``mode``, ``seed``, ``block_records`` or
                ``window_blocks`` that differs from the ``state``'s (the
                message names both values), or a state
                that does not fit the streams: their records changed since
                it was saved (the message names the stream), or they hold
                another number of records and did not only grow.
                Also: ``rank_parts`` that the datasets were not opened
                with (the message says how to open them), a single store
                under ``rank_parts``, or a state saved with another rank
                split.
            TypeError: ``streams`` is not a dict (a bare Dataset, say), a
                stream is not a zring Dataset or RaggedDataset, or an
                integer argument (``batch_size``, ``seed``, ``num_workers``,
                ``shard``, ``rank_parts``, ``transform_workers``, ...) is not
                an int: a float such as 1.5 is refused, not truncated.
            ValueError: ``one_pass`` over a mixture, a first-fit packing,
                or a mode (given or in ``state``) other than 0; a
                ``last_batch`` other than ``"partial"``, ``"drop"`` or
                ``"pad"``.
        """
        self._loader = None
        self._pool: _TransformPool | None = None
        self._pass: _Pass | None = None
        packed = streams if isinstance(streams, Packed) else None
        mixture = streams if isinstance(streams, Mixture) else None
        if packed is None and mixture is None and not isinstance(streams, Mapping):
            # dict() of a Dataset fails deep inside with a message about
            # sequence elements, which says nothing about what to pass.
            raise TypeError(
                f"DataLoader takes a dict of named streams, such as DataLoader({{\"x\": ds}}, ...), or a "
                f"zring.mix(...) mixture; got a {type(streams).__name__}"
            )
        self.streams = streams if mixture is not None or packed is not None else dict(streams)
        if mixture is None and packed is None and not self.streams:
            raise ValueError("need at least one stream")
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self._views: list[tuple[str, Any]] = []
        budget = _util.cache_bytes(cache_bytes)
        # (label, handle) of every store read, for stats()["reads"].
        self._reads: list[tuple[str, Any]] = []

        def handle(label: str, ds: Any) -> Any:
            self._reads.append((label, ds._s))
            return ds._s

        def specs_of(streams: Mapping[str, Any], prefix: str) -> list[tuple[str, Any, int | None]]:
            out = []
            for name, ds in streams.items():
                if not isinstance(name, str):
                    raise TypeError(f"stream names must be str, got {name!r}")
                if isinstance(ds, Dataset):
                    out.append((name, handle(prefix + name, ds), ds.record_bytes, ds._subset()))
                elif isinstance(ds, RaggedDataset):
                    out.append((name, handle(prefix + name, ds), None, ds._subset()))
                else:
                    raise TypeError(
                        f"stream {name!r} is a {type(ds).__name__}; DataLoader reads zring "
                        "Dataset and RaggedDataset streams"
                    )
            return out

        if packed is not None:
            # The packed source's state carries its own mixture and packing,
            # which the Rust loader checks.
            mixture = packed.mixture
            one = len(packed.datasets) == 1 and mixture is None
            specs = [("tokens", handle("tokens", ds), None, ds._subset()) for ds in packed.datasets] if one else [
                [("tokens", handle(f"{k}/tokens", ds), None, ds._subset())] for k, ds in enumerate(packed.datasets)]
            self._views = _packed_views(packed)
            weights = None if mixture is None else list(mixture.given_weights)
            split = self._rank_check(packed, rank_parts, state)
        elif mixture is not None:
            for name, dtypes in mixture.mixed_dtypes.items():
                raise ValueError(
                    f"the mixture's sources hold stream {name!r} as {', '.join(map(str, dtypes))} (source 0, 1, ...); "
                    f"a loader of records delivers one dtype per stream: read token documents with "
                    f"zring.pack(mix, seq_len), which delivers one dtype, or rewrite the sources in one dtype"
                )
            specs: list[Any] = [specs_of({n: src[n] for n in mixture.names}, f"{k}/")
                                for k, src in enumerate(mixture.sources)]
            self._views = [(name, mixture.sources[0][name]) for name in mixture.names]
            weights: list[float] | None = list(mixture.given_weights)
            split = self._rank_check(mixture, rank_parts, state)
            if state is not None:
                state = mixture.check_state(state)
        else:
            specs = specs_of(self.streams, "")
            self._views = list(self.streams.items())
            weights = None
            split = self._rank_check(self.streams, rank_parts, state)
        if mixture is None and packed is None:
            lengths = {name: len(ds) for name, ds in self.streams.items()}
            if len(set(lengths.values())) != 1:
                raise ValueError(f"all streams must have the same length, got {lengths}")
        if shard is not None:
            try:
                index, count = shard
            except (TypeError, ValueError):
                raise TypeError(f"shard must be an (index, count) pair, got {shard!r}") from None
            shard = (_nonneg("shard index", index, 0, _util.U32_MAX), _nonneg("shard count", count, 1, _util.U32_MAX))
        if state is not None and not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from DataLoader.state(), got {type(state).__name__}")
        threads = _default_workers() if num_workers is None else _nonneg("num_workers", num_workers, 1)
        depth = _nonneg("prefetch_size", prefetch_size, 1)
        workers = _worker_count(transform_workers, threads)
        self.transform = transform
        if one_pass:
            mode = _check_one_pass(streams, mode, state, last_batch)
        if state is None:
            batch_size = 256 if batch_size is None else batch_size
            mode = 1 if mode is None else mode
            seed = 42 if seed is None else seed
        if mode in (1, 2):
            for label, ds in _datasets(streams):
                if getattr(ds, "_lines", None) is not None:
                    share, cap = ds._remote_share
                    raise ValueError(
                        f"{label} ({ds.url}) is read through a cache smaller than its share ({share} B, "
                        f"cache_disk_bytes={cap}): mode {mode} draws any record at any step, so the cache would "
                        f"fetch most of the data again every cycle; use mode=3 (windows of blocks, fetched ahead "
                        f"and evicted by next use), or open it with cache_disk_bytes of at least {share}")
        if budget is not None:
            # One budget per process: the latest live statement; this one is
            # withdrawn at close(), whatever the order of closes.
            self._budget_statement = _zring.state_cache_bytes(budget)
        try:
            loader = _zring.Loader(
                specs,
                batch_size=None if batch_size is None else _nonneg("batch_size", batch_size, 1),
                mode=None if mode is None else _nonneg("mode", mode),
                seed=None if seed is None else _nonneg("seed", seed),
                shard=shard,
                depth=depth,
                threads=threads,
                state=None if state is None else json.dumps(dict(state)),
                weights=weights,
                schedule=None if mixture is None or mixture.schedule is None else mixture.schedule.corners,
                pack=None if packed is None else packed.spec(),
                block_records=None if block_records is None else _nonneg("block_records", block_records, 1),
                window_blocks=None if window_blocks is None else _nonneg("window_blocks", window_blocks, 1),
            )
        except BaseException:
            self.close()
            raise
        self._loader = loader
        #: ``(rank, ranks)`` when this loader is a rank reading only its own
        #: parts (``rank_parts=``, or the datasets'), else None.
        self.rank_parts: tuple[int, int] | None = split
        #: The :func:`zring.mix` mixture read, or None for a dict of streams.
        self.mixture = mixture
        #: The :func:`zring.pack` source read, or None.
        self.packed = packed
        #: The record indices of the batch last returned (each row's index in
        #: its own source for a mixture; a packed source's row numbers);
        #: None before the first batch.
        self.last_indices: np.ndarray | None = None
        #: For a mixture, each row's source (its position in the list given
        #: to :func:`zring.mix`) in the batch last returned; else None.
        self.last_sources: np.ndarray | None = None
        #: The step number of the batch last returned; None before the first.
        self.last_step: int | None = None
        #: Rows of the batch last returned that are real (with ``one_pass``
        #: and ``last_batch="pad"``, fewer than the batch's in the last
        #: one); None before the first batch.
        self.last_valid: int | None = None
        pooled = transform is not _identity and workers > 0
        saved = self._loader.state() if one_pass or pooled else {"sampler": {"step": 0}}
        first = int(saved["sampler"]["step"])
        self._next_step = first
        if one_pass:
            self._pass = _Pass(self, int(saved["sampler"]["batch_size"]), saved.get("shard") or {}, last_batch)
        cut = None if self._pass is None else self._pass.cut
        if pooled:
            self._pool = _TransformPool(self._loader, self._views, transform, workers, workers + depth, first, cut)

    @staticmethod
    def _rank_check(streams: Any, rank_parts: Any, state: Any) -> tuple[int, int] | None:
        """The rank split of a loader over ``streams`` (:func:`rank_split`),
        checked against ``state``'s before anything else of the state (a
        rank's sources have the rank's lengths)."""
        split = rank_split(streams, rank_parts)
        if isinstance(state, Mapping):
            problem = rank_state_problem(state, split)
            if problem is not None:
                raise ValueError(problem)
        return split

    def __len__(self) -> int:
        """With ``one_pass``, the steps of the pass; an endless loader has none."""
        if self._pass is None:
            raise TypeError("an endless loader has no length (one_pass=True makes a finite one)")
        return self._pass.steps

    def __iter__(self) -> "DataLoader":
        return self

    def __next__(self) -> Any:
        loader, pool = self._loader, self._pool
        if loader is None:
            raise ValueError("the DataLoader is closed")
        if self._pass is not None and self._next_step >= self._pass.steps:
            raise StopIteration
        if pool is not None and os.getpid() == pool._pid:
            outcome, value, rows, step = pool.next()
            if outcome == _LOADER_ERROR:
                if value is None:
                    loader.next()  # poisoned: raises PoisonedError
                    raise AssertionError("a poisoned loader returned a batch")  # pragma: no cover
                raise value
            self._delivered(step, *rows)
            if outcome == _TRANSFORM_ERROR:
                raise _with_note(value, step)
            return value
        # transform on this thread (or, in a forked child, the Rust loader's
        # own error about fork)
        step, indices, columns, sources = loader.next()
        batch = _wrap(self._views, indices, columns)
        if self._pass is not None:
            batch, indices = self._pass.cut(step, batch, indices)
        self._delivered(step, indices, sources)
        try:
            return self.transform(batch)
        except Exception as exc:
            note = f"raised by the DataLoader transform at step {step}"
            if hasattr(exc, "add_note"):
                exc.add_note(note)
                raise
            raise RuntimeError(f"{note}: {exc!r}") from exc

    def _delivered(self, step: int, indices: np.ndarray, sources: np.ndarray | None) -> None:
        self.last_step, self.last_indices = step, indices
        self.last_sources = None if sources is None else sources.astype(np.int64)
        self._next_step = step + 1
        self.last_valid = len(indices) if self._pass is None else self._pass.valid(step, len(indices))

    def next(self) -> Any:
        """The next batch (same as ``next(loader)``)."""
        return self.__next__()

    def state(self) -> dict[str, Any]:
        """Where the consumer is: pass it as ``state=`` to resume with the batch
        after the one ``next()`` returned last (however far the transform
        workers have read ahead). A dict of the sampler's parameters and
        step, the shard, a mixture's weights and lengths (and its schedule's
        pieces: :mod:`zring._schedule`), under ``"fingerprints"`` each
        stream's ``{"records", "content"}`` (:meth:`Dataset.fingerprint`;
        ``"<source>/<name>"`` in a mixture), and for a rank's loader
        (``rank_parts``) ``"rank_parts": {"rank", "ranks"}``. Under
        ``"consumed"``, for the reader (never read back), one dict per source
        of what the run consumed before that step, all ranks' rows: ``rows``,
        ``records`` (packed rows: ``documents`` begun and ``tokens``,
        ``rows * seq_len``) and ``epochs`` (records or documents over the
        source's). A packed loader's ``sampler.length`` counts packed rows,
        2^62 a source."""
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        pool = self._pool
        # The workers may have taken steps past the consumer's; a run over a
        # store that grew changes more than the step at its cycle boundary.
        return self._ranked(self._loader.state() if pool is None else self._loader.state_at(pool.next_step))

    def _state_at(self, step: int) -> dict[str, Any]:
        """The state that resumes at ``step`` (delivered or not)."""
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        return self._ranked(self._loader.state_at(_util.integer(step, "step")))

    def _ranked(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with a rank's split (``rank_parts``) recorded."""
        if self.rank_parts is not None:
            state["rank_parts"] = {"rank": self.rank_parts[0], "ranks": self.rank_parts[1]}
        return state

    def stats(self) -> dict[str, Any]:
        """Pipeline statistics: steps, records and bytes gathered, and wait/gather
        percentiles (µs). They describe the Rust loader; with transform workers
        its consumers are those workers, so ``steps_delivered`` counts the steps
        they took, which may run ahead of ``next()``. ``cpu_s`` is the CPU time
        (user + system seconds) of the loader's own threads since it was
        built: the gather threads, the decode pool's share of their gathers,
        and the mode-3 window threads (``window_cpu_s`` of it); divided by
        ``bytes_gathered``, the read path's CPU cost per byte (transform
        workers and ``next()``'s own thread are not in it). Under ``"reads"``,
        each stream's read policy and its cache and page-cache hits (see
        :meth:`Dataset.read_stats`). Under ``"consumed"``, per source, what
        the run consumed before the next step the Rust loader delivers (as
        in :meth:`state`)."""
        if self._loader is None:
            raise ValueError("the DataLoader is closed")
        stats = self._loader.stats()
        stats["reads"] = {label: h.read_stats() for label, h in self._reads}
        return stats

    def close(self) -> None:
        """Stop and join the transform workers, then the gather threads. Safe to
        call twice, and from another thread (a ``next()`` waiting there raises
        ValueError); batches already returned stay valid."""
        pool, self._pool = getattr(self, "_pool", None), None
        loader, self._loader = getattr(self, "_loader", None), None
        if pool is not None:
            pool.close()
        if loader is not None:
            loader.close()
        statement, self._budget_statement = getattr(self, "_budget_statement", None), None
        if statement is not None:
            statement.release()
