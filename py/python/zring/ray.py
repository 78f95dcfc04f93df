"""Write a Ray Data dataset as a dataset of parts: ``zring.ray.write(ds, path)``.

Needs Ray Data (``pip install 'zring[ray]'``); the rest of zring does not.
Each Ray write task writes the rows it is given as one part per column with
:func:`zring.parts.write_part` (into the dataset's ``staging/``) and
returns the parts' :class:`~zring.parts.PartInfo`; once every task has
finished, the driver commits exactly the parts it got back, in the order of
the tasks, every column in one commit (:func:`zring.parts.commit`; all
columns are checked before any is applied, so a part refused in one column
commits none), and removes what else its tasks staged: the parts of
attempts that failed after writing, or that Ray retried. The driver holds
the job's lock in each dataset meanwhile, so no other writer's commit
takes the job's parts for a dead job's. A job that fails commits nothing
and removes what it staged::

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
A column is ragged whatever one block holds: a block whose rows all have
one length (Ray hands it over as a fixed-shape tensor) joins the column's
ragged parts, or the ragged dataset appended to, as ragged. A column that
is missing or holds nulls is refused before anything is staged.

Ray's sink interface (``ray.data.Datasink``) is a developer API that has
changed between minor releases (the arguments of ``on_write_complete`` in
2.39, of ``on_write_start`` later). :class:`ZringDatasink` takes either
form, and the driver checks the records it commits against the rows Ray
reports it gave the write tasks: a mismatch (a sink interface changed under
it) raises and commits nothing, rather than writing a dataset short of rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _zring
from . import parts as _parts
from . import remote as _remote

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
    #: Each part's schema (JSON without the codec), by column.
    schemas: dict[str, str | None] = dataclasses.field(default_factory=dict)


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


def _check_column(tables: Sequence[Any], column: str) -> None:
    """Refuses a column that is missing or holds nulls, before anything is
    staged (the documented errors, whatever Arrow type the column has)."""
    for t in tables:
        if column not in t.schema.names:
            raise ValueError(f"the dataset has no column {column!r}; it has {t.schema.names}")
        col = t.column(column)
        if col.null_count:
            raise ValueError(f"column {column!r} holds nulls, which a zring store cannot hold; fill or drop "
                             f"them first (Dataset.map_batches)")
    list(_chunks(tables, column))  # nulls inside lists


def _write_column(root: Path, tables: Sequence[Any], column: str, codec: str,
                  job: str) -> tuple[_parts.PartInfo, str | None]:
    """The rows of ``column`` in ``tables`` as one staged part of the dataset
    at ``root`` (job ``job``'s), and its schema (JSON without the codec).
    Arrow lists, strings and fixed-width columns are appended a chunk at a
    time (values and offsets as they are, no array per row); Ray's tensor
    columns go through :func:`zring.parts.write_part`'s writers. The part
    is built through the engine's descriptor of the dataset's ``staging/``
    (:class:`zring.parts.PartWriter`), never through a path."""
    from ._convert import _Sink
    from ._zrecord import write_dataset, write_ragged

    kind, dtype, shape = _plan(tables[0].schema.field(column).type)
    for t in tables[1:]:
        other = _plan(t.schema.field(column).type)
        if kind != "numpy" and other != (kind, dtype, shape):
            raise ValueError(f"column {column!r} is {t.schema.field(column).type} in one block and "
                             f"{tables[0].schema.field(column).type} in another")
    with contextlib.closing(_zring.PartWriter(os.fspath(root), job)) as w:
        name = _parts._part_name(job)
        target = Path(w.staging) / name
        if kind == "numpy":
            # Ray's own conversion: an array of one shape, or an object array
            # of arrays of several.
            arrays = [np.asarray(_BlockAccessor.for_block(tb).to_numpy(column)) for tb in tables]
            if all(a.dtype != object for a in arrays) and len({a.shape[1:] for a in arrays}) == 1:
                write_dataset(target, np.concatenate(arrays), codec=codec, progress=False)
            else:
                def rows() -> Iterator[np.ndarray]:
                    for a in arrays:
                        for row in a:
                            row = np.asarray(row)
                            if row.dtype == object:
                                raise ValueError(f"column {column!r} holds rows that are not numeric arrays")
                            yield row
                write_ragged(target, rows(), codec=codec, progress=False)
        else:
            staging = _zring.Staging(str(target), False)
            ok = False
            try:
                sink = _Sink(Path(staging.path), dtype, None if kind != "fixed" else shape, codec)
                try:
                    for chunk in _chunks(tables, column):
                        if kind == "fixed":
                            sink.fixed(_fixed_rows(chunk, shape))
                        else:
                            sink.ragged(*(_list_rows(chunk) if kind == "list" else _bytes_rows(chunk)))
                    ok = True
                finally:
                    sink.close(failed=not ok)
                staging.publish()
            finally:
                if not ok:
                    staging.discard()
        records, content, schema = w.finish(name)
    info = _parts.PartInfo(name=name, records=int(records), content=str(content), dataset=os.path.abspath(root))
    return info, schema


def _as_ragged(schema: str | None) -> dict[str, Any] | None:
    """The ragged schema a fixed part of 1-D rows has when its column is
    ragged (a Ray block whose rows all had one length arrives as a
    fixed-shape tensor), or None when the part is no such thing."""
    if schema is None:
        return None
    s = json.loads(schema)
    if s.get("ragged") or len(s.get("shape", [])) != 1:
        return None
    out = {k: v for k, v in s.items() if k != "shape"}
    out["ragged"] = True
    out["item_shape"] = []
    return out


def _make_ragged(root: Path, parts: list[tuple[_parts.PartInfo, str | None]], existing: str | None,
                 codec: str) -> None:
    """A column's parts of one job made one kind: when some are ragged (or
    the dataset they join is) and others are fixed parts of 1-D rows of the
    same dtype (blocks whose rows all had one length), the fixed ones get
    the ragged schema, their records unchanged."""
    schemas = [sch for _, sch in parts] + ([existing] if existing else [])
    ragged = [json.loads(sch) for sch in schemas if sch and json.loads(sch).get("ragged")]
    if not ragged:
        return
    want = ragged[0]
    fix = [(info, _as_ragged(sch)) for info, sch in parts]
    fix = [(info, r) for info, r in fix if r is not None and r == want]
    if not fix:
        return
    with contextlib.closing(_zring.PartWriter(os.fspath(root), None)) as w:
        for info, r in fix:
            w.set_schema(info.name, json.dumps({**r, "codec": codec}, indent=2) + "\n")


class ZringDatasink(_Datasink):
    """A Ray Data sink writing a dataset of parts at ``path``
    (``ds.write_datasink(ZringDatasink(path, ...))``; :func:`write` is the
    short form and documents the arguments). After the write,
    :attr:`rows` is the number of rows committed and :attr:`generation`
    the manifest generation of each column's dataset."""

    def __init__(self, path: str | os.PathLike[str], *, column: str | Sequence[str] | None = None,
                 mode: str = "error", codec: str = "zstd", storage_options: dict[str, Any] | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
        if codec not in ("zstd", "raw"):
            raise ValueError(f"codec must be 'zstd' or 'raw', got {codec!r}")
        self.path = str(path).rstrip("/") if _remote.is_url(str(path)) else str(path)
        #: A dataset in object storage: tasks upload their parts, the driver
        #: commits with a conditional write of the manifest.
        self._url = _remote.is_url(self.path)
        if storage_options is not None and not self._url:
            raise ValueError(f"storage_options= is for datasets in object storage; {self.path} is a local path")
        _remote.options(storage_options)  # checked here, in the driver
        # Kept as given: a credentials callable goes to each task with it,
        # where `options` registers it in that task's process.
        self._storage_options = storage_options
        self.column = column
        self.mode = mode
        self.codec = codec
        # Names the parts this write's tasks stage, so that the driver removes
        # its own failed attempts' leftovers and never another writer's.
        self._job = uuid.uuid4().hex[:16]
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

    @property
    def _options(self) -> list[tuple[str, str]]:
        return _remote.options(self._storage_options)

    def _url_of(self, column: str) -> str:
        """The URL of ``column``'s dataset of parts (in object storage)."""
        return self.path if isinstance(self.column, str) else f"{self.path}/{column}.zr"

    def _remote_exists(self, url: str) -> bool:
        return _zring.stat_object(url, self._options, _parts.MANIFEST) is not None

    def _check_target(self, columns: Sequence[str]) -> None:
        """``mode="error"``: refuse a path holding a dataset already;
        ``"append"`` to columns: every column's dataset there, or none."""
        if self._url:
            urls = [self.path] if isinstance(self.column, str) else [self._url_of(c) for c in columns]
            there = [u for u in urls if self._remote_exists(u)]
            if self.mode == "error" and there:
                raise FileExistsError(f"{there[0]} holds a dataset of parts already; pass mode='append' to add "
                                      f"to it or mode='overwrite' to replace it")
            if self.mode == "append" and there and len(there) != len(urls):
                raise ValueError(f"appending columns {sorted(columns)} to {self.path}, where only {there} hold a "
                                 f"dataset: append every column it holds, no other")
            return
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
        """Checks the target again and holds the job's lock in each named
        column's dataset. ``schema`` is not used: Ray passes the schema of
        the write's first input, which is the input of any map fused into
        the write, not what the tasks write (each task checks its columns).
        With ``column=None`` the columns are known only when the tasks
        return, so their locks are taken then."""
        names = self._named_columns() or []
        self._check_target(names)
        if not self._url:
            self._hold(names)

    def write(self, blocks: Iterable[Any], ctx: Any) -> _TaskResult:
        """One write task: the rows of ``blocks`` as one staged part per
        column. Every column is checked (present, no nulls) before any is
        staged."""
        tables = [_BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        task = int(getattr(ctx, "task_idx", 0))
        rows = sum(t.num_rows for t in tables)
        if not rows:
            return _TaskResult(task, 0, {})
        names = self._named_columns() or list(tables[0].schema.names)
        for c in names:
            _check_column(tables, c)
        if self._url:
            written = self._write_remote(tables, names)
        else:
            written = {c: _write_column(self._root(c), tables, c, self.codec, self._job) for c in names}
        return _TaskResult(task, rows, {c: w[0] for c, w in written.items()}, {c: w[1] for c, w in written.items()})

    def _write_remote(self, tables: Sequence[Any], names: Sequence[str]) -> dict[str, tuple[_parts.PartInfo,
                                                                                              str | None]]:
        """One task's parts built in a local folder of its own and uploaded
        under each column's ``parts/``; nothing lists them until the driver
        commits."""
        import shutil
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="zring-ray-"))
        try:
            out = {}
            for c in names:
                info, schema = _write_column(work / c, tables, c, self.codec, self._job)
                local = work / c / _parts.STAGING_DIR / info.name
                _zring.upload_part(self._url_of(c), self._options, os.fspath(local), info.name)
                info = dataclasses.replace(info, bytes=_remote.decoded_bytes(local))
                out[c] = (info, schema)
            return out
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _remove_remote_leftovers(self, columns: Sequence[str]) -> None:
        """Removes this job's uploaded parts that no manifest lists (failed
        or retried attempts, or a failed commit's)."""
        for c in columns:
            url = self._url_of(c)
            mine = {k.split("/")[1] for k, _, _ in _zring.list_objects(url, self._options, _parts.PARTS_DIR + "/")
                    if k.split("/")[1].startswith(f"p-{self._job}-")}
            if mine:
                _zring.remove_unlisted(url, self._options, sorted(mine))

    def _complete_remote(self, results: Sequence[_TaskResult], columns: Sequence[str], rows: int) -> None:
        """Each column's parts committed with a conditional write of its
        manifest. Every column is checked before any is committed; the
        columns' manifests are separate objects, so a commit failing
        between two columns leaves the first committed (the error says so)."""
        overwrite = self.mode == "overwrite"
        self._check_target(columns)
        plan = []
        for c in columns:
            staged = [(r.parts[c], r.schemas.get(c)) for r in results]
            kinds = {sch for _, sch in staged}
            if len(kinds) > 1:
                raise ValueError(f"column {c!r}: the tasks wrote parts of {len(kinds)} schemas ({sorted(map(str, kinds))}); "
                                 f"in object storage a column's parts must all be fixed or all ragged (cast it "
                                 f"to one type first); nothing was committed")
            plan.append((c, staged))
        done = []
        for c, staged in plan:
            try:
                g, _, warnings = _zring.commit(self._url_of(c), self._options,
                                               [(i.name, i.records, i.content, sch, i.bytes) for i, sch in staged],
                                               overwrite)
            except Exception as e:
                if done:
                    raise type(e)(f"{e} (columns {done} were committed; {c} and after were not)") from e
                raise
            for w in warnings:
                import warnings as _w

                _w.warn(w, RuntimeWarning, stacklevel=3)
            done.append(c)
            self.generation[c] = int(g)
        self._remove_remote_leftovers(columns)
        self.rows = rows

    def on_write_complete(self, write_result: Any, *args: Any, **kwargs: Any) -> None:
        """Commits the parts the tasks returned, in task order, every
        column's dataset in one commit (all are checked before any is
        applied, so a part refused in one column commits none). Takes Ray's
        ``WriteResult`` (2.39 and later) or the list of the tasks' returns
        (before)."""
        try:
            self._complete(write_result)
        finally:
            self._release()

    def _complete(self, write_result: Any) -> None:
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
        if self._url:
            self._complete_remote(results, columns, rows)
            return
        mode = "overwrite" if self.mode == "overwrite" else "append"
        self._check_target(columns)
        self._hold(columns)
        requests = []
        for c in columns:
            staged = [(r.parts[c], r.schemas.get(c)) for r in results]
            root = self._root(c)
            exists = (root / _parts.MANIFEST).is_file()
            if staged:
                _make_ragged(root, staged, _zring.manifest_schema(str(root)) if exists else None, self.codec)
            if staged or mode == "overwrite" or exists:
                requests.append((root, [info for info, _ in staged], mode))
        generations = _parts._commit(requests, job=self._job)
        for (root, _, _), g in zip(requests, generations):
            for c in columns:
                if self._root(c) == root:
                    self.generation[c] = g
        self.rows = rows

    def on_write_failed(self, error: Exception, *args: Any, **kwargs: Any) -> None:
        """Removes what the failed job's tasks staged (no manifest names it;
        the datasets are as they were)."""
        if self._url:
            with contextlib.suppress(Exception):
                self._remove_remote_leftovers(self._named_columns() or [])
            return
        try:
            for root in self._roots():
                with contextlib.suppress(FileNotFoundError):
                    _zring.abandon_job(str(root), self._job)
        finally:
            self._release()

    # -- the job's lock -------------------------------------------------------

    def _roots(self, columns: Sequence[str] = ()) -> list[Path]:
        """The column datasets this write may touch."""
        if isinstance(self.column, str):
            return [Path(self.path)]
        roots = {self._root(c) for c in columns or (self._named_columns() or [])}
        if os.path.isdir(self.path):
            roots |= {p for p in Path(self.path).glob("*.zr") if (p / _parts.STAGING_DIR).is_dir()}
        return sorted(roots)

    def _hold(self, columns: Sequence[str]) -> None:
        """The driver holds the job's lock in each column's dataset from
        before its tasks start until it commits or gives up, so that no
        other commit removes the job's finished parts meanwhile."""
        held = _HOLDS.setdefault(self._job, {})
        for root in self._roots(columns):
            if root not in held:
                held[root] = _zring.JobHold(str(root), self._job)

    def _release(self) -> None:
        """Releases the job's locks and removes their files (with whatever
        the job left staged: its commit took what it wanted)."""
        for root, h in _HOLDS.pop(self._job, {}).items():
            h.close()
            with contextlib.suppress(OSError):
                _zring.abandon_job(str(root), self._job)


