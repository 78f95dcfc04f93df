"""JAX input pipelines over zring: device prefetch, multi-process global batches, checkpoints.

This module imports :mod:`jax`; ``import zring`` never does. Importing it
without jax installed raises an ImportError that names the missing package.

Overview
========

* :func:`device_prefetch` wraps a loader (any iterator of numpy pytrees, a
  :class:`zring.DataLoader` included) and keeps ``size`` batches already
  handed to :func:`jax.device_put` ahead of the consumer.
* :func:`global_loader` builds, in every process of a multi-process JAX
  run, global :class:`jax.Array` batches laid out by a
  :class:`jax.sharding.Sharding`; each process reads only the rows its own
  devices hold. It reads a dict of fixed-shape Datasets, a
  :func:`zring.mix` mixture of them, or a :func:`zring.pack` packed source
  (global ``tokens``, ``segment_ids`` and ``positions`` arrays). Over
  datasets of parts opened with ``rank_parts=(rank, ranks)``, each process
  is a rank reading its rows from its own parts only (``rank_parts``).
* :func:`process_rows` is the planning step on its own: which rows of the
  global batch a set of devices needs.
* Checkpoints: :meth:`DevicePrefetch.state` and :meth:`GlobalLoader.state`
  return one small JSON-able dict (see :func:`checkpoint_state`); it
  resumes exactly through :func:`restore_loader` (a plain
  :class:`zring.DataLoader`) or :func:`global_loader` (``state=``), on any
  process count whose shards divide the global batch (a rank's over its
  own parts: that rank's, with the same rank count). A fingerprint of the
  stores is checked on resume.

Why no background thread in :func:`device_prefetch`
===================================================

The expensive host work, reading and decoding records, already runs ahead
of the consumer in the zring loader's own Rust threads, without the GIL.
What is left on the consumer thread is wrapping the finished buffers and
calling :func:`jax.device_put`, which is asynchronous: it enqueues the copy
and returns at once, and the copy proceeds while the training step (itself
dispatched asynchronously) runs. Keeping ``size`` batches put ahead is
therefore enough to overlap the transfer with the step. A Python thread
would add GIL contention with the training loop, and it would make
exceptions and shutdown harder to reason about, for no gain. A loader
whose ``transform`` does heavy Python work is the case where a thread
would help; move that work into the jitted step or into the data instead.
"""

from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

try:
    import jax
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError(
        "zring.jax needs the 'jax' package, which is not installed; install it with "
        "`pip install \"jax[cpu]\"` (or the jax build for your accelerator)"
    ) from exc

from . import _util
from ._mix import Mixture
from ._sampler import Sampler
from .dataloader import DataLoader, rank_split, rank_state_problem
from .dataset import Dataset, RaggedDataset

__all__ = [
    "DevicePrefetch",
    "GlobalLoader",
    "RowPlan",
    "StateMismatchError",
    "checkpoint_state",
    "device_prefetch",
    "fingerprint",
    "global_loader",
    "process_rows",
    "restore_loader",
]

#: Version of the checkpoint dict written by :func:`checkpoint_state`.
STATE_FORMAT = 1

_MODE_NAMES = {m: Sampler(1, 1, m).state()["mode"] for m in (0, 1, 2)}
_MODE_NUMBERS = {name: m for m, name in _MODE_NAMES.items()}


class StateMismatchError(ValueError):
    """A saved loader state does not fit the streams or arguments it is resumed with."""


# --------------------------------------------------------------------------
# Checkpoint state
# --------------------------------------------------------------------------


def fingerprint(streams: Mapping[str, Dataset | RaggedDataset]) -> dict[str, Any]:
    """A short description of the stores that a resumed run must find unchanged.

    For each stream: its record count, and a SHA-256 over its schema (dtype
    and shape; the codec is left out) and the store's content checksum
    (:meth:`zring.Zrecord.fingerprint`: every record's stored checksum and
    length, in order), which the store keeps in its head, so this costs
    O(1) whatever the store's size. Compaction keeps the fingerprint;
    appending, deleting, rewriting with other data, and re-encoding records
    into other stored bytes (another codec) change it.
    """
    if isinstance(streams, Mixture):
        # Each source's streams, named "<source>/<stream>".
        return {f"{k}/{n}": v for k, s in enumerate(streams.sources) for n, v in fingerprint(s).items()}
    out: dict[str, Any] = {}
    for name in sorted(streams):
        ds = streams[name]
        store = ds._s
        schema = json.loads(store.schema() or "{}")
        schema.pop("codec", None)
        fp = ds.fingerprint()  # a zring.split part's mixes in the part's key
        blob = json.dumps({"schema": schema, "content": fp["content"]}, sort_keys=True)
        out[name] = {"records": int(fp["records"]), "sha256": hashlib.sha256(blob.encode()).hexdigest()[:16]}
    return out


