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
        #: Without replacement, a window of blocks of consecutive indices
        #: at a time (reads large blocks; see ``block_records``).
        BLOCKED = 3

    def __init__(self, length: int, batch_size: int, mode: int, seed: int = 42, *,
                 block_records: int | None = None, window_blocks: int | None = None):
        """Mode 3 draws each batch from a window of ``window_blocks`` blocks
        of ``block_records`` consecutive indices (default 64 and 256); the
        other modes ignore them.

        Raises ValueError for length 0, batch_size 0, an unknown mode, a
        negative seed or a block shape with a 0."""
        for name, value in (("length", length), ("batch_size", batch_size), ("mode", mode), ("seed", seed),
                            ("block_records", block_records or 1), ("window_blocks", window_blocks or 1)):
            if int(value) < 0:
                raise ValueError(f"{name} must be non-negative, got {value}")
        self._inner = _zring.Sampler(int(length), int(batch_size), int(mode), int(seed),
                                     None if block_records is None else int(block_records),
                                     None if window_blocks is None else int(window_blocks))

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
