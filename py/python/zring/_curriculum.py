"""Curricula: the batch size and the packed sequence length as functions of
the step (Megatron's batch-size ramp-up; a sequence-length warm-up).

``zring.ramp({0: 8, 1000: 16, 2000: 32})`` is an int that changes with the
step (held from each point to the next; ``interpolate="linear"`` moves
linearly between points, rounded down to ``multiple``).
``zring.rampup_batch_size(start, increment, samples, target)`` is
Megatron's ``--rampup-batch-size``: the batch grows by ``increment`` each
time ``samples / ((target - start) / increment)`` more samples have been
consumed. Give a ramp as ``batch_size=`` of :class:`zring.DataLoader`, or as
``seq_len=`` of :func:`zring.pack` (concat mode), or both::

    seq = zring.ramp({0: 512, 1000: 1024, 2000: 2048})
    batch = zring.ramp({0: 8, 500: 16, 1500: 32})
    dl = zring.DataLoader(zring.pack(docs, seq, labels=True), batch_size=batch, mode=2)

How it works. The run is one packed (or record) stream read in *ticks*: a
Rust loader of ``g`` rows of ``u`` tokens a step, ``u`` the greatest common
divisor of the sequence lengths and ``g`` that of every step's
``batch * seq_len / u``. Step ``t`` takes the next ``batch_t * seq_len_t /
(u g)`` ticks and lays their rows end to end, ``seq_len_t / u`` to a row:
a packed row is a stretch of the token stream, so ``seq_len_t / u``
consecutive rows of ``u`` tokens are one row of ``seq_len_t`` tokens, with
each token's position in its document and its label (its next token) as
the stream has them; ``segment_ids`` are numbered again along the longer
row (a document piece that runs on from one short row into the next is one
segment). The stream is the one a loader of fixed shape reads, so every
document is in it once per cycle, whatever the ramps do: a cycle ends
after the same tokens. With records instead of packed rows (a batch-size
ramp alone), a step takes ``batch_t / g`` ticks of ``g`` records.

State and seeking. :meth:`zring.CurriculumLoader.state` is ``{"curriculum": the
ramps and the tick shape, "step": t, "inner": the Rust loader's state at
its tick}``; a loader built with ``state=`` goes on at step ``t`` with the
same batches (the ramps must be the saved ones: another curriculum is
refused). To seek, set ``state["step"]`` to another step: its tick is a
function of the step.

With ``shard=(i, k)`` each process takes its slice of every tick (``g`` must
be a multiple of ``k``): its rows of a step are then not consecutive in the
stream, and each short row's pieces are their own segments. First-fit rows
are padded bins, so a sequence-length ramp needs ``mode="concat"``; a
batch-size ramp alone works with either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _util

__all__ = ["CurriculumLoader", "Ramp", "ramp", "rampup_batch_size"]


class Ramp:
    """An int as a function of the step (:func:`ramp`)."""

    def __init__(self, points: Mapping[int, int] | Sequence[tuple[int, int]], interpolate: str = "step",
                 multiple: int = 1):
        items = sorted(points.items()) if isinstance(points, Mapping) else [tuple(p) for p in points]
        if not items:
            raise ValueError("a ramp needs at least one (step, value) point")
        for p in items:
            if len(p) != 2 or not all(_util.is_int(x) for x in p):
                raise TypeError(f"a ramp's points are (step, value) pairs of ints, got {p!r}")
        steps = [int(s) for s, _ in items]
        values = [int(v) for _, v in items]
        if steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"a ramp's steps must start at 0 and increase, got {steps}")
        if interpolate not in ("step", "linear"):
            raise ValueError(f'interpolate must be "step" or "linear", got {interpolate!r}')
        if not _util.is_int(multiple) or multiple < 1:
            raise ValueError(f"multiple must be an int >= 1, got {multiple!r}")
        if any(v < 1 or v % multiple for v in values):
            raise ValueError(f"a ramp's values must be >= 1 and multiples of {multiple}, got {values}")
        self.steps, self.values, self.interpolate, self.multiple = steps, values, interpolate, int(multiple)
        #: The steps at which the value changes, and the value from each.
        self.pieces: list[tuple[int, int]] = self._pieces()

    def _pieces(self) -> list[tuple[int, int]]:
        out = [(0, self.values[0])]
        for (s0, v0), (s1, v1) in zip(zip(self.steps, self.values), zip(self.steps[1:], self.values[1:])):
            if self.interpolate == "linear" and v1 != v0:
                # Each multiple between v0 and v1, from the first step at or past it.
                lo, hi = sorted((v0, v1))
                for v in range(lo + self.multiple, hi + 1, self.multiple) if v1 > v0 else \
                        range(hi - self.multiple, lo - 1, -self.multiple):
                    # The first step s in (s0, s1] whose value reaches v.
                    a, b = s0 + 1, s1
                    while a < b:
                        m = (a + b) // 2
                        if (self(m) >= v) if v1 > v0 else (self(m) <= v):
                            b = m
                        else:
                            a = m + 1
                    if a > out[-1][0]:
                        out.append((a, self(a)))
                    elif out[-1][1] != self(a):
                        out[-1] = (a, self(a))
            if out[-1][1] != v1:
                out.append((s1, v1))
        # Merge equal neighbours.
        merged = [out[0]]
        for s, v in out[1:]:
            if v != merged[-1][1]:
                merged.append((s, v))
        return merged

    def __call__(self, step: int) -> int:
        k = int(np.searchsorted(self.steps, step, side="right")) - 1
        if self.interpolate == "step" or k == len(self.steps) - 1:
            return self.values[k]
        s0, s1, v0, v1 = self.steps[k], self.steps[k + 1], self.values[k], self.values[k + 1]
        v = v0 + (v1 - v0) * (step - s0) / (s1 - s0)
        m = self.multiple
        return int(math.floor(v / m) * m) if v1 > v0 else int(math.ceil(v / m) * m)

    def distinct(self) -> list[int]:
        return sorted({v for _, v in self.pieces})

    def definition(self) -> dict[str, Any]:
        return {"points": [[s, v] for s, v in zip(self.steps, self.values)], "interpolate": self.interpolate,
                "multiple": self.multiple}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ramp) and self.definition() == other.definition()

    def __repr__(self) -> str:
        return f"zring.ramp({dict(zip(self.steps, self.values))}, interpolate={self.interpolate!r})"


def ramp(points: Mapping[int, int] | Sequence[tuple[int, int]], *, interpolate: str = "step",
         multiple: int = 1) -> Ramp:
    """An int that changes with the step: ``points`` are ``{step: value}`` (or
    ``(step, value)`` pairs), the first at step 0. ``interpolate="step"``
    holds each value until the next point; ``"linear"`` moves linearly
    between points, rounded to a multiple of ``multiple`` (toward the
    earlier point's value). For :class:`zring.DataLoader`'s ``batch_size``
    and :func:`zring.pack`'s ``seq_len`` (module docs of
    :mod:`zring._curriculum`).

    Raises:
        ValueError: No points, steps not starting at 0 or not increasing,
            values below 1 or not multiples of ``multiple``, or another
            ``interpolate``.
        TypeError: A point that is not a pair of ints.
    """
    return Ramp(points, interpolate, multiple)


def rampup_batch_size(start: int, increment: int, samples: int, target: int) -> Ramp:
    """Megatron's ``--rampup-batch-size start increment samples`` toward a
    global batch of ``target``: the batch starts at ``start`` and grows by
    ``increment`` each time another ``samples / ((target - start) /
    increment)`` samples are consumed, as a :class:`Ramp` of the step."""
    for name, v in (("start", start), ("increment", increment), ("samples", samples), ("target", target)):
        if not _util.is_int(v) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if target < start or (target - start) % increment:
        raise ValueError(f"target - start ({target} - {start}) must be a multiple of increment {increment}, >= 0")
    rises = (target - start) // increment
    points = {0: start}
    if rises:
        per = samples / rises
        step, consumed, batch = 0, 0, start
        for r in range(1, rises + 1):
            # Steps at the current batch until `per * r` samples are consumed.
            need = math.ceil((per * r - consumed) / batch)
            step += max(need, 1)
            consumed += max(need, 1) * batch
            batch = start + r * increment
            points[step] = batch
    return Ramp(points, "step", math.gcd(start, increment))


def _gcd(values: Sequence[int]) -> int:
    g = 0
    for v in values:
        g = math.gcd(g, int(v))
    return g


class CurriculumLoader(_util.Closeable):
    """A :class:`zring.DataLoader` whose batch size, and packed sequence
    length, follow ramps (module docs). Made by ``zring.DataLoader(...)``
    given a :class:`Ramp`; iterate it as a DataLoader."""

    def __init__(self, make: Callable[..., Any], source: Any, batch: Ramp, seq: Ramp | None, *,
                 state: Mapping[str, Any] | None, shard: tuple[int, int] | None, transform: Callable[[Any], Any],
                 kwargs: dict[str, Any]):
        self.batch, self.seq = batch, seq
        packed = getattr(source, "seq_len", None) is not None
        seqs = seq.distinct() if seq is not None else [int(source.seq_len)] if packed else [1]
        self.unit = _gcd(seqs)
        if seq is not None and getattr(source, "mode", "concat") != "concat":
            raise ValueError('a seq_len ramp needs zring.pack(..., mode="concat"): first-fit rows are padded bins, '
                             "which do not join into longer rows")
        # Every (batch, seq_len) pair the run meets: the ticks' rows divide each.
        pairs = {(self.batch(s), self._seq(s)) for s in self._change_steps()}
        self.tick = _gcd([b * q // self.unit for b, q in pairs])
        count = 1 if shard is None else int(shard[1])
        if self.tick % count:
            raise ValueError(f"shard=({shard[0]}, {count}): every step's rows split into ticks of {self.tick} rows "
                             f"of {self.unit} tokens, which {count} shards do not divide; use batch sizes and sequence "
                             f"lengths whose ticks are multiples of {count}")
        for b, q in pairs:
            if q % self.unit or b % count:
                raise ValueError(f"batch {b} of {q} tokens does not split over {count} shards")
        self.definition = {"batch_size": batch.definition(), "seq_len": None if seq is None else seq.definition(),
                           "unit": self.unit, "tick": self.tick}
        self.transform = transform
        self.packed = packed
        self.step = 0
        inner_state = None
        if state is not None:
            saved = state.get("curriculum") if isinstance(state, Mapping) else None
            if saved != self.definition:
                raise ValueError(f"the state was saved with the curriculum {saved}, this loader has {self.definition}: "
                                 f"resume with the same ramps")
            self.step = _util.integer(state.get("step"), "state['step']")
            inner_state = dict(state["inner"])
            sampler = dict(inner_state["sampler"])
            sampler["step"] = self.ticks_before(self.step)
            inner_state["sampler"] = sampler
        if seq is not None:
            source = source.with_seq_len(self.unit)
        self._inner = make(source, batch_size=self.tick, state=inner_state, shard=shard, **kwargs)
        self.last_step: int | None = None

    def _seq(self, step: int) -> int:
        return self.seq(step) if self.seq is not None else self.unit if self.packed else 1

    def _change_steps(self) -> list[int]:
        steps = {0} | {s for s, _ in self.batch.pieces}
        if self.seq is not None:
            steps |= {s for s, _ in self.seq.pieces}
        return sorted(steps)

    def ticks_at(self, step: int) -> int:
        """Ticks step ``step`` takes."""
        return self.batch(step) * self._seq(step) // self.unit // self.tick

    def ticks_before(self, step: int) -> int:
        """Ticks of the steps before ``step``: a sum over the ramps' pieces."""
        bounds = [s for s in self._change_steps() if s < step] + [step]
        total = 0
        for a, b in zip(bounds, bounds[1:]):
            total += (b - a) * self.ticks_at(a)
        return total

    def __iter__(self) -> "CurriculumLoader":
        return self

    def __next__(self) -> Any:
        t = self.step
        n, seq = self.ticks_at(t), self._seq(t)
        parts, indices, sources = [], [], []
        for _ in range(n):
            parts.append(self._inner.next())
            indices.append(self._inner.last_indices)
            if self._inner.last_sources is not None:
                sources.append(self._inner.last_sources)
        batch = _join(parts, seq // self.unit if self.packed else 1, indices, sources)
        self.last_indices = np.concatenate(indices) if indices else None
        self.last_sources = np.concatenate(sources) if sources else None
        self.last_step = t
        self.step = t + 1
        return self.transform(batch)

    def next(self) -> Any:
        """The next batch (same as ``next(loader)``)."""
        return self.__next__()

    def state(self) -> dict[str, Any]:
        """Resumes at the step after the last returned (module docs)."""
        return {"curriculum": self.definition, "step": self.step, "inner": self._inner.state()}

    def stats(self) -> dict[str, Any]:
        """The inner loader's :meth:`zring.DataLoader.stats` (its steps are ticks)."""
        return self._inner.stats()

    def close(self) -> None:
        inner = getattr(self, "_inner", None)
        if inner is not None:
            inner.close()


def _join(parts: list[Any], per_row: int, indices: list[np.ndarray], sources: list[np.ndarray]) -> Any:
    """Ticks' batches as one step's: rows laid end to end, ``per_row`` short
    rows to a row (packed columns), or concatenated (records)."""
    first = parts[0]
    if not isinstance(first, Mapping):
        raise TypeError("a curriculum joins batches that are dicts of arrays; give the transform to the "
                        "DataLoader (it is applied to the joined batch)")
    out: dict[str, Any] = {}
    for k in first:
        cols = [p[k] for p in parts]
        if isinstance(cols[0], tuple):  # a ragged stream: (values, row_splits)
            values = np.concatenate([c[0] for c in cols])
            splits, at = [np.zeros(1, np.int64)], 0
            for v, s in cols:
                splits.append(np.asarray(s[1:], np.int64) + at)
                at += len(v)
            out[k] = (values, np.concatenate(splits))
        else:
            out[k] = np.concatenate(cols)
    if per_row > 1:
        rows = out["tokens"].shape[0] // per_row
        seg = out.get("segment_ids")
        pos = out.get("positions")
        for k in list(out):
            out[k] = out[k].reshape(rows, -1)
        if seg is not None and pos is not None:
            out["segment_ids"] = _renumber(seg, pos, np.concatenate(indices),
                                           np.concatenate(sources) if sources else None, per_row)
    return out


def _renumber(seg: np.ndarray, pos: np.ndarray, rows: np.ndarray, sources: np.ndarray | None,
              per_row: int) -> np.ndarray:
    """Segment ids along rows of ``per_row`` short rows: a short row's
    segments follow the ones before it in its long row, and its first joins
    the last before it when it runs on (the next row of the same source's
    stream, the position one more)."""
    n, u = seg.shape
    seg = seg.astype(np.int64)
    out = np.zeros_like(seg)
    for r in range(0, n, per_row):
        base = 0
        for j in range(r, r + per_row):
            s = seg[j]
            runs_on = (j > r and rows[j] == rows[j - 1] + 1
                       and (sources is None or sources[j] == sources[j - 1])
                       and s[0] > 0 and pos[j, 0] == pos[j - 1, -1] + 1)
            shift = base - 1 if runs_on else base
            out[j] = np.where(s > 0, s + shift, 0)
            base = int(out[j].max()) if out[j].max() > 0 else base
    return out.reshape(n // per_row, per_row * u).astype(np.int32)
