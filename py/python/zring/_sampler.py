"""The index sampler, usable on its own (loaderx's ``Sampler``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import _util, _zring


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
        block shape with a 0, or an argument outside 0 to 2**64 - 1 (a
        negative seed, say); TypeError for one that is not an int (a float
        such as 1.5 is not truncated)."""
        length, batch_size, mode, seed = (_util.integer(v, name) for name, v in (
            ("length", length), ("batch_size", batch_size), ("mode", mode), ("seed", seed)))
        block_records, window_blocks = (None if v is None else _util.integer(v, name) for name, v in (
            ("block_records", block_records), ("window_blocks", window_blocks)))
        self._inner = _zring.Sampler(length, batch_size, mode, seed, block_records, window_blocks)

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
        return self._inner.batch(_util.integer(step, "step"))

    def seek(self, step: int) -> None:
        """Move to ``step`` (0-based): an int from 0 to 2**64 - 1."""
        self._inner.seek(_util.integer(step, "step"))

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
