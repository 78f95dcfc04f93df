"""The index sampler, usable on its own (loaderx's ``Sampler``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import _zring


class Sampler:
    """Endless batches of record indices over ``[0, length)``.

    The batch of step ``k`` is a pure function of ``(mode, seed, length,
    batch_size, k)``, so :meth:`seek` resumes a run exactly. A store smaller
    than one batch yields batches of ``length`` indices.
    """

    class Mode:
        """Sampler modes (the numbers loaderx uses)."""

        #: In order, wrapping around the end.
        SEQUENTIAL = 0
        #: Uniform with replacement.
        IID = 1
        #: A fresh permutation per cycle (without replacement).
        CYCLIC = 2

    def __init__(self, length: int, batch_size: int, mode: int, seed: int = 42):
        """Raises ValueError for length 0, batch_size 0, an unknown mode or a negative seed."""
        for name, value in (("length", length), ("batch_size", batch_size), ("mode", mode), ("seed", seed)):
            if int(value) < 0:
                raise ValueError(f"{name} must be non-negative, got {value}")
        self._inner = _zring.Sampler(int(length), int(batch_size), int(mode), int(seed))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Sampler":
        """Rebuild a sampler from :meth:`state`."""
        self = cls.__new__(cls)
        self._inner = _zring.Sampler.from_state_json(json.dumps(state))
        return self

    def next(self) -> np.ndarray:
        """The current step's indices (uint64); moves to the next step."""
        return self._inner.next()

    def batch(self, step: int) -> np.ndarray:
        """The indices of any step, without moving."""
        return self._inner.batch(int(step))

    def seek(self, step: int) -> None:
        """Move to ``step`` (0-based)."""
        if int(step) < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        self._inner.seek(int(step))

    @property
    def step(self) -> int:
        """The step :meth:`next` returns next."""
        return self._inner.step

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable dict that :meth:`from_state` resumes from."""
        return self._inner.state()

    def __iter__(self) -> "Sampler":
        return self

    def __next__(self) -> np.ndarray:
        return self.next()
