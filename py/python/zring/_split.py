"""Train/validation/test splits by document (:func:`zring.split`).

``train, valid, test = zring.split(docs, "969,30,1")`` cuts a dataset (a
:class:`zring.Dataset`, a :class:`zring.RaggedDataset`, a dict of streams of
one length, or a :func:`zring.mix` mixture, each source split on its own)
into parts by record, each a view of the same kind over its records, in
store order. Every reader takes a view where it takes the dataset:
``ds[i]``, :class:`zring.DataLoader` in every mode (the sampler draws from
the view's records alone; mode 3's blocks are consecutive records of the
view, which lie close together in the store), :func:`zring.mix`,
:func:`zring.pack` and :func:`zring.jax.global_loader`.

Two ways to give the parts:

* **Weights** (Megatron's ``split="969,30,1"``): a string of comma-separated
  numbers, or a sequence of numbers (``[0.98, 0.01, 0.01]``), in proportion;
  a part may be 0. They become integer parts ``w_0, ..., w_k`` of a period
  ``P = w_0 + ... + w_k`` (``969,30,1``: ``P = 1000``; ``0.9/0.05/0.05``:
  18/1/1 of 20; at most 1,000,000). Records ``q*P`` up to ``(q+1)*P`` (a
  *period*) are ranked by a keyed random permutation of ``0..P`` drawn
  afresh for each period from ``seed`` and the parts; the record of rank
  ``r`` goes to the part whose cumulative range ``[w_0 + ... + w_(j-1),
  w_0 + ... + w_j)`` holds ``r``. So every whole period holds exactly
  ``w_j`` records of part ``j``: part ``j`` of ``n`` records holds
  ``w_j * n / P`` of them to within ``w_j`` (the last, partial period),
  and the parts are interleaved through the store, not cut into ranges,
  so a validation set samples the whole corpus.
* **Ranges**: a sequence of ``(start, stop)`` record ranges, one per
  part (``stop=None``: to the end); they must not overlap, and records
  in none of them are in no part. A range past the end holds the records
  that exist.

Either way a record's part depends only on its own index (and the seed and
the parts), never on how many records there are. For a rank's share of
a dataset of parts (``rank_parts=(rank, ranks)``) that index is the
record's index in the whole dataset (its part's place in the manifest),
not in the share: the ranks' parts together are the split of the whole
dataset, whatever the rank count, as Megatron's global split is. A store that grows by
appends keeps every record in its part, and each part is its old records
followed by some of the new ones. A :class:`zring.DataLoader` state saved
over a part resumes over the same part of the grown store as over any grown
store (the cycle under way finishes over the old records, the new ones join
from the next). Deleting or rewriting records changes the indices and so
the parts, and the loader refuses such a state as for any changed store.

A view reads through its dataset's handle: closing the dataset closes its
views (closing a view leaves the dataset open). A view's
:meth:`~zring.Dataset.fingerprint` is the store's with the content mixed
with a hash of the split's definition and the part, so a state saved over
one part is refused over another part or another split of the same store;
its ``"records"`` is the store's record count.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ._mix import Mixture
from .dataset import Dataset, RaggedDataset

#: The longest period of a weighted split (the sum of its integer parts).
MAX_PERIOD = 1_000_000

_M64 = (1 << 64) - 1


def key_bits(key: int) -> int:
    """The 32 bits a view's key mixes into its store's content fingerprint
    (the Rust loader's ``zring_loader::key_bits``)."""
    z = (key + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return (z ^ (z >> 32)) & 0xFFFFFFFF


def _hash64(definition: Any) -> int:
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def parts_of(split: Any) -> list[int]:
    """The integer parts of a weighted split: ``"969,30,1"`` -> ``[969, 30, 1]``,
    ``[0.9, 0.05, 0.05]`` -> ``[18, 1, 1]`` (the smallest integers in the
    same proportion).

    Raises:
        ValueError: No parts, a negative or non-finite weight, all zero, or
            proportions that need a period over :data:`MAX_PERIOD`.
    """
    items = split.split(",") if isinstance(split, str) else list(split)
    if not items:
        raise ValueError("a split needs at least one part")
    try:
        # A float is read as its shortest decimal (0.9 is 9/10, not the binary float's fraction).
        fracs = [Fraction(x.strip()) if isinstance(x, str)
                 else Fraction(int(x)) if isinstance(x, (int, np.integer)) else Fraction(repr(float(x)))
                 for x in items]
    except (TypeError, ValueError):
        raise ValueError(f"split weights must be numbers, like \"969,30,1\" or [0.98, 0.01, 0.01]; got {split!r}") \
            from None
    if any(f < 0 for f in fracs) or sum(fracs) == 0:
        raise ValueError(f"split weights must be >= 0 and not all 0, got {split!r}")
    total = sum(fracs)
    shares = [f / total for f in fracs]
    period = math.lcm(*(s.denominator for s in shares))
    if period > MAX_PERIOD:
        raise ValueError(
            f"split weights {split!r} need a period of {period} records (at most {MAX_PERIOD}); give them as "
            f"integers in proportion, like \"969,30,1\""
        )
    return [int(s * period) for s in shares]


def assign(records: int, parts: Sequence[int], seed: int = 0) -> np.ndarray:
    """The part (0, 1, ...) of each of records ``0 .. records`` under the
    weighted split ``parts`` (integers, as :func:`parts_of` gives) and
    ``seed``: an int8 array. A record's part depends on its index, the parts
    and the seed alone (module docs)."""
    parts = [int(p) for p in parts]
    period = sum(parts)
    key = np.uint64(_hash64({"parts": parts, "seed": int(seed)}))
    ends = np.cumsum(parts)
    out = np.empty(records, dtype=np.int8)
    periods = -(-records // period)
    chunk = max(1, (1 << 20) // period)
    ranks = np.arange(period, dtype=np.int64)
    for q0 in range(0, periods, chunk):
        q1 = min(periods, q0 + chunk)
        pos = np.arange(q0 * period, q1 * period, dtype=np.uint64)
        h = _mix64(pos * np.uint64(0x9E3779B97F4A7C15) + key).reshape(q1 - q0, period)
        order = np.argsort(h, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(ranks, order.shape), axis=1)
        lo, hi = q0 * period, min(records, q1 * period)
        out[lo:hi] = np.searchsorted(ends, rank.reshape(-1)[: hi - lo], side="right")
    return out


def assign_at(positions: np.ndarray, parts: Sequence[int], seed: int = 0) -> np.ndarray:
    """:func:`assign` at the given record indices (increasing uint64): the
    part of each, exactly as ``assign(n, parts, seed)[positions]`` for any
    ``n`` past them, costing the periods they touch alone. A rank's share of
    a dataset of parts is split at its records' indices in the whole
    dataset this way."""
    parts = [int(p) for p in parts]
    period = sum(parts)
    key = np.uint64(_hash64({"parts": parts, "seed": int(seed)}))
    ends = np.cumsum(parts)
    pos = np.ascontiguousarray(positions, dtype=np.uint64)
    out = np.empty(pos.size, dtype=np.int8)
    if pos.size == 0:
        return out
    if pos.size > 1 and bool(np.any(pos[1:] < pos[:-1])):
        raise ValueError("assign_at needs increasing record indices")
    q = pos // np.uint64(period)
    qs, inv = np.unique(q, return_inverse=True)
    chunk = max(1, (1 << 20) // period)
    ranks = np.arange(period, dtype=np.int64)
    within = (pos % np.uint64(period)).astype(np.int64)
    for c0 in range(0, len(qs), chunk):
        c1 = min(len(qs), c0 + chunk)
        lo, hi = np.searchsorted(inv, [c0, c1])
        base = (qs[c0:c1, None] * np.uint64(period)) + np.arange(period, dtype=np.uint64)
        h = _mix64(base * np.uint64(0x9E3779B97F4A7C15) + key)
        order = np.argsort(h, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(ranks, order.shape), axis=1)
        out[lo:hi] = np.searchsorted(ends, rank[inv[lo:hi] - c0, within[lo:hi]], side="right")
    return out


def whole_positions(ds: Any) -> np.ndarray | None:
    """For a rank's share of a dataset of parts (``rank_parts=``): each of its
    records' index in the whole dataset (increasing uint64). None for any
    other dataset, whose own indices are the whole dataset's."""
    if getattr(ds, "rank_parts", None) is None:
        return None
    listed = ds._s.parts_list()
    if not listed:
        return np.zeros(0, np.uint64)
    return np.concatenate([np.arange(p["whole_start"], p["whole_start"] + p["records"], dtype=np.uint64)
                           for p in listed])


def _ranges_of(split: Sequence[Any]) -> list[tuple[int, int | None]]:
    out = []
    for r in split:
        try:
            start, stop = r
        except (TypeError, ValueError):
            raise TypeError(f"each range must be a (start, stop) pair, got {r!r}") from None
        if not isinstance(start, (int, np.integer)) or (stop is not None and not isinstance(stop, (int, np.integer))):
            raise TypeError(f"a range's start and stop must be ints (stop may be None), got {r!r}")
        if start < 0 or (stop is not None and stop < start):
            raise ValueError(f"a range must have 0 <= start <= stop, got {r!r}")
        out.append((int(start), None if stop is None else int(stop)))
    spans = sorted((a, math.inf if b is None else b) for a, b in out)
    for (a0, b0), (a1, _) in zip(spans, spans[1:]):
        if a1 < b0:
            raise ValueError(f"split ranges overlap: [{a0}, {b0}) and one starting at {a1}; parts must be disjoint")
    return out


def _is_ranges(split: Any) -> bool:
    return (not isinstance(split, str) and isinstance(split, Sequence) and len(split) > 0
            and all(isinstance(r, (tuple, list)) for r in split))


class _Splitter:
    """One split definition, applied to datasets of any length."""

    def __init__(self, split: Any, seed: int):
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if _is_ranges(split):
            self.ranges: list[tuple[int, int | None]] | None = _ranges_of(split)
            self.parts: list[int] | None = None
            self.definition: dict[str, Any] = {"ranges": self.ranges}
            self.count = len(self.ranges)
        else:
            self.ranges = None
            self.parts = parts_of(split)
            self.definition = {"parts": self.parts, "seed": int(seed)}
            self.count = len(self.parts)
        self.seed = int(seed)
        self._cache: dict[int, list[np.ndarray]] = {}

    def records(self, n: int) -> list[np.ndarray]:
        """Each part's records among ``0 .. n``, increasing (uint64)."""
        if n not in self._cache:
            if self.ranges is not None:
                self._cache[n] = [np.arange(min(a, n), n if b is None else min(b, n), dtype=np.uint64)
                                  for a, b in self.ranges]
            else:
                which = assign(n, self.parts or [], self.seed)
                self._cache[n] = [np.flatnonzero(which == k).astype(np.uint64) for k in range(self.count)]
        return self._cache[n]

    def records_at(self, positions: np.ndarray) -> list[np.ndarray]:
        """Each part's records of a rank's share whose records lie at
        ``positions`` of the whole dataset: local indices, increasing."""
        if self.ranges is not None:
            out = []
            for a, b in self.ranges:
                inside = positions >= a
                if b is not None:
                    inside &= positions < b
                out.append(np.flatnonzero(inside).astype(np.uint64))
            return out
        which = assign_at(positions, self.parts or [], self.seed)
        return [np.flatnonzero(which == k).astype(np.uint64) for k in range(self.count)]

    def key(self, part: int, whole: bool = False) -> int:
        # A rank's view keys on the whole dataset's indices: another key, so a
        # state saved over a split of the share alone is refused.
        return _hash64({**self.definition, "part": part, **({"over": "whole"} if whole else {})})


class _Names(Sequence[str]):
    """A view's record names: its dataset's, through the view's records."""

    def __init__(self, names: Sequence[str], records: np.ndarray):
        self._names, self._records = names, records

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._names[int(r)] for r in self._records[i]]
        return self._names[int(self._records[i])]

    def __iter__(self) -> Iterator[str]:
        return (self._names[int(r)] for r in self._records)


class _View:
    """What a split view adds to its Dataset or RaggedDataset class."""

    _parent: Dataset | RaggedDataset
    _map: np.ndarray
    _key: int
    _closed: bool
    #: The view's part number and the split it is a part of (its definition).
    part: int
    split: dict[str, Any]

    @property
    def _s(self) -> Any:
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        return self._parent._s

    @property
    def records(self) -> np.ndarray:
        """The store's records in this part, increasing (a read-only uint64 array)."""
        return self._map

    def __len__(self) -> int:
        return len(self._map)

    def _records(self, idx: np.ndarray) -> np.ndarray:
        return self._map[idx]

    def _subset(self) -> tuple[np.ndarray, int] | None:
        return self._map, self._key

    def fingerprint(self) -> dict[str, Any]:
        """The store's ``{"records", "content"}``, the content mixed with this
        part's key (a hash of the split's definition and the part)."""
        fp = dict(self._parent.fingerprint())
        fp["content"] = int(fp["content"]) ^ key_bits(self._key)
        return fp

    @property
    def names(self) -> Sequence[str] | None:
        """The names of this part's records (its dataset's), or None."""
        names = self._parent.names
        return None if names is None else _Names(names, self._map)

    def close(self) -> None:
        """Forget the dataset (which stays open). Safe to call twice."""
        self._closed = True

    def __repr__(self) -> str:
        return (f"<zring split part {self.part} of {self.split}: {len(self._map)} records of "
                f"{self._parent!r}>")


class SplitDataset(_View, Dataset):
    """A part of a :class:`zring.Dataset` (:func:`zring.split`): a Dataset
    over some of its records, in store order."""


class SplitRaggedDataset(_View, RaggedDataset):
    """A part of a :class:`zring.RaggedDataset` (:func:`zring.split`)."""


def _view(ds: Any, records: np.ndarray, key: int, part: int, definition: dict[str, Any]) -> Any:
    if isinstance(ds, _View):
        raise TypeError("split a dataset, not a part of one (split the dataset into more parts instead)")
    if isinstance(ds, RaggedDataset):
        cls: type = SplitRaggedDataset
    elif isinstance(ds, Dataset):
        cls = SplitDataset
    else:
        hint = " (split the documents, then pack a part)" if hasattr(ds, "seq_len") else ""
        raise TypeError(f"zring.split reads zring Datasets, RaggedDatasets, dicts of them and mixtures; "
                        f"got a {type(ds).__name__}{hint}")
    view = object.__new__(cls)
    view.__dict__.update({k: v for k, v in ds.__dict__.items() if k != "_names"})
    records = records.view()
    records.flags.writeable = False
    view.__dict__.update(_parent=ds, _map=records, _key=key, _closed=False, _store=None, part=part,
                         split=definition)
    return view


def split(data: Any, split: Any, *, seed: int = 0) -> tuple[Any, ...]:
    """Cut ``data`` into parts by record: one view per part, of the same
    kind as ``data``, usable wherever ``data`` is (``ds[i]``,
    :class:`zring.DataLoader` in every mode, :func:`zring.mix`,
    :func:`zring.pack`, :func:`zring.jax.global_loader`).

    Weights (``"969,30,1"``) become the smallest integer parts ``w_j`` of a
    period ``P = sum(w_j)`` (at most 1,000,000). The records of each period
    (``q*P`` up to ``(q+1)*P``) are ranked by a keyed random permutation of
    their own (from ``seed`` and the parts), and ranks ``w_0 + ... +
    w_(j-1)`` up to ``w_0 + ... + w_j`` go to part ``j``: every whole
    period holds exactly ``w_j`` records of part ``j``, so part ``j`` of
    ``n`` records is ``w_j * n / P`` to within ``w_j``, spread through the
    store. Ranges (``[(0, 900_000), (900_000, None)]``) are parts as
    given (``None``: to the end; a range past the end holds what exists).

    A record's part depends on its index alone (and the seed and parts),
    never on the store's length (for a rank's share of a dataset of parts,
    its index in the whole dataset: the ranks' validation parts together
    are the whole dataset's, with any rank count): after appends every record stays in its
    part, at its place, and each part gains some new records after its old
    ones; a loader state saved over a part resumes over the same part of
    the grown store (the cycle under way ends over the old records). A
    part's :meth:`~zring.Dataset.fingerprint` is the store's with the
    content mixed with a hash of the split and the part, so a state saved
    over one part is refused over another. A part reads through its
    dataset's handle: closing the dataset closes its parts.

    Args:
        data: A :class:`zring.Dataset` or :class:`zring.RaggedDataset`; a
            dict of them, all of one length (every stream gets the same
            records); or a :func:`zring.mix` mixture, each source split on
            its own with the same parts and seed (Megatron's per-split
            blends: mix the parts yourself for other weights per part).
        split: Weights, ``"969,30,1"`` or ``[0.98, 0.01, 0.01]`` (records
            interleaved, exact per period of ``sum`` records); or ranges,
            ``[(0, 900_000), (900_000, 950_000), (950_000, None)]``.
        seed: Which permutation a weighted split uses (ignored for ranges).
            Independent of any loader's seed, so the parts stay fixed
            whatever the loaders do.

    Returns:
        A tuple with one view per part, a ``zring.SplitDataset`` /
        ``zring.SplitRaggedDataset`` (subclasses of Dataset /
        RaggedDataset whose ``records`` are the store's records in the
        part), or dicts of them. A mixture gives a mixture per part with the
        mixture's weights, or None for a part some source has no record in.

    Raises:
        ValueError: Bad weights (negative, all 0, a period over 1,000,000),
            ranges that overlap or are not ``0 <= start <= stop``, a dict of
            streams of different lengths.
        TypeError: ``data`` is not a zring dataset, dict or mixture, or is
            a part already.
    """
    s = _Splitter(split, seed)

    def views(ds: Any) -> list[Any]:
        if not isinstance(ds, (Dataset, RaggedDataset)):
            _view(ds, np.zeros(0, np.uint64), 0, 0, {})  # raises the TypeError
        pos = whole_positions(ds)
        recs = s.records(len(ds)) if pos is None else s.records_at(pos)
        return [_view(ds, r, s.key(k, pos is not None), k, s.definition) for k, r in enumerate(recs)]

    def dict_views(streams: Mapping[str, Any]) -> list[dict[str, Any]]:
        lengths = {name: len(ds) for name, ds in streams.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"all streams must have the same length, got {lengths}")
        per = {name: views(ds) for name, ds in streams.items()}
        return [{name: per[name][k] for name in streams} for k in range(s.count)]

    if isinstance(data, Mixture):
        per_source = [dict_views(src) for src in data.sources]
        out: list[Any] = []
        for k in range(s.count):
            sources = [per_source[j][k] for j in range(len(data.sources))]
            lengths = [len(next(iter(src.values()))) for src in sources]
            if 0 in lengths:
                out.append(None)
                continue
            m = copy.copy(data)
            m.sources, m.lengths = sources, lengths
            out.append(m)
        return tuple(out)
    if isinstance(data, Mapping):
        return tuple(dict_views(data))
    return tuple(views(data))


__all__: Sequence[str] = ["SplitDataset", "SplitRaggedDataset", "split", "assign", "assign_at", "parts_of",
                          "whole_positions"]
