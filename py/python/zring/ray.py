"""Write a Ray Data dataset as a dataset of parts: ``zring.ray.write(ds, path)``.

Needs Ray Data (``pip install 'zring[ray]'``); the rest of zring does not.
Each Ray write task writes the rows it is given as one part per column with
:func:`zring.parts.write_part` (into the dataset's ``staging/``) and
returns the parts' :class:`~zring.parts.PartInfo`; once every task has
finished, the driver commits exactly the parts it got back, in the order of
the tasks, with one manifest replace per column (:func:`zring.parts.commit`),
which removes everything else staged: the parts of attempts that failed
after writing, or that Ray retried. A job that fails commits nothing and
removes what it staged::

    import ray, zring, zring.ray

    ds = ray.data.read_parquet("tokenized/")          # a column "tokens" of lists of ints
    zring.ray.write(ds, "corpus", column="tokens")    # a dataset of parts at corpus/
    docs = zring.RaggedDataset("corpus")

    zring.ray.write(more, "corpus", column="tokens", mode="append")

Columns become stores as :func:`zring.write_ragged` and
:func:`zring.write_dataset` write them: a list (or large list) of numbers,
a Ray variable-shaped tensor column (NumPy arrays of differing lengths) and
strings or binary (their bytes, uint8) are ragged, one record per row (open
with :class:`zring.RaggedDataset`); numbers, fixed-size lists and Ray tensor
columns of one shape are fixed records of that shape (:class:`zring.Dataset`).

Ray's sink interface (``ray.data.Datasink``) is a developer API that has
changed between minor releases (the arguments of ``on_write_complete`` in
2.39, of ``on_write_start`` later). :class:`ZringDatasink` takes either
form, and the driver checks the records it commits against the rows Ray
reports it gave the write tasks: a mismatch (a sink interface changed under
it) raises and commits nothing, rather than writing a dataset short of rows.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import parts as _parts

try:
    import pyarrow as _pa
    from ray.data import Datasink as _Datasink
    from ray.data.block import BlockAccessor as _BlockAccessor
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"zring.ray needs Ray Data: pip install 'zring[ray]' (or 'ray[data]') ({_e})"
    ) from None

__all__ = ["MODES", "ZringDatasink", "write"]

#: What :func:`write` does with a dataset already at its path: ``"error"``
#: refuses it, ``"append"`` adds the new parts after its parts,
#: ``"overwrite"`` replaces its parts.
MODES = ("error", "append", "overwrite")


@dataclasses.dataclass(frozen=True)
class _TaskResult:
    """What one write task returns to the driver (plain data, picklable)."""

    task: int
    rows: int
    parts: dict[str, _parts.PartInfo]


def _chunks(tables: Sequence[Any], column: str) -> Iterator[Any]:
    for t in tables:
        for chunk in t.column(column).chunks:
            if chunk.null_count or (hasattr(chunk, "values") and not isinstance(chunk.type, _pa.ExtensionType)
                                    and chunk.values.null_count):
                raise ValueError(f"column {column!r} holds nulls, which a zring store cannot hold; fill or drop "
                                 f"them first (Dataset.map_batches)")
            if len(chunk):
                yield chunk


def _list_rows(chunk: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets into them) of a list chunk."""
    return chunk.values.to_numpy(zero_copy_only=False), chunk.offsets.to_numpy()


def _bytes_rows(chunk: Any) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets into them) of a string or binary chunk."""
    large = _pa.types.is_large_string(chunk.type) or _pa.types.is_large_binary(chunk.type)
    bufs = chunk.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offsets


def _fixed_rows(chunk: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A numeric or fixed-size-list chunk as an array ``(rows, *shape)``."""
    flat = chunk
    while _pa.types.is_fixed_size_list(flat.type):
        flat = flat.flatten()
    return flat.to_numpy(zero_copy_only=False).reshape((len(chunk), *shape))


def _plan(t: Any) -> tuple[str, np.dtype | None, tuple[int, ...]]:
    """How a column of Arrow type ``t`` is written: ``("list"|"bytes"|"fixed",
    dtype, item shape)`` appended a chunk at a time, as ``zring convert``
    stores the type, or ``("numpy", None, ())``: Ray's own conversion (its
    tensor columns, which convert does not store)."""
    from ._convert import _plan_column

    try:
        kind, dtype, shape = _plan_column(_pa, "", t)
    except ValueError:
        return "numpy", None, ()
    if kind in ("scalar", "fixed_list"):
        return "fixed", dtype, tuple(shape)
    return kind, dtype, ()


