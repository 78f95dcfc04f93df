"""Weighted mixtures of datasets (:func:`zring.mix`), exact over the run.

A mixture is a list of stream dicts (the same names, dtypes and item shapes
in each; RaggedDatasets of integer documents may differ in dtype, which
:func:`zring.pack` turns into one) and a weight per source. ``zring.DataLoader(zring.mix(...), ...)``
delivers batches in which source ``s`` holds its share of the rows: after
``t + 1`` steps of ``B`` rows, source ``s`` has contributed the
largest-remainder (Hamilton) rounding of ``w_s * (t + 1) * B`` rows, that
product rounded down or up, so the remainders carry over between steps and
the long-run proportions are exact. The running total is what is rounded, not
each batch: a batch holds ``w_s * B`` rows rounded down or up, or one row
further (``floor(w_s * B) - 1`` to ``ceil(w_s * B) + 1``; 178 to 180 rows for
0.7 of 256). That allocation is a pure function of the step, as is
everything else here, so ``state()`` and ``state=`` resume exactly and
seeking costs nothing.

Any positive weight is accepted. A source of under one row per batch
(``w_s * B < 1``: a 0.1 % source at 256 rows gets 0.256) gets its rows over
the steps, about one every ``1 / (w_s * B)`` steps: the running totals then
come from a binary tree of roundings (nearest, from all the rows so far down
to each such source, and to the group of the others, whose members share
theirs by largest remainder), still a function of the step alone. Each
source's rows so far stay within one row of ``w_s * rows so far`` (its share
rounded down or up) whenever at most three sources are under a row per
batch, whatever the weights: at 0.9989/0.001/0.0001 of 256 rows, at most
0.50, 0.90 and 0.50 rows off over 20,000 steps. With more of them the bound
depends on the weights, most often under a row too (five small sources of
0.03 to 0.001 beside six larger ones at 64 rows: within 0.99 rows; ten sources
of 0.003 beside one of 0.97 at 256 rows: within 1.04 rows, 0.94 seen over
20,000 steps). Those sources' rows go round
the ranks of ``shard=``: with ``n`` shards (a power of two dividing ``B``)
each shard holds ``1 / n`` of their rows so far rounded down or up, so one
such source alone has its share of every shard's rows within a row; two or
more share the rounds, and one can be a little further (1.5 rows for the
0.001 source above on 8 shards). A mixture whose every source has a row per
batch or more keeps the batches it had before.

Weights may follow a :func:`zring.schedule` (piecewise linear or constant
over the steps): the rows so far are then the same roundings of each
source's target, the batch times the integral of its weight, and a state
resumed under other weights follows them from its step on
(:mod:`zring._schedule`).

Each source draws from its own stream of indices in the loader's mode (a
sampler seeded from the loader's seed and the source's position): its rows
at step ``t`` are the next positions of that stream, so in cyclic mode each
source covers its records once per its own cycle, whatever the other sources
do. Rows of a batch are interleaved so that every shard holds each source's
share of its own rows: ``shard=(k, n)`` delivers rows ``k * B / n`` up to
``(k + 1) * B / n`` of every global batch (and reads only those), and for
every ``n`` that is a power of two dividing ``B`` (more precisely, a prefix
product of ``B``'s prime factors taken twos first) each source's rows in
each shard are its share ``c_s / n`` of the shard's ``B / n`` rows (``c_s`` its rows
of the global batch) rounded down or up: at 256 rows over 8 ranks, a
0.7/0.2/0.1 mixture gives every rank 22 or 23, 6 or 7, and 3 or 4 of its 32
rows on every step. ``last_sources`` and ``last_indices`` say which source
and record each row is. A state saved before rows were interleaved (its
``"mixture"`` has no ``"order"``) resumes with its rows grouped source by
source, as they were saved.

The plan of each step and the gathers run in the Rust loader
(``zring_sampler::Mixture``, ``zring_loader::Loader::new_mixture``): on its
workers, with the GIL released, every source's rows gathered straight into
their slots of the batch, with the same transform workers, errors, state and
next-use hints for the record cache as a loader over one stream dict. This
module checks the arguments. The batches are those of zring's earlier
Python mixture loader for the same seed, so its checkpoints restore (except
where that loader gave short batches: iid or sequential sources of fewer
than 4,096 records).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import _util, _zring
from ._schedule import Schedule
from .dataset import Dataset, RaggedDataset

_MODE_NAMES = {0: "Sequential", 1: "Iid", 2: "Cyclic", "sequential": "Sequential", "iid": "Iid", "cyclic": "Cyclic"}


class Mixture:
    """Stream dicts and their weights; pass it to :class:`zring.DataLoader`
    in place of a stream dict. Made by :func:`mix`."""

    def __init__(self, sources: Sequence[Mapping[str, Dataset | RaggedDataset] | Dataset | RaggedDataset],
                 weights: Sequence[float] | Schedule):
        # A bare dataset is a source of one stream, "tokens" (for zring.pack).
        self.sources = [{"tokens": s} if isinstance(s, (Dataset, RaggedDataset)) else dict(s) for s in sources]
        if not self.sources:
            raise ValueError("a mixture needs at least one source")
        #: The :func:`zring.schedule` of the weights, or None for fixed
        #: weights (``weights`` are then the schedule's mean weights, which
        #: only shape the rounding of sources under a row per batch).
        self.schedule = weights if isinstance(weights, Schedule) else None
        if self.schedule is not None:
            if self.schedule.sources != len(self.sources):
                raise ValueError(
                    f"a schedule of {self.schedule.sources} weights a point for {len(self.sources)} sources")
            weights = self.schedule.mean_weights()
        w = np.asarray(_util.weights(weights, "weights", positive=self.schedule is None), dtype=np.float64)
        #: The weights as given (the loader normalises them as NumPy does).
        self.given_weights = [float(x) for x in w]
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
                if isinstance(ds, RaggedDataset) and ds.dtype.kind in "iu" and ref.dtype.kind in "iu":
                    # Integer documents of other dtypes: zring.pack delivers
                    # one dtype (a loader of records refuses them).
                    kind = (kind[0], ref.dtype, *kind[2:])
                if kind != want:
                    raise ValueError(f"source {k} stream {n!r} holds {kind[1:]} in a {kind[0].__name__}, "
                                     f"source 0 holds {want[1:]} in a {want[0].__name__}")
        self.names = names
        #: Per stream, the dtypes of its sources where they differ (integer
        #: documents only, for zring.pack); empty when each stream has one.
        self.mixed_dtypes = {
            n: [s[n].dtype for s in self.sources] for n in names if len({s[n].dtype for s in self.sources}) > 1
        }
        self.lengths = [len(next(iter(s.values()))) for s in self.sources]
        if 0 in self.lengths:
            raise ValueError(f"source {self.lengths.index(0)} is empty")

    def allocation(self, rows: int, batch_size: int | None = None) -> np.ndarray:
        """Rows per source among the first ``rows`` of the mixture: the largest
        remainders (Hamilton) of the shares; with ``batch_size``, what a
        loader of that many rows per batch counts, which is the same unless a
        source gets under a row per batch (module docs). Both are ints from
        0 (1 for ``batch_size``) to 2**64 - 1."""
        rows = _util.integer(rows, "rows")
        if batch_size is not None:
            batch_size = _util.integer(batch_size, "batch_size", 1)
        if self.schedule is not None:
            if batch_size is None:
                raise TypeError("a scheduled mixture's allocation needs batch_size (its steps)")
            got = _zring.mixture_allocation(self.given_weights, batch_size, rows,
                                            schedule=self.schedule.corners)
            return np.asarray(got, dtype=np.int64)
        if batch_size is not None and np.any(self.weights * batch_size < 1):
            got = _zring.mixture_allocation(self.given_weights, batch_size, rows)
            return np.asarray(got, dtype=np.int64)
        quota = self.weights * rows
        base = np.floor(quota).astype(np.int64)
        left = int(rows - base.sum())
        if left:
            order = np.lexsort((np.arange(len(quota)), -(quota - base)))
            base[order[:left]] += 1
        return base

    def check_state(self, state: Any) -> dict[str, Any]:
        """A :meth:`zring.DataLoader.state` of a loader over this mixture, in
        the form the Rust loader reads (mode names; the length and shard
        filled in where an older state left them out).

        A state saved under other weights or another schedule is taken:
        the loader keeps its weights up to the saved step and follows this
        mixture's from there on (:mod:`zring._schedule`).

        Raises:
            ValueError: The state was saved for a mixture of other sources
                (another number, or fewer records: the data changed) or for
                a loader over one stream dict. Sources that grew by appends
                resume, each finishing its cycle under way first.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from DataLoader.state(), got {type(state).__name__}")
        saved = state.get("mixture")
        if not isinstance(saved, Mapping):
            raise ValueError("the state was saved for a loader over one stream dict, not a mixture")
        was = saved.get("lengths")
        # Sources that only grew resume (the Rust loader checks that their
        # saved records are unchanged): their cycle under way ends over the
        # saved records, and the new ones join at the next.
        if not (isinstance(was, list) and len(was) == len(self.lengths)
                and all(int(a) <= int(b) for a, b in zip(was, self.lengths))):
            raise ValueError(f"the state was saved for a mixture of sources of {was} records, "
                             f"these hold {self.lengths}: the data changed; resume over the sources it was saved with "
                             f"(or over them grown by appends)")
        out = dict(state)
        sampler = dict(out["sampler"])
        sampler["mode"] = _MODE_NAMES.get(sampler["mode"], sampler["mode"])
        sampler.setdefault("length", sum(self.lengths))
        out["sampler"] = sampler
        out.setdefault("shard", {"index": 0, "count": 1})
        return out


