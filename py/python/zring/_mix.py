"""Weighted mixtures of datasets (:func:`zring.mix`), exact per batch.

A mixture is a list of stream dicts (the same names, dtypes and item shapes
in each) and a weight per source. ``zring.DataLoader(zring.mix(...), ...)``
delivers batches in which source ``s`` holds its share of the rows exactly:
after ``t + 1`` steps of ``B`` rows, source ``s`` has contributed the
largest-remainder (Hamilton) rounding of ``w_s * (t + 1) * B`` rows, so every
batch holds ``w_s * B`` rows rounded down or up (the remainders carry over
between steps) and the long-run proportions are exact. That allocation is a
pure function of the step, as is everything else here, so ``state()`` and
``state=`` resume exactly and seeking costs nothing.

Each source draws from its own stream of indices in the loader's mode (a
sampler seeded from the loader's seed and the source's position): its rows
at step ``t`` are the next positions of that stream, so in cyclic mode each
source covers its records once per its own cycle, whatever the other sources
do. Rows of a batch come source by source (source 0's first);
``last_sources`` and ``last_indices`` say which source and record each row
is. ``shard=(k, n)`` delivers rows ``k * B / n`` up to ``(k + 1) * B / n`` of
every global batch, and reads only those.

The rows of the steps ahead are gathered by ``num_workers`` threads (the
engine releases the GIL), ``prefetch_size`` steps ahead of the consumer.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import _util
from ._sampler import Sampler
from .dataset import Dataset, RaggedDataset

#: Indices per sampler step of each source's index stream (a divisor of the
#: source's length in cyclic mode, so no record is left out of a cycle).
_BLOCK = 4096


class Mixture:
    """Stream dicts and their weights; pass it to :class:`zring.DataLoader`
    in place of a stream dict. Made by :func:`mix`."""

    def __init__(self, sources: Sequence[Mapping[str, Dataset | RaggedDataset]], weights: Sequence[float]):
        self.sources = [dict(s) for s in sources]
        if not self.sources:
            raise ValueError("a mixture needs at least one source")
        try:
            w = np.asarray([float(x) for x in weights], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"weights must be numbers, got {weights!r}") from None
        if len(w) != len(self.sources):
            raise ValueError(f"{len(w)} weights for {len(self.sources)} sources")
        if not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be positive and finite, got {list(weights)}")
        self.weights = w / w.sum()
        names = list(self.sources[0])
        if not names:
            raise ValueError("source 0 has no streams")
        for k, s in enumerate(self.sources):
            if sorted(s) != sorted(names):
                raise ValueError(f"source {k} has streams {sorted(s)}, source 0 has {sorted(names)}")
            lengths = {n: len(ds) for n, ds in s.items()}
            if len(set(lengths.values())) != 1:
                raise ValueError(f"source {k}: all streams must have the same length, got {lengths}")
            for n, ds in s.items():
                ref = self.sources[0][n]
                if not isinstance(ds, (Dataset, RaggedDataset)):
                    raise TypeError(f"source {k} stream {n!r} is a {type(ds).__name__}, not a zring dataset")
                kind = (type(ds), ds.dtype, getattr(ds, "shape", None), getattr(ds, "item_shape", None))
                want = (type(ref), ref.dtype, getattr(ref, "shape", None), getattr(ref, "item_shape", None))
                if kind != want:
                    raise ValueError(f"source {k} stream {n!r} holds {kind[1:]} in a {kind[0].__name__}, "
                                     f"source 0 holds {want[1:]} in a {want[0].__name__}")
        self.names = names
        self.lengths = [len(next(iter(s.values()))) for s in self.sources]
        if 0 in self.lengths:
            raise ValueError(f"source {self.lengths.index(0)} is empty")

    def allocation(self, rows: int) -> np.ndarray:
        """Rows per source among the first ``rows`` of the mixture (Hamilton)."""
        quota = self.weights * rows
        base = np.floor(quota).astype(np.int64)
        left = int(rows - base.sum())
        if left:
            order = np.lexsort((np.arange(len(quota)), -(quota - base)))
            base[order[:left]] += 1
        return base


def mix(sources: Sequence[Mapping[str, Dataset | RaggedDataset]], weights: Sequence[float]) -> Mixture:
    """A weighted mixture of stream dicts for :class:`zring.DataLoader` (module docs).

    Raises:
        ValueError: No sources, weights that are not positive or do not
            match the sources, or sources whose streams differ in names,
            dtypes or item shapes.
    """
    return Mixture(sources, weights)


def _block(length: int, mode: int) -> int:
    """Indices per sampler step of a source's stream: in cyclic mode the
    largest divisor of its length up to _BLOCK, so cycles leave nothing out."""
    if mode != 2:
        return _BLOCK
    best = 1
    for d in range(1, math.isqrt(length) + 1):
        if length % d == 0:
            for c in (d, length // d):
                if c <= _BLOCK and c > best:
                    best = c
    return best


class _Stream:
    """Positions -> indices of one source (a pure function of the position)."""

    def __init__(self, length: int, mode: int, seed: int):
        self.block = _block(length, mode)
        self.sampler = Sampler(length, self.block, mode, seed)

    def indices(self, start: int, stop: int) -> np.ndarray:
        out = []
        p = start
        while p < stop:
            step, off = divmod(p, self.block)
            take = min(stop - p, self.block - off)
            out.append(self.sampler.batch(step)[off:off + take])
            p += take
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def _mode(v: Any) -> int:
    """A sampler mode as its number (states may name it)."""
    names = {"sequential": 0, "iid": 1, "cyclic": 2}
    if isinstance(v, str) and v.lower() in names:
        return names[v.lower()]
    return int(v)


class MixLoader(_util.Closeable):
    """:class:`zring.DataLoader` over a :class:`Mixture` (module docs)."""

    def __init__(self, mixture: Mixture, num_workers: int = 4, batch_size: int = 256, prefetch_size: int = 4,
                 mode: int = 1, seed: int = 42, transform: Callable[[Any], Any] | None = None, *,
                 state: Mapping[str, Any] | None = None, shard: tuple[int, int] | None = None,
                 transform_workers: int | None = None, cache_bytes: int | None = None):
        self._pool = None
        self.streams = mixture
        self.mixture = mixture
        if state is not None:
            sampler = dict(state["sampler"])
            batch_size, mode, seed = int(sampler["batch_size"]), _mode(sampler["mode"]), int(sampler["seed"])
            start = int(sampler["step"])
            saved = state.get("mixture", {})
            if saved.get("lengths") != mixture.lengths or not np.allclose(saved.get("weights"), mixture.weights):
                raise ValueError("the state was saved for another mixture (other weights or source lengths)")
            if shard is None and "shard" in state:
                shard = (int(state["shard"]["index"]), int(state["shard"]["count"]))
        else:
            start = 0
        for name, v, lo in (("batch_size", batch_size, 1), ("num_workers", num_workers, 1),
                            ("prefetch_size", prefetch_size, 1), ("seed", seed, 0)):
            if not _util.is_int(v) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if mode not in (0, 1, 2):
            raise ValueError(f"mode must be 0, 1 or 2, got {mode!r}")
        small = [k for k, w in enumerate(mixture.weights) if w * batch_size < 1]
        if small:
            raise ValueError(f"source(s) {small} would get less than one row per batch of {batch_size}; "
                             "raise their weights or the batch size")
        index, count = shard if shard is not None else (0, 1)
        if count < 1 or not 0 <= index < count or batch_size % count:
            raise ValueError(f"shard {shard!r} must be (index, count) with count dividing batch_size {batch_size}")
        self.batch_size, self.mode, self.seed, self.shard = int(batch_size), int(mode), int(seed), (index, count)
        self.transform = transform
        self._streams = [_Stream(n, self.mode, (self.seed * 1_000_003 + k) % (1 << 62))
                         for k, n in enumerate(mixture.lengths)]
        self._step = start
        self._depth = int(prefetch_size)
        self._ahead: deque[tuple[int, Future]] = deque()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(int(num_workers), thread_name_prefix="zring-mix")
        self._delivered = 0
        self.last_indices: np.ndarray | None = None
        self.last_sources: np.ndarray | None = None
        self.last_step: int | None = None

    # -- the plan of a step ---------------------------------------------

    def plan(self, step: int) -> list[tuple[int, np.ndarray]]:
        """(source, indices) of this shard's rows of ``step``, source by source."""
        b = self.batch_size
        before = self.mixture.allocation(step * b)
        after = self.mixture.allocation((step + 1) * b)
        index, count = self.shard
        lo, hi = index * b // count, (index + 1) * b // count
        out, row = [], 0
        for k, (p0, p1) in enumerate(zip(before, after)):
            n = int(p1 - p0)
            a, z = max(row, lo), min(row + n, hi)
            if a < z:
                out.append((k, self._streams[k].indices(int(p0) + a - row, int(p0) + z - row)))
            row += n
        return out

    def _gather(self, step: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        parts = self.plan(step)
        batch: dict[str, Any] = {}
        for name in self.mixture.names:
            pieces = [self.mixture.sources[k][name][idx] for k, idx in parts]
            if isinstance(self.mixture.sources[0][name], RaggedDataset):
                values = np.concatenate([v for v, _ in pieces])
                splits, base = [np.zeros(1, np.int64)], 0
                for v, s in pieces:
                    splits.append(np.asarray(s[1:], np.int64) + base)
                    base += len(v)
                batch[name] = (values, np.concatenate(splits))
            else:
                batch[name] = np.concatenate(pieces)
        sources = np.concatenate([np.full(len(idx), k, np.int64) for k, idx in parts])
        indices = np.concatenate([idx for _, idx in parts])
        return batch, sources, indices

    # -- iteration --------------------------------------------------------

    def __len__(self) -> int:
        raise TypeError("an endless loader has no length")

    def __iter__(self) -> "MixLoader":
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._pool is None:
                raise ValueError("the DataLoader is closed")
            nxt = self._ahead[-1][0] + 1 if self._ahead else self._step
            while len(self._ahead) < self._depth:
                self._ahead.append((nxt, self._pool.submit(self._gather, nxt)))
                nxt += 1
            step, fut = self._ahead.popleft()
            self._ahead.append((nxt, self._pool.submit(self._gather, nxt)))
        batch, sources, indices = fut.result()
        self._step = step + 1
        self._delivered += 1
        self.last_step, self.last_sources, self.last_indices = step, sources, indices
        return self.transform(batch) if self.transform is not None else batch

    def next(self) -> Any:
        """The next batch (same as ``next(loader)``)."""
        return self.__next__()

    def state(self) -> dict[str, Any]:
        """Resumes with the batch after the one ``next()`` returned last."""
        return {
            "sampler": {"step": self._step, "batch_size": self.batch_size, "mode": self.mode, "seed": self.seed,
                        "length": sum(self.mixture.lengths)},
            "shard": {"index": self.shard[0], "count": self.shard[1]},
            "mixture": {"weights": [float(w) for w in self.mixture.weights], "lengths": list(self.mixture.lengths)},
        }

    def stats(self) -> dict[str, Any]:
        """Steps delivered, and each source's read statistics under ``"reads"``."""
        reads = {f"{k}.{n}": ds.read_stats() for k, s in enumerate(self.mixture.sources) for n, ds in s.items()}
        return {"steps_delivered": self._delivered, "reads": reads}

    def close(self) -> None:
        """Stops the gather threads. Safe to call twice."""
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            for _, f in getattr(self, "_ahead", ()):
                f.cancel()
            # The garbage collector may finalise the loader on one of its own
            # threads, which cannot join itself: then the others exit alone.
            own = threading.current_thread().name.startswith("zring-mix")
            pool.shutdown(wait=not own, cancel_futures=True)

    def __repr__(self) -> str:
        return (f"DataLoader(mix of {len(self.mixture.sources)} sources, weights "
                f"{json.dumps([round(float(w), 4) for w in self.mixture.weights])}, "
                f"batch {getattr(self, 'batch_size', '?')})")
