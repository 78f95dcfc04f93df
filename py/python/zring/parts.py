"""Datasets written in parts: :func:`write_part` in any worker, :func:`commit` on the driver.

A dataset of parts is a folder of ordinary zring stores, one per part,
and a ``manifest.json`` listing the committed parts in order with their
record counts and fingerprints. :class:`zring.Dataset` and
:class:`zring.RaggedDataset` open such a folder as one dataset (index ``i``
is found in its part by binary search), so it goes wherever a dataset
goes: :class:`zring.DataLoader`, :func:`zring.mix`, :func:`zring.pack`,
:func:`zring.jax.global_loader`.

Writing takes two steps, so that any pool of workers can write and one
driver decides what the dataset holds::

    # in each worker (a multiprocessing pool, a Ray task, a Spark mapInPandas):
    info = zring.parts.write_part("corpus", docs)        # -> PartInfo, picklable
    # on the driver, with the PartInfos it got back:
    zring.parts.commit("corpus", infos, mode="append")

:func:`write_part` writes a complete store under ``<dataset>/staging/``
(built beside its place and renamed in, so a task that dies leaves no
half part under a name) and returns what the driver needs. :func:`commit`
moves exactly the parts it is given to ``<dataset>/parts/`` and replaces
the manifest in one atomic rename. A part is read only once a manifest
lists it. Several processes may commit at once; a refused commit leaves
its parts staged, and a commit either stands whole or changed nothing.

The engine owns every step: each file and folder of the dataset is
reached through the dataset folder's descriptor, never through a link
(a link planted at ``staging``, ``parts``, ``dropped`` or the manifest is
refused, naming it), and files and folders get the dataset folder's mode,
so every member of a group that may write the folder may commit.

What is left staged is removed by ownership, never by age alone: a
:class:`Job` (``job=`` of :func:`write_part` and :func:`commit`) removes
its own leftovers when it commits or gives up, and a commit removes a dead
job's leftovers once no process holds the job. Parts written with no job
are never removed by someone else's commit unless it asks
(``remove_uncommitted=`` seconds).

The layout::

    corpus/
      manifest.json        committed parts, in order (docs: "Datasets of parts")
      parts/<id>/          one store per committed part
      staging/<id>/        written, not yet committed
      dropped/<id>         when an overwrite dropped parts/<id> (removed an hour later)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from . import _zring
from ._zrecord import write_dataset, write_ragged

__all__ = ["KEEP_DROPPED", "Job", "PartInfo", "commit", "list_parts", "rank_balance", "rank_plan", "write_part"]

MANIFEST = "manifest.json"
PARTS_DIR = "parts"
STAGING_DIR = "staging"
DROPPED_DIR = "dropped"

#: Seconds a part an overwrite commit dropped stays on disk (a commit at
#: least that much later removes it), so that readers of the generation
#: before keep reading it.
KEEP_DROPPED = 3600.0

#: The most ranks :func:`rank_plan` and ``rank_parts=`` take.
MAX_RANKS = 1 << 20


@dataclasses.dataclass(frozen=True)
class PartInfo:
    """A part written by :func:`write_part`, to hand to :func:`commit`.

    Plain data (picklable), so a worker process can return it to the driver.
    """

    #: The part's id, its directory name under ``staging/`` (and ``parts/``).
    name: str
    #: Records in the part.
    records: int
    #: The part's fingerprint content (8 hex digits; see ``Zrecord.fingerprint``).
    content: str
    #: The dataset the part was written for, as :func:`write_part` was given
    #: it (made absolute), to name in an error when it is committed elsewhere.
    dataset: str = ""
    #: The records' decoded bytes when known, which the manifest records to
    #: place parts on ranks by bytes. A local commit reads them from the
    #: part itself; a commit to object storage takes them from here.
    bytes: int | None = None


class Job:
    """A writing job: a driver and the workers that write parts for it.

    While the job is open its driver holds the job's lock in the dataset,
    and each :func:`write_part` given ``job=`` holds it while it writes, so
    no other writer's commit takes the job's staged parts for a dead job's
    leftovers, however long the job runs. :meth:`commit` commits the parts
    and removes the job's leftovers (the parts of failed or retried tasks);
    closing a job that did not commit (or leaving its ``with`` block on an
    error) removes everything it staged. A job that dies leaves its lock
    free, and the next commit to the dataset removes what it staged.

    Pass the job (or its :attr:`id`, a short string, to a worker process)
    as ``write_part(..., job=job)``::

        with zring.parts.Job("corpus") as job:
            infos = pool.map(functools.partial(write_doc_part, job=job.id), shards)
            job.commit(infos)
    """

    def __init__(self, dataset: str | os.PathLike[str], id: str | None = None):
        self.dataset = os.fspath(dataset)
        #: The job's id (letters, digits and ``_``).
        self.id = id or uuid.uuid4().hex[:16]
        self._hold: Any = _zring.JobHold(self.dataset, self.id)

    def commit(self, infos: Iterable[PartInfo], mode: str = "append") -> int:
        """:func:`commit` of ``infos`` by this job; returns the generation."""
        return commit(self.dataset, infos, mode, job=self)

    def abandon(self) -> None:
        """Remove everything this job staged (nothing committed is touched)."""
        _zring.abandon_job(self.dataset, self.id)

    def close(self) -> None:
        """End the job: release its lock and remove what it staged and did
        not commit (all it staged, for a job that never committed)."""
        if self._hold is None:
            return
        self._hold.close()
        self._hold = None
        self.abandon()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Job stays with its driver: pass job.id to the workers (write_part(..., job=job.id))")


def _job_id(job: Job | str | None) -> str | None:
    if job is None or isinstance(job, str):
        return job
    if isinstance(job, Job):
        return job.id
    raise TypeError(f"job must be a zring.parts.Job, its id (a str) or None, got {type(job).__name__}")


def _part_name(job: str | None = None) -> str:
    """A new part id: ``p-<uuid>``, or ``p-<job>-<uuid>`` for a job's part."""
    return f"p-{job}-{uuid.uuid4().hex}" if job else f"p-{uuid.uuid4().hex}"