def mix(sources: Sequence[Mapping[str, Dataset | RaggedDataset] | Dataset | RaggedDataset],
        weights: Sequence[float] | Schedule) -> Mixture:
    """A weighted mixture of stream dicts for :class:`zring.DataLoader`.
    A bare dataset counts as the stream dict ``{"tokens": ds}``; a mixture of
    RaggedDatasets of token documents is what :func:`zring.pack` takes.

    After ``t + 1`` steps of ``B`` rows, source ``s`` has given the
    largest-remainder rounding of ``w_s * (t + 1) * B`` rows (the running
    total is rounded, so the long-run shares are exact; one batch holds
    ``floor(w_s * B) - 1`` to ``ceil(w_s * B) + 1`` of its rows). The
    weights need not sum to 1 and may be as small as you like: a source of
    under one row per batch gets its rows over the steps, within a row of
    its share of the rows so far while at most three sources are that
    small. Each source samples its own records (a sampler seeded from the
    loader's seed and the source's position); the
    plan is a pure function of the step, so ``state()`` and ``state=``
    resume exactly, and each ``shard=`` holds each source's share of its
    own rows. :attr:`zring.DataLoader.last_sources` names each row's source.

    Every rule (the rounding, small weights, shards, resuming old states)
    is in the "Language-model input" page of the API reference
    (``docs/lm.rst``; in Python, ``help(zring._mix)``).

    ``weights`` may be a :func:`zring.schedule`: weights as a function of the
    step (piecewise linear or constant), each source's rows so far within a
    row of the integral of its weight (:mod:`zring._schedule`). Resuming a
    state under other weights or another schedule keeps the saved weights
    up to the saved step and follows the new ones from there on.

    Raises:
        ValueError: No sources, weights that are not positive and finite,
            that sum past the largest float (1e308 and 1e308: scale them
            down, only their ratios matter) or do not match the sources, or
            sources whose streams differ in names, item shapes or dtypes
            (integer RaggedDatasets may differ in dtype: ``zring.pack``
            delivers one; a DataLoader of records over them refuses).
        TypeError: Weights that are not a sequence of numbers (a string
            such as ``"11"``, a bool).
    """
    return Mixture(sources, weights)