def _write_column(root: Path, tables: Sequence[Any], column: str, codec: str, job: str) -> _parts.PartInfo:
    """The rows of ``column`` in ``tables`` as one staged part of the dataset
    at ``root``. Arrow lists, strings and fixed-width columns are appended a
    chunk at a time (values and offsets as they are, no array per row);
    Ray's tensor columns go through :func:`zring.parts.write_part`."""
    from ._convert import _Sink

    kind, dtype, shape = _plan(tables[0].schema.field(column).type)
    if kind == "numpy":
        # Ray's own conversion: an array of one shape, or an object array of
        # arrays of several.
        arrays = [np.asarray(_BlockAccessor.for_block(tb).to_numpy(column)) for tb in tables]
        if all(a.dtype != object for a in arrays):
            return _parts.write_part(root, np.concatenate(arrays), codec=codec, _job=job)

        def rows() -> Iterator[np.ndarray]:
            for a in arrays:
                for row in a:
                    row = np.asarray(row)
                    if row.dtype == object:
                        raise ValueError(f"column {column!r} holds rows that are not numeric arrays")
                    yield row
        return _parts.write_part(root, rows(), ragged=True, codec=codec, _job=job)
    for t in tables[1:]:
        other = _plan(t.schema.field(column).type)
        if other != (kind, dtype, shape):
            raise ValueError(f"column {column!r} is {t.schema.field(column).type} in one block and "
                             f"{tables[0].schema.field(column).type} in another")
    staging = root / _parts.STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    # Built under staging/, named by the job (which removes what its failed
    # attempts leave), then renamed to its id.
    build = staging / f".building-{job}-{uuid.uuid4().hex}"
    ok = False
    with _parts._writing(staging):
        sink = _Sink(build, dtype, None if kind != "fixed" else shape, codec)
        try:
            for chunk in _chunks(tables, column):
                if kind == "fixed":
                    sink.fixed(_fixed_rows(chunk, shape))
                else:
                    sink.ragged(*(_list_rows(chunk) if kind == "list" else _bytes_rows(chunk)))
            ok = True
        finally:
            sink.close(failed=not ok)
            if not ok:
                shutil.rmtree(build, ignore_errors=True)
        return _parts._stage(root, build, job)[0]