def _is_packed(streams: Any) -> bool:
    """Whether ``streams`` is a :func:`zring.pack` packed source: not a
    stream dict nor a mixture, and rows of ``seq_len`` tokens."""
    return not isinstance(streams, (Mapping, Mixture)) and hasattr(streams, "seq_len")


#: The arrays of a packed source's batch.
PACKED_KEYS = ("tokens", "segment_ids", "positions")


def _packed_keys(streams: Any) -> tuple[str, ...]:
    return tuple(getattr(streams, "names", PACKED_KEYS))


def checkpoint_state(streams: Mapping[str, Dataset | RaggedDataset] | Mixture | Any,
                     sampler_state: Mapping[str, Any],
                     loader_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint dict for ``streams`` at the sampler state ``sampler_state``.

    ``sampler_state`` is a :meth:`zring.Sampler.state` dict (or the
    ``"sampler"`` part of a :meth:`zring.DataLoader.state`); its ``step`` is
    the next step to deliver. The result is JSON-able::

        {"format": 1, "mode": 2, "seed": 0, "step": 120,
         "global_batch_size": 64, "length": 20000,
         "fingerprint": {"x": {"records": 20000, "sha256": "..."}, ...}}

    A mixture's adds ``"mixture"``: its weights, source lengths and row
    order (``"Interleaved"`` for a new run; a run resumed from a state saved
    before rows were interleaved goes on ``"Grouped"``, as the
    ``loader_state`` it came from says). A packed source's adds
    ``"loader"``: the :meth:`zring.DataLoader.state` (``loader_state``,
    without its shard) at ``sampler_state``'s step, which the loader checks
    itself on resume, and its ``"fingerprint"`` is the loader's.

    It holds no shard and no process count: every process of a run saves
    the same dict, and it resumes on any shard count dividing the batch.

    A rank's loader (``rank_parts``, each rank reading only its own parts)
    is the exception: its checkpoint adds ``"rank_parts": {"rank",
    "ranks"}`` and, as a packed source's, ``"loader"``, the rank's own
    DataLoader state over its parts. Each rank saves its own and resumes
    from it, with the same rank count.
    """
    mode = sampler_state["mode"]
    extra: dict[str, Any] = {}
    ranked = loader_state is not None and loader_state.get("rank_parts") is not None
    if _is_packed(streams) or ranked:
        if loader_state is None:
            raise TypeError("a packed source's checkpoint needs the DataLoader's state (loader_state=)")
        saved = {k: v for k, v in loader_state.items() if k != "shard"}
        saved["sampler"] = dict(sampler_state)
        extra["loader"] = saved
        fp: Any = dict(loader_state.get("fingerprints", {}))
        if ranked:
            extra["rank_parts"] = dict(loader_state["rank_parts"])
    else:
        fp = fingerprint(streams)
    if isinstance(streams, Mixture):
        if loader_state is not None and isinstance(loader_state.get("mixture"), Mapping):
            # The loader's own: its order, and its schedule's pieces (a run
            # resumed under other weights lists each from its step).
            extra["mixture"] = dict(loader_state["mixture"])
            extra["mixture"].setdefault("order", "Grouped")
        else:
            extra["mixture"] = {"weights": [float(w) for w in streams.weights], "lengths": list(streams.lengths),
                                "order": "Interleaved"}
    if loader_state is not None and "consumed" in loader_state and "loader" not in extra:
        # For the reader: what each source gave up to the loader's step (not
        # read back; the packed state under "loader" has its own).
        extra["consumed"] = loader_state["consumed"]
    return {
        "format": STATE_FORMAT,
        "mode": _MODE_NUMBERS[mode] if isinstance(mode, str) else int(mode),
        "seed": int(sampler_state["seed"]),
        "step": int(sampler_state["step"]),
        "global_batch_size": int(sampler_state["batch_size"]),
        "length": int(sampler_state.get("length", 0)),
        "fingerprint": fp,
        **extra,
    }


_STATE_KEYS = ("format", "mode", "seed", "step", "global_batch_size", "length", "fingerprint")


def _check_state(state: Any, streams: Mapping[str, Dataset | RaggedDataset],
                 split: tuple[int, int] | None | str = "datasets") -> dict[str, Any]:
    """Validates a checkpoint dict against ``streams`` (of the rank split
    ``split``, by default the datasets'); returns it as a plain dict."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict from state(), got {type(state).__name__}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        hint = " (this looks like a zring.DataLoader.state(); pass it to DataLoader(state=...))" if "sampler" in state else ""
        raise StateMismatchError(f"not a zring.jax loader state: missing {missing}{hint}")
    if state["format"] != STATE_FORMAT:
        raise StateMismatchError(f"loader state format {state['format']!r} is not supported (expected {STATE_FORMAT})")
    if split == "datasets":
        split = rank_split(streams)
    problem = rank_state_problem(state, split)  # type: ignore[arg-type]
    if problem is not None:
        raise StateMismatchError(problem)
    if split is not None:
        # A rank's checkpoint carries its loader's state, which the loader checks.
        if not isinstance(state.get("loader"), Mapping):
            raise StateMismatchError("the checkpoint has no 'loader' state: it was not saved by a rank's loader")
        return dict(state)
    if _is_packed(streams):
        # The loader checks its own state (fingerprints, lengths) on resume.
        if not isinstance(state.get("loader"), Mapping):
            raise StateMismatchError("the checkpoint was not saved from a packed source (it has no 'loader' state)")
        return dict(state)
    if "loader" in state:
        raise StateMismatchError("the checkpoint was saved from a packed source; resume it over zring.pack(...)")
    have = fingerprint(streams)
    saved = dict(state["fingerprint"])
    if have != saved:
        diffs = []
        for name in sorted(set(have) | set(saved)):
            if name not in saved:
                diffs.append(f"stream {name!r} is not in the checkpoint")
            elif name not in have:
                diffs.append(f"stream {name!r} of the checkpoint is missing")
            elif have[name]["records"] != saved[name]["records"]:
                diffs.append(f"stream {name!r} has {have[name]['records']} records, the checkpoint saw {saved[name]['records']}")
            elif have[name] != saved[name]:
                diffs.append(f"stream {name!r} has another schema or other records than the checkpoint saw")
        raise StateMismatchError("the stores changed since the checkpoint: " + "; ".join(diffs))
    length = sum(streams.lengths) if isinstance(streams, Mixture) else len(next(iter(streams.values())))
    if int(state["length"]) != length:
        raise StateMismatchError(f"the checkpoint sampled {state['length']} records, the streams hold {length}")
    return dict(state)


def _sampler_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The zring sampler-state dict for a checkpoint dict."""
    s = Sampler(int(state["length"]), int(state["global_batch_size"]), int(state["mode"]), int(state["seed"])).state()
    s["step"] = int(state["step"])
    return s


def _loader_state(state: Mapping[str, Any], shard: tuple[int, int] | None) -> dict[str, Any]:
    """A :meth:`zring.DataLoader.state` dict that resumes the checkpoint ``state``."""
    index, count = shard if shard is not None else (0, 1)
    if "loader" in state:
        return {**state["loader"], "shard": {"index": int(index), "count": int(count)}}
    out = {"sampler": _sampler_state(state), "shard": {"index": int(index), "count": int(count)}}
    if "mixture" in state:
        out["mixture"] = state["mixture"]
    return out


def restore_loader(streams: Mapping[str, Dataset | RaggedDataset], state: Mapping[str, Any], *,
                   shard: tuple[int, int] | None = None, **loader_kwargs: Any) -> DataLoader:
    """A :class:`zring.DataLoader` that continues the checkpoint ``state`` exactly.

    ``state`` comes from :meth:`DevicePrefetch.state` or
    :meth:`GlobalLoader.state`. ``shard`` may differ from the saving run's
    (any count dividing the global batch). Other keyword arguments go to the
    DataLoader (``num_workers``, ``prefetch_size``, ``transform``). A rank's
    checkpoint (``rank_parts``) resumes over that rank's datasets, opened
    with the same ``rank_parts``.

    Raises:
        StateMismatchError: The streams' fingerprint or length differs from
            the checkpoint's, or ``state`` is not a checkpoint dict.
    """
    state = _check_state(state, streams)
    for key in ("batch_size", "mode", "seed", "state"):
        if key in loader_kwargs:
            raise TypeError(f"restore_loader takes {key} from the checkpoint; do not pass {key}=")
    return DataLoader(streams, state=_loader_state(state, shard), shard=shard, **loader_kwargs)


# --------------------------------------------------------------------------
# Device prefetch
# --------------------------------------------------------------------------


class DevicePrefetch:
    """Iterator returned by :func:`device_prefetch`.

    Yields what ``jax.device_put(batch, sharding)`` returns for each batch of
    the wrapped loader, ``size`` batches ahead. :meth:`state` accounts for
    the batches held ahead, so a checkpoint taken between steps resumes
    with the first batch the consumer has not seen.
    """

    def __init__(self, loader: Iterable[Any], size: int = 2, sharding: Any = None, *,
                 _put: Callable[[Any, Any], Any] = jax.device_put):
        if int(size) < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.loader = loader
        self.size = int(size)
        self.sharding = sharding
        self._it: Iterator[Any] = iter(loader)
        # (step or None, device batch) in delivery order.
        self._queue: collections.deque[tuple[int | None, Any]] = collections.deque()
        self.last_step: int | None = None
        self._put = _put

    def _fill(self) -> None:
        while len(self._queue) < self.size:
            try:
                batch = next(self._it)
            except StopIteration:
                return
            step = getattr(self.loader, "last_step", None)
            self._queue.append((step, self._put(batch, self.sharding)))

    def __iter__(self) -> "DevicePrefetch":
        return self

    def __next__(self) -> Any:
        self._fill()
        if not self._queue:
            raise StopIteration
        #: The step of the batch last returned (None if the loader has none).
        self.last_step, batch = self._queue.popleft()
        # Refill right away: these transfers overlap the step about to run.
        self._fill()
        return batch

    def state(self) -> dict[str, Any]:
        """Checkpoint dict (see :func:`checkpoint_state`) at the consumer's position.

        Needs a :class:`zring.DataLoader` underneath (it reads the loader's
        sampler state and rewinds it by the batches held ahead).
        """
        if not (hasattr(self.loader, "state") and hasattr(self.loader, "streams")):
            raise TypeError(f"state() needs a zring.DataLoader underneath, not a {type(self.loader).__name__}")
        full = self.loader.state()
        sampler = dict(full["sampler"])
        if self._queue and self._queue[0][0] is not None:
            sampler["step"] = int(self._queue[0][0])
            # The loader's own state at that step (its per-source counts).
            at = getattr(self.loader, "_state_at", None)
            if at is not None:
                full = at(sampler["step"])
        return checkpoint_state(self.loader.streams, sampler, full)

    def close(self) -> None:
        """Drop the batches held ahead and close the loader (if it has ``close``)."""
        self._queue.clear()
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "DevicePrefetch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def device_prefetch(loader: Iterable[Any], size: int = 2, sharding: Any = None) -> DevicePrefetch:
    """Keep ``size`` batches of ``loader`` already on the device(s) ahead of the consumer.

    Each batch (any pytree of numpy arrays, e.g. a zring batch dict) goes
    through ``jax.device_put(batch, sharding)``; ``sharding=None`` means the
    default device. The transfer is overlapped by JAX's asynchronous
    dispatch, not by a thread (the module docs say why). The iterator ends
    when ``loader`` does (a zring DataLoader never does).
    """
    return DevicePrefetch(loader, size, sharding)


# --------------------------------------------------------------------------
# Multi-process global batches
# --------------------------------------------------------------------------


class RowPlan:
    """Which rows of a global batch of ``global_batch_size`` one process reads.

    Attributes:
        blocks: The distinct ``(start, stop)`` row blocks its devices hold,
            sorted by start; ``make_array_from_process_local_data`` expects
            the process's local data to be these blocks stacked in order.
        ranges: ``blocks`` with touching blocks merged.
        shard: ``(index, count)`` when the rows are one contiguous range that
            is a zring shard of the global batch, else None.
        positions: The row positions, in local-data order (int64).
    """

    def __init__(self, blocks: Sequence[tuple[int, int]], global_batch_size: int):
        self.global_batch_size = int(global_batch_size)
        self.blocks = sorted(set((int(a), int(b)) for a, b in blocks))
        ranges: list[tuple[int, int]] = []
        for a, b in self.blocks:
            if ranges and a < ranges[-1][1]:
                raise ValueError(f"overlapping row blocks {ranges[-1]} and {(a, b)}: the sharding is not a tiling")
            if ranges and ranges[-1][1] == a:
                ranges[-1] = (ranges[-1][0], b)
            else:
                ranges.append((a, b))
        self.ranges = ranges
        self.shard: tuple[int, int] | None = None
        if len(ranges) == 1:
            a, b = ranges[0]
            n = b - a
            if n > 0 and self.global_batch_size % n == 0 and a % n == 0:
                self.shard = (a // n, self.global_batch_size // n)
        self.positions = (np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.blocks])
                          if self.blocks else np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.positions.size)

    def __repr__(self) -> str:
        return f"RowPlan(ranges={self.ranges}, shard={self.shard}, global_batch_size={self.global_batch_size})"


def process_rows(sharding: Any, global_shape: Sequence[int], devices: Iterable[Any] | None = None) -> RowPlan:
    """The rows of dimension 0 that ``devices`` hold of an array ``global_shape`` laid out by ``sharding``.

    ``devices`` defaults to ``sharding.addressable_devices`` (this process's).
    Passing another set plans for another process, or for a simulated one.
    """
    global_shape = tuple(int(d) for d in global_shape)
    if devices is None:
        index_map = sharding.addressable_devices_indices_map(global_shape)
    else:
        wanted = set(devices)
        index_map = {d: ix for d, ix in sharding.devices_indices_map(global_shape).items() if d in wanted}
    blocks = []
    for index in index_map.values():
        rows = index[0] if index else slice(None)
        start, stop, step = rows.indices(global_shape[0])
        if step != 1:
            raise ValueError(f"strided row slice {rows} is not supported")
        blocks.append((start, stop))
    return RowPlan(blocks, global_shape[0])


def _stream_shape(ds: Dataset | RaggedDataset) -> tuple[int, ...]:
    if isinstance(ds, RaggedDataset):
        raise TypeError(f"global_loader reads fixed-shape Dataset streams; {ds.path} is ragged: pack its "
                        f"documents into rows (zring.pack(ds, seq_len)) or pad it first")
    if not isinstance(ds, Dataset):
        raise TypeError(f"streams must be zring Dataset objects, got {type(ds).__name__}")
    return ds.shape


def _item_shapes(streams: Any) -> dict[str, tuple[int, ...]]:
    """Each batch array's shape after the batch axis."""
    if _is_packed(streams):
        return {k: (int(streams.seq_len),) for k in _packed_keys(streams)}
    if isinstance(streams, Mixture):
        return {n: _stream_shape(streams.sources[0][n]) for n in streams.names}
    if not isinstance(streams, Mapping):
        raise TypeError(f"global_loader reads a dict of zring Datasets, a zring.mix(...) mixture or a "
                        f"zring.pack(...) packed source; got a {type(streams).__name__}")
    return {n: _stream_shape(ds) for n, ds in streams.items()}


class GlobalLoader:
    """Iterator of global batches for one process of a (multi-process) JAX run.

    Yields ``{name: jax.Array}`` with shape ``(global_batch_size, *shape)``
    and the stream's sharding (a packed source's names are ``tokens``,
    ``segment_ids`` and ``positions``, each ``(global_batch_size,
    seq_len)``). Build it with :func:`global_loader`.

    Attributes:
        plans: ``{name: RowPlan}`` for this process.
        plan: The union of the streams' plans: the rows this process reads.
        loader: The underlying :class:`zring.DataLoader`.
        full_batch: True when the rows are not one zring shard, so every
            step reads the whole global batch and keeps ``plan.positions``.
    """

    def __init__(self, streams: Mapping[str, Dataset] | Mixture | Any, global_batch_size: int, sharding: Any, *,
                 mode: int | None = None, seed: int | None = None, state: Mapping[str, Any] | None = None,
                 process_index: int | None = None, process_count: int | None = None,
                 prefetch: int = 2, rank_parts: tuple[int, int] | None = None, **loader_kwargs: Any):
        packed = _is_packed(streams)
        item_shapes = _item_shapes(streams)
        self.streams = streams if packed or isinstance(streams, Mixture) else dict(streams)
        if not item_shapes:
            raise ValueError("need at least one stream")
        #: ``(rank, ranks)`` when this process is a rank reading only its own
        #: parts (``rank_parts=``, or the datasets'), else None.
        self.rank_parts = rank_split(self.streams, rank_parts)
        ranked = self.rank_parts is not None
        self.process_index = jax.process_index() if process_index is None else int(process_index)
        self.process_count = jax.process_count() if process_count is None else int(process_count)
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index {self.process_index} is not in [0, {self.process_count})")
        if self.process_index != jax.process_index() or self.process_count != jax.process_count():
            raise ValueError(
                f"process {self.process_index} of {self.process_count} given, but JAX runs as process "
                f"{jax.process_index()} of {jax.process_count()}; call jax.distributed.initialize first, "
                "or use process_rows() to plan for another process")
        for key in ("batch_size", "shard", "transform"):
            if key in loader_kwargs:
                raise TypeError(f"global_loader does not take {key}= (it sets the batch and shard itself, "
                                "and builds arrays from the raw stream batches)")
        if loader_kwargs.get("one_pass"):
            # A pass for evaluation (zring.DataLoader's one_pass): in order,
            # and every global batch of one shape.
            if loader_kwargs.get("last_batch", "partial") == "partial":
                raise ValueError("global_loader(one_pass=True) needs last_batch=\"pad\" or \"drop\": a global "
                                 "array has one shape, and a partial last batch would not")
            mode = 0 if mode is None else mode
        B = _util.integer(global_batch_size, "global_batch_size", 1)
        if isinstance(self.streams, Mapping):
            length = len(next(iter(self.streams.values())))
            if length < B and not ranked:
                raise ValueError(f"the streams hold {length} records, fewer than one global batch of {B}")
        elif isinstance(self.streams, Mixture):
            length = sum(self.streams.lengths)
        if state is not None:
            state = _check_state(state, self.streams, self.rank_parts)
            if int(state["global_batch_size"]) != B:
                raise StateMismatchError(
                    f"the checkpoint has global batch {state['global_batch_size']}, this run asks for {B}")
            for key, given in (("mode", mode), ("seed", seed)):
                if given is not None and _util.integer(given, key) != int(state[key]):
                    raise StateMismatchError(f"the checkpoint has {key}={state[key]}, this run asks for {key}={given}")
        elif not packed and not ranked:
            sampler = Sampler(length, B, 1 if mode is None else mode, 42 if seed is None else seed).state()
            state = checkpoint_state(self.streams, sampler)
        self.global_batch_size = B
        self.shardings = ({n: sharding[n] for n in item_shapes} if isinstance(sharding, Mapping)
                          else {n: sharding for n in item_shapes})
        self.global_shapes = {n: (B, *shape) for n, shape in item_shapes.items()}
        self.plans = {n: process_rows(self.shardings[n], self.global_shapes[n]) for n in item_shapes}
        if any(len(p) == 0 for p in self.plans.values()):
            raise ValueError(f"process {self.process_index} holds no device of the sharding; "
                             "only processes in the mesh take part in global_loader")
        # Streams sharded differently may need different rows; read the union of them.
        self.plan = RowPlan(_runs(np.unique(np.concatenate([p.positions for p in self.plans.values()]))), B)
        # Each step read ahead: its (indices, sources), until returned.
        self._rows: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = {}
        self._last: tuple[int | None, np.ndarray | None, np.ndarray | None] = (None, None, None)
        if ranked:
            self.full_batch = False
            self.loader = self._rank_loader(len(self.plan), mode, seed, state, loader_kwargs)
            self._take = {n: (None if np.array_equal(p.positions, self.plan.positions)
                              else np.searchsorted(self.plan.positions, p.positions)) for n, p in self.plans.items()}
            self._ahead = DevicePrefetch(_Steps(self), prefetch, _put=_keep)
            return
        self.full_batch = self.plan.shard is None
        shard = (0, 1) if self.full_batch else self.plan.shard
        # Where each stream's local rows sit in what the loader delivers.
        first = 0 if self.full_batch else self.plan.ranges[0][0]
        delivered = B if self.full_batch else len(self.plan)
        self._take = {n: (None if np.array_equal(p.positions, np.arange(first, first + delivered))
                          else p.positions - first) for n, p in self.plans.items()}
        if state is None:
            # A new packed run: the loader's own defaults for what is not given.
            self.loader = DataLoader(self.streams, batch_size=B, mode=1 if mode is None else mode,
                                     seed=42 if seed is None else seed, shard=shard, **loader_kwargs)
        else:
            self.loader = DataLoader(self.streams, state=_loader_state(state, shard), shard=shard, **loader_kwargs)
        self._ahead = DevicePrefetch(_Steps(self), prefetch, _put=_keep)

    def _rank_loader(self, rows: int, mode: int | None, seed: int | None, state: Mapping[str, Any] | None,
                     loader_kwargs: dict[str, Any]) -> DataLoader:
        """This rank's loader: each step, the ``rows`` rows its devices hold,
        drawn from its own parts (its datasets), with no shard."""
        if isinstance(self.streams, Mapping):
            length = len(next(iter(self.streams.values())))
            if length < rows:
                raise ValueError(f"rank {self.rank_parts[0]} of {self.rank_parts[1]} holds {length} records, fewer "
                                 f"than the {rows} rows its devices hold of each global batch")
        if state is None:
            return DataLoader(self.streams, batch_size=rows, mode=1 if mode is None else mode,
                              seed=42 if seed is None else seed, rank_parts=self.rank_parts, **loader_kwargs)
        saved = int(state["loader"]["sampler"]["batch_size"])
        if saved != rows:
            raise StateMismatchError(f"the checkpoint's rank read {saved} rows of each global batch, this process's "
                                     f"devices hold {rows}: resume with the sharding it was saved with")
        return DataLoader(self.streams, state=_loader_state(state, None), rank_parts=self.rank_parts,
                          **loader_kwargs)

    def _build(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out = {}
        for name, data in batch.items():
            take = self._take[name]
            local = data if take is None else data[take]
            out[name] = jax.make_array_from_process_local_data(self.shardings[name], local, self.global_shapes[name])
        return out

    def __iter__(self) -> "GlobalLoader":
        return self

    def __next__(self) -> dict[str, Any]:
        batch = next(self._ahead)
        # The loader has read ahead (prefetch): take the rows of the step
        # just returned, not of the last one read.
        step = self._ahead.last_step
        rows = self._rows.pop(step, (None, None))
        for old in [s for s in self._rows if s < step]:
            del self._rows[old]
        self._last = (step, *rows)
        return batch

    @property
    def last_step(self) -> int | None:
        """The step of the global batch last returned; None before the first."""
        return self._last[0]

    @property
    def last_indices(self) -> np.ndarray | None:
        """Record indices of this process's rows of the batch last returned
        (the underlying loader's rows of that step); None before the first."""
        return self._last[1]

    @property
    def last_sources(self) -> np.ndarray | None:
        """A mixture's source of each of this process's rows of the batch
        last returned (as :attr:`last_indices`), else None."""
        return self._last[2]

    def state(self) -> dict[str, Any]:
        """Checkpoint dict at the consumer's position; the same in every
        process, except for ranks reading their own parts (``rank_parts``):
        then each process's own, to resume that rank from."""
        state = self._ahead.state()
        if self.rank_parts is not None:
            state["global_batch_size"] = self.global_batch_size
        return state

    def close(self) -> None:
        """Drop prefetched batches and stop the gather threads."""
        self._ahead._queue.clear()
        self.loader.close()

    def __enter__(self) -> "GlobalLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Steps:
    """Adapter turning the process-local loader into an iterator of global arrays.

    It exposes ``last_step``/``state``/``streams`` like a DataLoader so that
    :class:`DevicePrefetch` can hold global arrays ahead and still report an
    exact checkpoint.
    """

    def __init__(self, owner: GlobalLoader):
        self.owner = owner
        self.streams = owner.streams

    @property
    def last_step(self) -> int | None:
        return self.owner.loader.last_step

    def __iter__(self) -> "_Steps":
        return self

    def __next__(self) -> dict[str, Any]:
        loader = self.owner.loader
        batch = self.owner._build(next(loader))
        self.owner._rows[loader.last_step] = (loader.last_indices, getattr(loader, "last_sources", None))
        return batch

    def state(self) -> dict[str, Any]:
        return self.owner.loader.state()

    def _state_at(self, step: int) -> dict[str, Any]:
        return self.owner.loader._state_at(step)


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted unique positions as maximal ``(start, stop)`` runs."""
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [positions.size]])
    return [(int(positions[a]), int(positions[b - 1]) + 1) for a, b in zip(starts, stops)]


def _keep(batch: Any, sharding: Any) -> Any:
    """The put function for batches that are global arrays already."""
    return batch


def global_loader(streams: Mapping[str, Dataset] | Mixture | Any, global_batch_size: int, sharding: Any, *,
                  mode: int | None = None, seed: int | None = None, state: Mapping[str, Any] | None = None,
                  process_index: int | None = None, process_count: int | None = None,
                  prefetch: int = 2, rank_parts: tuple[int, int] | None = None,
                  **loader_kwargs: Any) -> GlobalLoader:
    """Global ``jax.Array`` batches for this process of a multi-process run.

    Every process calls this with the same arguments. For each stream the
    global array has shape ``(global_batch_size, *stream.shape)`` and is laid
    out by ``sharding`` (one :class:`jax.sharding.Sharding` for all streams,
    or a dict by stream name); a sharding with the batch axis over a mesh
    axis, e.g. ``NamedSharding(mesh, PartitionSpec("data"))``, is the usual
    choice. The batch of step ``k`` holds the records
    ``zring.Sampler(len, global_batch_size, mode, seed).batch(k)`` in order,
    whatever the number of processes.

    ``streams`` may also be a :func:`zring.mix` mixture: the global batch is
    the one ``zring.DataLoader(mixture, batch_size=global_batch_size)``
    delivers, whose rows are interleaved so that every process's rows hold
    each source's share (within a row, for process counts that are powers
    of two dividing the batch; see :func:`zring.mix`); or a
    :func:`zring.pack` packed source: the global arrays are its
    ``tokens``, ``segment_ids`` and ``positions``, each
    ``(global_batch_size, seq_len)``, and the checkpoint carries the
    packed loader's own state.

    How rows are read: :func:`process_rows` lists the row blocks this
    process's devices hold (``sharding.addressable_devices_indices_map``).
    When they form one contiguous range that is a shard of the global batch
    (the usual case: the batch axis sharded over processes in order), the
    loader reads just that shard (``DataLoader(shard=...)``). Otherwise each
    process reads the whole global batch and keeps its rows: that costs
    ``global_batch_size`` reads and decodes per step in every process
    instead of its share, plus one copy of the kept rows. Rows replicated
    over several processes are read by each of them (identically).

    Ranks reading their own parts: over datasets of parts
    (:mod:`zring.parts`) opened with ``rank_parts=(rank, ranks)``, each
    holding only rank ``rank``'s parts (:func:`zring.parts.rank_plan`),
    every process is that rank's loader (usually ``rank, ranks =
    jax.process_index(), jax.process_count()``): the rows its devices hold
    of each step are the next rows of its own sampler over its own records
    (in ``mode``, a mixture holding each source's share of them, a packed
    source packing its own documents), read with no shard, so a host needs
    only its own parts. Over each rank's cycle its rows cover its records
    once, so the ranks' rows together cover every record once; the global
    batch is no longer ``Sampler(...).batch(k)`` of the whole dataset.
    Processes that hold the same rows (replicas) must be the same rank.
    Each process's checkpoint is its own (:meth:`GlobalLoader.state`);
    it resumes that rank, with the same rank count and sharding, and
    another rank count is refused (:class:`StateMismatchError`).

    Args:
        streams: Fixed-shape zring Datasets of one length, a mixture of
            such dicts, or a packed source.
        global_batch_size: Rows per step across all processes.
        sharding: A Sharding, or ``{name: Sharding}``.
        mode, seed: Sampler mode and seed (defaults 1 and 42, or the
            checkpoint's; if given with ``state`` they must match it).
        state: A checkpoint from :meth:`GlobalLoader.state` or
            :meth:`DevicePrefetch.state`, saved with any process count.
        process_index, process_count: Default to ``jax.process_index()`` and
            ``jax.process_count()``; given, they must match them (a guard
            against launching with a wrong rank).
        prefetch: Global batches built ahead of the consumer.
        rank_parts: ``(rank, ranks)``: this process is rank ``rank`` of
            ``ranks``, each reading only its own parts of datasets of parts
            (see "Ranks reading their own parts" above). Default: taken
            from the datasets, which must be opened with it.
        loader_kwargs: ``num_workers``, ``prefetch_size`` for the
            DataLoader; ``one_pass=True`` with ``last_batch="pad"`` (or
            ``"drop"``) for a finite pass in order (mode 0) over a
            :func:`zring.split` part, say: it stops after the pass, and the
            real rows of its last batch are the first ``len(part) - step *
            global_batch_size`` (a packed pass marks the rest as padding).

    Raises:
        StateMismatchError: ``state`` does not fit the streams or arguments
            (saved with another rank count or by another rank, included).
        ValueError: Bad sizes, a sharding whose blocks overlap, or
            ``rank_parts`` the datasets were not opened with.
    """
    return GlobalLoader(streams, global_batch_size, sharding, mode=mode, seed=seed, state=state,
                        process_index=process_index, process_count=process_count, prefetch=prefetch,
                        rank_parts=rank_parts, **loader_kwargs)