def write_part(dataset: str | os.PathLike[str], data: Any, *, ragged: bool | None = None,
               job: Job | str | None = None, **kwargs: Any) -> PartInfo:
    """Write ``data`` as one staged part of the dataset at ``dataset``; returns its :class:`PartInfo`.

    Safe to call from any number of processes at once (each part gets a new
    id). ``data`` is an array of samples (written as by
    :func:`zring.write_dataset`) or, with ``ragged=True`` or when it is not
    a NumPy array, an iterable of variable-length arrays (as by
    :func:`zring.write_ragged`); ``kwargs`` go to that function (``codec``,
    ``dtype``, ``item_shape``, ...). The part is invisible to readers until
    :func:`commit` lists it. With ``job`` (a :class:`Job` or its id) the part
    belongs to that job: removed by its commit if it is not committed, and
    by anyone's commit once the job is gone.

    Raises:
        ValueError: no records (a part holds at least one), or as the
            writer raises.
        OSError: a link or other non-folder planted at the dataset's
            ``staging`` (naming it; nothing is written).
    """
    job_id = _job_id(job)
    if ragged is None:
        ragged = not isinstance(data, np.ndarray)
    if not ragged and len(data) == 0:
        raise ValueError("no records to write; a part holds at least one")
    kwargs.setdefault("progress", False)
    with contextlib.closing(_zring.PartWriter(os.fspath(dataset), job_id)) as w:
        name = _part_name(job_id)
        target = Path(w.staging) / name
        if ragged:
            write_ragged(target, data, **kwargs)
        else:
            write_dataset(target, data, **kwargs)
        records, content, _schema = w.finish(name)
    return PartInfo(name=name, records=int(records), content=str(content), dataset=os.path.abspath(dataset))


def _stage(dataset: str | os.PathLike[str], store: str | os.PathLike[str],
           job: str | None = None) -> tuple[PartInfo, str | None]:
    """Moves the complete store at ``store`` (on the dataset's file system)
    into the dataset's staging area as a new part, as :func:`write_part`
    leaves the one it writes; returns its :class:`PartInfo` and its schema
    (JSON, without the codec; ``None`` for raw records)."""
    with contextlib.closing(_zring.PartWriter(os.fspath(dataset), job)) as w:
        name = _part_name(job)
        records, content, schema = w.adopt(os.fspath(store), name)
    return PartInfo(name=name, records=int(records), content=str(content),
                    dataset=os.path.abspath(dataset)), schema


