"""Mixture schedules (:func:`zring.schedule`): weights as a function of the step.

A schedule is a list of points ``(step, weights)``, the first at step 0.
With ``interpolate="linear"`` the weights move linearly from one point to
the next; with ``interpolate="step"`` each point's weights hold until the
next point (piecewise constant). After the last point its weights hold for
good. Each point's weights are normalised to sum to 1; a weight may be 0 at
some points (a source that joins later, or leaves), as long as every source
has a positive weight at one point at least.

What a step holds: the weights are a function ``w_s(x)`` of a real step
``x``, step ``t`` covering ``[t, t + 1)``. Source ``s``'s *target* after
``t`` steps of ``B`` rows is ``B`` times the integral of ``w_s`` from 0 to
``t`` (on a linear stretch a step's own share is the weights at its middle,
``t + 1/2``; on a stair, the stair's weights). The rows so far are the
targets rounded as fixed weights' ``w_s * rows`` are (:mod:`zring._mix`):

* when every source has a row per batch or more at every point
  (``w_s * B >= 1``), by largest remainders, so each source's rows so far are
  its target rounded down or up (within one row of it), at every step;
* otherwise by the same rounding tree as fixed small weights, whose every
  split gives its first part the nearest integer to that part's target at
  the step where the node's own target reaches the rows the node holds
  (for fixed weights, exactly the old rule). Rows so far then stay within a
  row of their targets in the cases tested (``py/tests/test_schedule.py``,
  the sampler's tests), as for fixed weights.

Every step is still a pure function of its number and the schedule: seeking
and resuming are exact, and each rank's rows hold each source's share as for
fixed weights.

Changing the weights of a run: resume a state with a mixture of other
weights or another schedule (the same sources: a source of another length,
which means the data changed, is still refused with ``MixtureMismatch``,
a ValueError). The resumed run keeps the saved weights up to the saved step
``t0`` and follows the new ones from ``t0`` on, on the new schedule's own
step axis (a new point at step 1,000 means the run's step 1,000). Its
targets are the saved run's up to ``t0`` and grow by the integral of the new
weights from there, so every step before ``t0`` is the saved run's bit for
bit and, where every source has a row per batch at every point of
both schedules, each
source's stream goes on exactly where the saved run left it. (With a
source of under a row per batch, the rounding tree may round the same
targets at ``t0`` to a row more or less for a source, both within a row of
its target: its stream then skips or repeats a record at the change.) The state then lists the pieces in force, each
``{"from": step, "points": [...]}``, so the run can be resumed again, and
again changed.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

from . import _util

_KINDS = ("linear", "step")


class Schedule:
    """Mixture weights over the steps; pass it to :func:`zring.mix` in place
    of the weights. Made by :func:`zring.schedule`."""

    def __init__(self, points: Mapping[int, Sequence[float]] | Sequence[tuple[int, Sequence[float]]],
                 interpolate: str = "linear"):
        if interpolate not in _KINDS:
            raise ValueError(f'interpolate must be "linear" or "step", got {interpolate!r}')
        items = sorted(points.items()) if isinstance(points, Mapping) else list(points)
        if not items:
            raise ValueError("a schedule needs at least one point (step, weights)")
        given: list[tuple[int, list[float]]] = []
        for i, item in enumerate(items):
            try:
                step, weights = item
            except (TypeError, ValueError):
                raise ValueError(f"point {i} must be (step, weights), got {item!r}") from None
            step = _util.integer(step, f"schedule point {i}'s step")
            weights = _util.weights(weights, f"schedule point {i}'s weights (step {step})")
            if i == 0 and step != 0:
                raise ValueError(f"the first point is at step {step}; a schedule starts at step 0")
            if i > 0 and step <= given[-1][0]:
                raise ValueError(f"point {i} is at step {step}, not after point {i - 1}'s step {given[-1][0]}")
            if len(weights) != len(given[0][1] if given else weights):
                raise ValueError(f"point {i} (step {step}) has {len(weights)} weights, point 0 has {len(given[0][1])}")
            if sum(weights) <= 0:
                raise ValueError(f"point {i} (step {step}): weights must be finite, >= 0 and not all 0, got {weights}")
            given.append((step, weights))
        never = [k for k in range(len(given[0][1])) if all(w[k] == 0 for _, w in given)]
        if never:
            raise ValueError(f"source {never[0]} has weight 0 at every point, so it would never get a row")
        #: The points as given.
        self.points = given
        #: ``"linear"`` or ``"step"``.
        self.interpolate = interpolate
        #: The corners the loader reads (the points), each stair of a
        #: ``"step"`` schedule written as its start and its end at the next
        #: point's step (a jump: two points at one step).
        self.corners: list[tuple[int, list[float]]] = []
        for i, (step, weights) in enumerate(given):
            if interpolate == "step" and i > 0:
                self.corners.append((step, given[i - 1][1]))
            self.corners.append((step, weights))

    @property
    def sources(self) -> int:
        """The number of sources (weights per point)."""
        return len(self.points[0][1])

    def mean_weights(self) -> list[float]:
        """The mean of the corners' normalised weights: positive for every
        source, and what shapes the rounding tree (as the loader computes)."""
        w = np.mean([np.asarray(x) / np.sum(x) for _, x in self.corners], axis=0)
        return [float(x) for x in w / w.sum()]

    def weights_at(self, step: float) -> np.ndarray:
        """The normalised weights at (real) step ``step``; after a jump
        there, the later ones."""
        return _curve(self.corners).value(float(step))

    def targets(self, steps: float, batch_size: int) -> np.ndarray:
        """Each source's target after ``steps`` steps of ``batch_size``
        rows: ``batch_size`` times the integral of its weight (module docs).
        Computed here in NumPy, apart from the loader, for checking it."""
        return batch_size * _curve(self.corners).integral(float(steps))

    def __repr__(self) -> str:
        return f"zring.schedule({self.points!r}, interpolate={self.interpolate!r})"


class _Curve:
    """Normalised weights, linear between corners, and their integrals."""

    def __init__(self, corners: Sequence[tuple[int, Sequence[float]]]):
        self.xs = np.array([float(s) for s, _ in corners])
        self.vs = np.array([np.asarray(w, dtype=np.float64) / np.sum(w) for _, w in corners])

    def value(self, x: float) -> np.ndarray:
        i = max(int(np.searchsorted(self.xs, x, side="right")) - 1, 0)
        if i + 1 < len(self.xs) and x < self.xs[i + 1]:
            f = (x - self.xs[i]) / (self.xs[i + 1] - self.xs[i])
            return self.vs[i] + (self.vs[i + 1] - self.vs[i]) * f
        return self.vs[i].copy()

    def integral(self, x: float) -> np.ndarray:
        total = np.zeros(self.vs.shape[1])
        n = len(self.xs)
        for i in range(n):
            lo = self.xs[i]
            if x <= lo:
                break
            if i + 1 == n:
                total += (x - lo) * self.vs[i]
            elif self.xs[i + 1] > lo:
                hi = self.xs[i + 1]
                end = min(x, hi)
                at_end = self.vs[i] + (self.vs[i + 1] - self.vs[i]) * ((end - lo) / (hi - lo))
                total += (end - lo) * (self.vs[i] + at_end) / 2
        return total


def _curve(corners: Sequence[tuple[int, Sequence[float]]]) -> _Curve:
    return _Curve(corners)


def pieces_targets(pieces: Sequence[Mapping[str, Any]], steps: float, batch_size: int) -> np.ndarray:
    """Each source's target after ``steps`` steps under a saved state's
    ``"schedule"`` pieces: each piece's integral from its ``"from"`` step
    to the next piece's (module docs). NumPy, apart from the loader."""
    total = None
    for j, piece in enumerate(pieces):
        start = float(piece["from"])
        end = float(pieces[j + 1]["from"]) if j + 1 < len(pieces) else math.inf
        if steps <= start and j > 0:
            break
        c = _Curve([(p["step"], p["weights"]) for p in piece["points"]])
        part = c.integral(min(float(steps), end)) - c.integral(start)
        total = part if total is None else total + part
    return batch_size * total