class ZringDatasink(_Datasink):
    """A Ray Data sink writing a dataset of parts at ``path``
    (``ds.write_datasink(ZringDatasink(path, ...))``; :func:`write` is the
    short form and documents the arguments). After the write,
    :attr:`rows` is the number of rows committed and :attr:`generation`
    the manifest generation of each column's dataset."""

    def __init__(self, path: str | os.PathLike[str], *, column: str | Sequence[str] | None = None,
                 mode: str = "error", codec: str = "zstd"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
        if codec not in ("zstd", "raw"):
            raise ValueError(f"codec must be 'zstd' or 'raw', got {codec!r}")
        self.path = str(path)
        self.column = column
        self.mode = mode
        self.codec = codec
        # Names the parts this write's tasks stage, so that the driver removes
        # its own failed attempts' leftovers and never another writer's.
        self._job = uuid.uuid4().hex[:12]
        #: Rows committed by the write (set when it completes).
        self.rows: int | None = None
        #: ``{column: manifest generation}`` after the write.
        self.generation: dict[str, int] = {}
        self._check_target(self._named_columns() or [])

    # -- where each column goes ---------------------------------------------

    def _named_columns(self) -> list[str] | None:
        if self.column is None:
            return None
        return [self.column] if isinstance(self.column, str) else list(self.column)

    def _root(self, column: str) -> Path:
        """The dataset of parts of ``column``: ``path`` itself when one column
        was named, else ``path/<column>.zr``."""
        if isinstance(self.column, str):
            return Path(self.path)
        return Path(self.path) / f"{column}.zr"

    def _check_target(self, columns: Sequence[str]) -> None:
        """``mode="error"``: refuse a path holding a dataset already;
        ``"append"`` to columns: every column's dataset there, or none."""
        roots = [Path(self.path)] if isinstance(self.column, str) else [self._root(c) for c in columns]
        if not isinstance(self.column, str) and os.path.isdir(self.path):
            roots += [p for p in Path(self.path).glob("*.zr") if p not in roots]
        existing = [r for r in roots if (r / _parts.MANIFEST).is_file()]
        if self.mode == "error" and existing:
            raise FileExistsError(f"{existing[0]} holds a dataset of parts already; pass mode='append' to add "
                                  f"to it or mode='overwrite' to replace it")
        if self.mode == "append" and existing and not isinstance(self.column, str) and columns:
            want = {self._root(c) for c in columns}
            if set(existing) != want:
                raise ValueError(f"appending columns {sorted(columns)} to {self.path}, which holds the datasets "
                                 f"{sorted(str(p) for p in existing)}: append every column it holds, no other")

    # -- the Datasink interface ---------------------------------------------

    def on_write_start(self, schema: Any = None, *args: Any, **kwargs: Any) -> None:
        """Checks the target again with the columns of ``schema`` (what the
        tasks will write). Ray before 2.4x passes no schema."""
        names = self._named_columns()
        if names is None and schema is not None:
            names = list(getattr(schema, "names", []) or [])
        self._check_target(names or [])

    def write(self, blocks: Iterable[Any], ctx: Any) -> _TaskResult:
        """One write task: the rows of ``blocks`` as one staged part per column."""
        tables = [_BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        task = int(getattr(ctx, "task_idx", 0))
        rows = sum(t.num_rows for t in tables)
        if not rows:
            return _TaskResult(task, 0, {})
        names = self._named_columns() or list(tables[0].schema.names)
        missing = [c for c in names if c not in tables[0].schema.names]
        if missing:
            raise ValueError(f"the dataset has no column(s) {missing}; it has {tables[0].schema.names}")
        written = {c: _write_column(self._root(c), tables, c, self.codec, self._job) for c in names}
        return _TaskResult(task, rows, written)

    def on_write_complete(self, write_result: Any, *args: Any, **kwargs: Any) -> None:
        """Commits the parts the tasks returned, in task order, one manifest
        replace per column. Takes Ray's ``WriteResult`` (2.39 and later) or
        the list of the tasks' returns (before)."""
        returns = getattr(write_result, "write_returns", write_result)
        results = [r for r in returns if r is not None]
        if any(not isinstance(r, _TaskResult) for r in results):
            kinds = sorted({type(r).__name__ for r in results})
            raise RuntimeError(f"Ray handed the sink's commit {kinds} rather than the write tasks' results: this "
                               f"Ray's Datasink interface is not one zring.ray knows; nothing was committed")
        results.sort(key=lambda r: r.task)
        tasks = [r.task for r in results]
        if len(set(tasks)) != len(tasks):
            raise RuntimeError(f"two results of one write task among {tasks}; nothing was committed")
        rows = sum(r.rows for r in results)
        reported = getattr(write_result, "num_rows", None)
        if reported is not None and int(reported) != rows:
            raise RuntimeError(f"Ray gave the write tasks {int(reported)} rows but their parts hold {rows}: this "
                               f"Ray's Datasink interface is not one zring.ray knows; nothing was committed")
        results = [r for r in results if r.rows]
        columns = list(results[0].parts) if results else (self._named_columns() or [])
        for r in results:
            if list(r.parts) != columns:
                raise RuntimeError(f"write task {r.task} wrote columns {list(r.parts)}, task {results[0].task} "
                                   f"{columns}; nothing was committed")
        mode = "overwrite" if self.mode == "overwrite" else "append"
        self._check_target(columns)
        for c in columns:
            infos = [r.parts[c] for r in results]
            root = self._root(c)
            if infos or mode == "overwrite" or (root / _parts.MANIFEST).is_file():
                self.generation[c] = _parts.commit(root, infos, mode=mode)
            _parts._remove_job_leftovers(root, self._job)
        self.rows = rows

    def on_write_failed(self, error: Exception, *args: Any, **kwargs: Any) -> None:
        """Removes the parts staged by the failed job's tasks (no manifest
        names them; the dataset is as it was)."""
        roots = {Path(self.path)} if isinstance(self.column, str) else set(Path(self.path).glob("*.zr"))
        for root in roots:
            _parts._remove_job_leftovers(root, self._job)


def write(ds: Any, path: str | os.PathLike[str], *, column: str | Sequence[str] | None = None,
          mode: str = "error", codec: str = "zstd", ray_remote_args: dict[str, Any] | None = None,
          concurrency: int | None = None) -> int:
    """Write the Ray dataset ``ds`` as a dataset of parts; returns the rows committed.

    Each write task writes one part (per column); the driver commits the
    parts of the tasks that returned, in task order, and removes every part
    staged by failed or retried attempts. Every writer and the driver must
    see ``path`` as one file system (a local disk in local mode, a shared
    mount on a cluster).

    Args:
        ds: A ``ray.data.Dataset``.
        path: With ``column`` one name, the dataset of parts of that column
            (open it with :class:`zring.RaggedDataset` or
            :class:`zring.Dataset`); otherwise a folder holding one dataset
            of parts per column, ``path/<column>.zr``, record ``i`` of each
            from row ``i``.
        column: The column to write (a name), the columns (a list), or all
            of them (``None``).
        mode: ``"error"`` (a dataset at ``path`` is refused), ``"append"``
            (the new parts follow its parts: a loader state saved over it
            resumes over the grown dataset) or ``"overwrite"`` (the new parts
            replace its parts).
        codec: ``"zstd"`` (default) or ``"raw"``, as for
            :func:`zring.write_ragged`.
        ray_remote_args: Passed to the write tasks (``ds.write_datasink``),
            e.g. ``{"retry_exceptions": True}`` to retry tasks that raise
            (Ray retries tasks whose worker died by itself).
        concurrency: The most write tasks at once (Ray's default: by the
            resources).

    Raises:
        FileExistsError: ``mode="error"`` and ``path`` holds a dataset.
        ValueError: An unknown ``mode``, a column missing, holding nulls or
            of a type no store holds.
        RuntimeError: The rows the tasks wrote differ from the rows Ray
            reports it gave them (nothing is committed).
        zring.CorruptError: Parts of differing dtypes or shapes (nothing is
            committed for that column).
    """
    sink = ZringDatasink(path, column=column, mode=mode, codec=codec)
    ds.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    if sink.rows is None:
        # An empty dataset: Ray may never call the sink's commit.
        sink.on_write_complete([])
    return int(sink.rows or 0)