def list_parts(dataset: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The committed parts of the dataset at ``dataset``, in order: dicts of
    ``dir`` (relative to the dataset), ``records``, ``content``, ``start``
    (the dataset index of the part's first record), ``number`` (its place
    in the manifest) and ``whole_start`` (equal to ``start`` here: the
    index in the whole dataset, which differs for a rank's share); ``[]`` for a folder with no manifest yet. Opens (and
    checks) every part."""
    root = Path(dataset)
    if not (root / MANIFEST).is_file() and not (root / PARTS_DIR).is_dir():
        return []
    with contextlib.closing(_zring.Parts(str(root))) as p:
        return list(p.parts_list())


def rank_plan(dataset: str | os.PathLike[str], ranks: int) -> list[list[str]]:
    """The part directories (relative to the dataset) each of ``ranks`` ranks
    reads when each opens only its own parts (``Dataset(path,
    rank_parts=(rank, ranks))``): ``plan[rank]``, in manifest order. Reads
    the manifest only, so it runs where the parts are not.

    Each part, in manifest order, goes to the rank with the fewest bytes so
    far (the records' decoded bytes, which the manifest records for each
    part: tokens for a token store; the lowest rank on a tie): deterministic,
    balanced within one part's bytes, and stable under appends (a part never moves to another rank
    when parts are appended after it, so a rank's saved loader state resumes
    over its grown parts). A run with another rank count is another split of
    the parts: a state saved with ``ranks`` ranks does not resume with
    another count (the loader refuses it, naming both counts). ``zring parts
    PATH --ranks N --rank K`` prints what rank ``K``'s host needs (the
    manifest and ``plan[K]``), for ``rsync --files-from``; docs/parts.rst,
    "Datasets beyond one host", has the rest. A manifest written before
    bytes were recorded (zring 0.2.0 and older) places by records, and keeps
    doing so after appends; :func:`rank_balance` reports the balance.
    """
    ranks = _ranks(ranks)
    rows = _zring.rank_plan(str(dataset), ranks)
    plan: list[list[str]] = [[] for _ in range(ranks)]
    for d, _records, rank, _bytes in rows:
        plan[rank].append(d)
    return plan


def rank_balance(dataset: str | os.PathLike[str], ranks: int) -> list[dict[str, Any]]:
    """What each of ``ranks`` ranks holds under :func:`rank_plan`: dicts of
    ``parts``, ``records`` and ``bytes`` (decoded; None when the manifest
    does not record them), one per rank. Reads the manifest only."""
    ranks = _ranks(ranks)
    out: list[dict[str, Any]] = [{"parts": 0, "records": 0, "bytes": 0} for _ in range(ranks)]
    for _d, records, rank, nbytes in _zring.rank_plan(str(dataset), ranks):
        r = out[rank]
        r["parts"] += 1
        r["records"] += int(records)
        r["bytes"] = None if nbytes is None or r["bytes"] is None else r["bytes"] + int(nbytes)
    return out


def _ranks(ranks: Any) -> int:
    """``ranks`` checked: an int from 1 to :data:`MAX_RANKS`."""
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)):
        raise TypeError(f"ranks must be an int, got {type(ranks).__name__} {ranks!r}")
    if not 1 <= int(ranks) <= MAX_RANKS:
        raise ValueError(f"ranks must be from 1 to {MAX_RANKS}, got {ranks}")
    return int(ranks)


def commit(dataset: str | os.PathLike[str], infos: Iterable[PartInfo], mode: str = "append",
           *, remove_uncommitted: bool | float = True, job: Job | str | None = None) -> int:
    """Commit the staged parts ``infos``, in that order; returns the manifest's generation.

    ``mode="append"`` lists the dataset's committed parts first, unchanged,
    then ``infos`` (a loader state saved before resumes over the grown
    dataset: the new parts join at its next cycle); ``"overwrite"`` lists
    ``infos`` only, and the parts no longer listed are removed by the first
    commit at least :data:`KEEP_DROPPED` (an hour) later, so that readers
    that opened the dataset before go on reading it (after that, a read of a
    removed part raises :class:`zring.StaleError`: reopen). The manifest is
    replaced in one atomic rename, so a reader sees the old list or the new
    one. A part is checked (its records and schema) before the manifest
    names it, and every part must have the dtype and shape of the others.
    Commits are serialised by a lock on the dataset: two processes may
    commit to one dataset at once, and each append lands.

    A commit stands whole or changed nothing. One that fails before the
    manifest is replaced (a part refused, the manifest damaged or missing, a
    part listed twice, a link planted at one of the dataset's names) leaves
    the manifest as it was and its parts staged, to be committed again.
    Once the manifest is replaced the commit stands: what fails after (the
    folder's sync, removing leftovers) is a :class:`RuntimeWarning`, never
    an undo. A folder whose ``manifest.json`` is missing while its
    ``parts/`` holds parts is an error (restore the manifest), never a new
    dataset. Committing a part twice (a driver that retries its commit) is
    harmless: a part listed already is not listed again.

    Then what is staged and owned by no live writer is removed: with
    ``job``, the job's own leftovers (the parts of its failed or retried
    tasks); the leftovers of jobs that are gone (no process holds their
    lock); stores being built whose writer is gone. Parts written with no
    job are removed only when ``remove_uncommitted`` is a number of
    seconds and they are at least that old (``0``: every one, for a driver
    that is the dataset's only writer); ``True`` (the default) removes only
    what is provably abandoned, and ``False`` nothing staged.

    Raises:
        ValueError: an unknown ``mode``, a part listed twice, or a part
            missing from the staging area (never written there, written
            for another dataset, or removed).
        CorruptError: a part whose records differ from its PartInfo, or
            whose schema differs from the other parts', or a damaged or
            missing manifest (each naming the file, and what to do).
        OSError: a link or other non-folder at ``staging``, ``parts`` or
            ``dropped``, or a manifest that is not a regular file (naming it).
        NotAStoreError: a committed part missing (naming it).
    """
    return _commit([(dataset, infos, mode)], remove_uncommitted=remove_uncommitted, job=job)[0]


def _commit(requests: Iterable[tuple[str | os.PathLike[str], Iterable[PartInfo], str]], *,
            remove_uncommitted: bool | float = True, job: Job | str | None = None) -> list[int]:
    """:func:`commit` of several datasets at once (the columns of one
    table): all are checked before any is applied, so a part refused in one
    commits none. Returns each dataset's generation."""
    if remove_uncommitted is True:
        older_than: float | None = None
        keep = False
    elif remove_uncommitted is False:
        older_than, keep = None, True
    else:
        older_than = float(remove_uncommitted)
        keep = False
        if not older_than >= 0:
            raise ValueError(f"remove_uncommitted must be True, False or seconds >= 0, got {remove_uncommitted!r}")
    reqs = []
    for dataset, infos, mode in requests:
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
        infos = list(infos)
        for info in infos:
            if not isinstance(info, PartInfo):
                raise TypeError(f"commit takes PartInfo objects from write_part, got {type(info).__name__}")
        seen: set[str] = set()
        for info in infos:
            if info.name in seen:
                raise ValueError(f"part {info.name} is given twice; give each PartInfo once")
            seen.add(info.name)
        for info in infos:
            if (info.dataset and os.path.abspath(dataset) != info.dataset
                    and not os.path.lexists(os.path.join(dataset, STAGING_DIR, info.name))):
                raise ValueError(f"part {info.name} was written for the dataset {info.dataset}, not {dataset}: "
                                 "commit it to the dataset given to write_part")
        reqs.append((os.fspath(dataset), [(i.name, int(i.records), str(i.content)) for i in infos],
                     mode == "overwrite"))
    done = _zring.commit_parts(reqs, _job_id(job), older_than, keep)
    for generation, notes in done:
        for note in notes:
            warnings.warn(note, RuntimeWarning, stacklevel=3)
    return [int(g) for g, _ in done]