def allocation(pieces: Sequence[Mapping[str, Any]], batch_size: int, rows: int) -> np.ndarray:
    """Each source's rows among the first ``rows`` under a saved state's
    ``"schedule"`` pieces (``state["mixture"]["schedule"]``) at
    ``batch_size`` rows a step: what the loader delivers, computed without
    one (the same Rust function)."""
    from . import _zring

    n = len(pieces[0]["points"][0]["weights"])
    got = _zring.mixture_allocation([1.0] * n, int(batch_size), int(rows), pieces=json.dumps(list(pieces)))
    return np.asarray(got, dtype=np.int64)


def schedule(points: Mapping[int, Sequence[float]] | Sequence[tuple[int, Sequence[float]]], *,
             interpolate: str = "linear") -> Schedule:
    """Mixture weights as a function of the step, for :func:`zring.mix`.

    ``points`` are ``(step, weights)`` pairs (or a dict ``{step: weights}``),
    the first at step 0, steps increasing, one weight per source. With
    ``interpolate="linear"`` the weights move linearly between points; with
    ``"step"`` each point's hold until the next. After the last point its
    weights hold. Weights are normalised at each point; a weight may be 0
    where at least one other is not, and every source needs a positive
    weight somewhere. Example, 0.7/0.3 to 0.3/0.7 over 1,000 steps::

        zring.mix([web, code], zring.schedule([(0, [0.7, 0.3]), (1000, [0.3, 0.7])]))

    A step's rows follow the integral of the weights over it, each source's
    rows so far within a row of its target; resuming a state under another
    schedule follows the new one from the saved step on (module docs).

    Raises:
        ValueError: No points, a first point after step 0, steps not
            increasing or past 2**64 - 1, points of different lengths, a
            weight negative or not finite, a point of only zeros or whose
            weights sum past the largest float, a source of weight 0 at
            every point, or ``interpolate`` not ``"linear"`` or ``"step"``.
        TypeError: A step that is not an int (1.5 is not truncated), or
            weights that are not a sequence of numbers (a string such as
            ``"11"``).
    """
    return Schedule(points, interpolate)