#: The job locks each write's driver holds, by job id (kept out of the sink,
#: which Ray pickles to its tasks).
_HOLDS: dict[str, dict[Path, Any]] = {}


def write(ds: Any, path: str | os.PathLike[str], *, column: str | Sequence[str] | None = None,
          mode: str = "error", codec: str = "zstd", ray_remote_args: dict[str, Any] | None = None,
          concurrency: int | None = None, storage_options: dict[str, Any] | None = None) -> int:
    """Write the Ray dataset ``ds`` as a dataset of parts; returns the rows committed.

    Each write task writes one part (per column); the driver commits the
    parts of the tasks that returned, in task order, and removes every part
    staged by failed or retried attempts. Every writer and the driver must
    see ``path`` as one file system (a local disk in local mode, a shared
    mount on a cluster), or ``path`` is a URL in object storage
    (``s3://bucket/corpus``, ``gs://``, ``az://``): each task then builds
    its part in a temporary folder and uploads it, and the driver commits
    with a conditional write of the manifest (:mod:`zring.remote`).

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
        storage_options: For a URL: the store's options and credentials
            (:mod:`zring.remote`).

    Raises:
        FileExistsError: ``mode="error"`` and ``path`` holds a dataset.
        ValueError: An unknown ``mode``, a column missing, holding nulls or
            of a type no store holds.
        RuntimeError: The rows the tasks wrote differ from the rows Ray
            reports it gave them (nothing is committed).
        zring.CorruptError: Parts of differing dtypes or shapes (nothing is
            committed, for any column).
    """
    sink = ZringDatasink(path, column=column, mode=mode, codec=codec, storage_options=storage_options)
    ds.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    if sink.rows is None:
        # An empty dataset: Ray may never call the sink's commit.
        sink.on_write_complete([])
    return int(sink.rows or 0)
