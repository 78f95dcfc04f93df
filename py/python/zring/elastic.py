"""Elastic host counts: a run saved by ``N`` ranks goes on with ``M``.

Each of the ``N`` ranks of a run over a dataset of parts (``rank_parts=(k,
N)``) saved its :meth:`zring.DataLoader.state`. With another number of hosts,
each new rank ``j`` of ``M`` builds::

    loader = zring.elastic.ElasticLoader(states, open_rank, rank=j, ranks=M,
                                          batch_size=8, mode=2, seed=1)

``open_rank(rank, ranks)`` returns what a rank reads, opened for that rank:
a dict of :class:`zring.Dataset` / :class:`zring.RaggedDataset` streams, or
:func:`zring.pack` of a RaggedDataset, with ``rank_parts=(rank, ranks)``.
The loader then gives:

1. **The rest of the cycle under way.** Each saved rank was in a cycle of its
   records (documents, for packed rows): the records it had delivered in
   it are known from its state alone (its sampler's draws, or for packed
   rows the documents its rows began). The records no saved rank had
   delivered, among rank ``j``'s parts under the ``M``-rank placement, are
   read once each, as one pass (``one_pass=True``): packed rows in the run's
   mode (2 or 3: shuffled, from ``seed``), the tokens past the pass's end
   cut; records of fixed size in store order, the last batch partial. A
   document whose first token was delivered counts as delivered; the rest of
   it is not read again. Across the ``M`` ranks, these passes hold every
   record not yet delivered exactly once.
2. **Then the new placement.** Rank ``j``'s parts under ``M`` ranks, from the
   first step of a new run of ``batch_size``, ``mode`` (by default the saved
   run's) and ``seed``: every record once per cycle, as any rank's run.

What a host must have. For step 2 its new parts (what ``zring parts --ranks M
--rank j`` lists). For step 1 nothing more for records of fixed size (the
saved ranks' draws are functions of their states and share sizes, read from
the manifest); for packed rows, the saved ranks' shares must open, as their
documents' lengths place the rows: on a shared file system, or through an
object-storage cache (a lazily staged share fetches the record tables and
heads, not the tokens), or with those parts copied.

State. :meth:`ElasticLoader.state` is ``{"elastic": {"from": the saved
states, "rank", "ranks", "seed"}, "phase": 1 or 2, "inner": the running
loader's state}``; ``ElasticLoader(..., state=...)`` resumes it (in phase 1 it
computes the rest of the cycle again, from the saved states it carries).

Supported saved runs: one set of streams in mode 2 or 3, or packed rows of
one source (concat), not grown since their start of cycle. Mixtures are
not taken yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _util
from ._pack import Packed, pack
from ._split import _hash64, _view, whole_positions
from .dataloader import DataLoader
from .dataset import Dataset, RaggedDataset

__all__ = ["ElasticLoader", "remaining"]


def _datasets(source: Any) -> list[Dataset | RaggedDataset]:
    if isinstance(source, Packed):
        if source.mixture is not None:
            raise ValueError("an elastic resume reads one packed source; a mixture's is not taken yet")
        return list(source.datasets)
    if isinstance(source, Mapping):
        return list(source.values())
    raise TypeError(f"open_rank must return a stream dict or zring.pack(...), got {type(source).__name__}")


def _close(source: Any) -> None:
    for ds in _datasets(source):
        with contextlib.suppress(Exception):
            ds.close()


def _saved_ranks(states: Sequence[Mapping[str, Any]]) -> int:
    ranks = {int(s["rank_parts"]["ranks"]) for s in states if isinstance(s.get("rank_parts"), Mapping)}
    if len(ranks) != 1 or len(states) != next(iter(ranks), 0):
        raise ValueError(f"give the state of every saved rank, each saved with rank_parts= (got {len(states)} states "
                         f"of rank counts {sorted(ranks)})")
    got = [int(s["rank_parts"]["rank"]) for s in states]
    if got != list(range(len(states))):
        raise ValueError(f"give the saved ranks' states in rank order 0..{len(states) - 1}, got ranks {got}")
    return len(states)


def remaining(states: Sequence[Mapping[str, Any]], open_rank: Callable[[int, int], Any]) -> np.ndarray:
    """The whole dataset's indices of the records (documents) that no saved
    rank had delivered in its cycle under way, increasing (module docs)."""
    n = _saved_ranks(states)
    out = []
    for k, st in enumerate(states):
        source = open_rank(k, n)
        try:
            ds = _datasets(source)[0]
            whole = whole_positions(ds)
            whole = np.arange(len(ds), dtype=np.uint64) if whole is None else whole
            with DataLoader(source, state=dict(st), num_workers=1, prefetch_size=1, transform_workers=0) as dl:
                step = int(st["sampler"]["step"])
                [(delivered, _cycle)] = dl._loader.delivered_in_cycle(step)
            mask = np.ones(len(whole), bool)
            mask[np.asarray(delivered, np.int64)] = False
            out.append(whole[mask])
        finally:
            _close(source)
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.uint64)


class ElasticLoader(_util.Closeable):
    """Rank ``rank`` of ``ranks`` going on with a run its ``states`` saved with
    another rank count (module docs). Iterate it as a DataLoader; it has
    ``state()``, ``close()`` and ``phase`` (1: the rest of the cycle under
    way, 2: the new placement)."""

    def __init__(self, states: Sequence[Mapping[str, Any]] | None, open_rank: Callable[[int, int], Any], *,
                 rank: int, ranks: int, seed: int = 0, state: Mapping[str, Any] | None = None,
                 **loader_kwargs: Any):
        if state is not None:
            saved = state.get("elastic") if isinstance(state, Mapping) else None
            if not isinstance(saved, Mapping):
                raise ValueError("state= must be an ElasticLoader's state (with \"elastic\")")
            if (int(saved["rank"]), int(saved["ranks"]), int(saved["seed"])) != (rank, ranks, seed):
                raise ValueError(f"the state was saved by rank {saved['rank']} of {saved['ranks']} (seed "
                                 f"{saved['seed']}), not rank {rank} of {ranks} (seed {seed})")
            states = saved["from"]
        if states is None:
            raise ValueError("give the saved ranks' states (or state= of an ElasticLoader)")
        self._from = [dict(s) for s in states]
        _saved_ranks(self._from)
        self.rank, self.ranks, self.seed = _util.integer(rank, "rank"), _util.integer(ranks, "ranks"), int(seed)
        self._open = open_rank
        self._kw = dict(loader_kwargs)
        self._kw.pop("one_pass", None)
        # The saved run's mode, unless another is given.
        saved_mode = self._from[0].get("sampler", {}).get("mode")
        modes = {"Sequential": 0, "Iid": 1, "Cyclic": 2, "Blocked": 3}
        self._kw.setdefault("mode", modes.get(saved_mode, saved_mode))
        self.phase = 1 if state is None else int(state["phase"])
        self._inner: Any = None
        self._source: Any = None
        inner_state = None if state is None else state.get("inner")
        if self.phase == 1:
            self._start_rest(inner_state)
        else:
            self._start_new(inner_state)

    def _start_rest(self, inner_state: Mapping[str, Any] | None) -> None:
        rest = remaining(self._from, self._open)
        source = self._open(self.rank, self.ranks)
        ds = _datasets(source)[0]
        whole = whole_positions(ds)
        whole = np.arange(len(ds), dtype=np.uint64) if whole is None else whole
        mine = np.flatnonzero(np.isin(whole, rest)).astype(np.uint64)
        self.rest_records = int(mine.size)
        if mine.size == 0:
            _close(source)
            self.phase = 2
            self._start_new(None)
            return
        definition = {"elastic": {"rank": self.rank, "ranks": self.ranks, "seed": self.seed}}
        key = _hash64({**definition, "records": int(mine.size)})

        def view(d: Any) -> Any:
            return _view(d, mine, key, 0, definition)

        if isinstance(source, Packed):
            p = source
            rest_source: Any = pack(view(p.datasets[0]), p.seq_len, mode=p.mode, pad_id=p.pad_id, labels=p.labels,
                                    mask_boundaries=p.mask_boundaries, eod_id=p.eod_id, bos_id=p.bos_id,
                                    dtype=p.dtype)
        else:
            rest_source = {name: view(d) for name, d in source.items()}
        # Packed rows: a shuffled pass (the run's mode); records: in order.
        kw = dict(self._kw)
        if not isinstance(source, Packed):
            kw.pop("mode", None)
        else:
            if kw.get("mode") not in (2, 3):
                kw["mode"] = 2
            kw["seed"] = self.seed
        self._source = source
        self._inner = DataLoader(rest_source, one_pass=True, state=None if inner_state is None else dict(inner_state),
                                 **kw)

    def _start_new(self, inner_state: Mapping[str, Any] | None) -> None:
        if self._inner is not None:
            self._inner.close()
        if self._source is not None:
            _close(self._source)
        self._source = self._open(self.rank, self.ranks)
        self._inner = DataLoader(self._source, seed=self.seed,
                                 state=None if inner_state is None else dict(inner_state), **self._kw)

    def __iter__(self) -> "ElasticLoader":
        return self

    def __next__(self) -> Any:
        if self.phase == 1:
            try:
                batch = next(self._inner)
                self.last_valid = self._inner.last_valid
                return batch
            except StopIteration:
                self.phase = 2
                self._start_new(None)
        batch = next(self._inner)
        self.last_valid = self._inner.last_valid
        return batch

    def next(self) -> Any:
        """The next batch (same as ``next(loader)``)."""
        return self.__next__()

    def state(self) -> dict[str, Any]:
        """Resumes with the batch after the last returned (module docs)."""
        return {"elastic": {"from": self._from, "rank": self.rank, "ranks": self.ranks, "seed": self.seed},
                "phase": self.phase, "inner": self._inner.state()}

    def close(self) -> None:
        inner, self._inner = getattr(self, "_inner", None), None
        if inner is not None:
            inner.close()
        source, self._source = getattr(self, "_source", None), None
        if source is not None:
            _close(source)
