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
moves exactly the parts it is given to ``<dataset>/parts/``, replaces the
manifest in one atomic rename, then removes the staged leftovers an hour
old: the parts of failed or retried attempts, which no manifest ever names
(younger ones may be another writer's, yet to be committed). A part is
read only once a manifest lists it. Several processes may commit at once;
a refused commit leaves its parts staged.

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
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _zring
from ._zrecord import write_dataset, write_ragged

__all__ = ["KEEP_DROPPED", "PartInfo", "STAGED_GRACE", "commit", "list_parts", "rank_plan", "write_part"]

MANIFEST = "manifest.json"
PARTS_DIR = "parts"
STAGING_DIR = "staging"
DROPPED_DIR = "dropped"
_LOCK = ".commit.lock"


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


def write_part(dataset: str | os.PathLike[str], data: Any, *, ragged: bool | None = None,
               _job: str | None = None, **kwargs: Any) -> PartInfo:
    """Write ``data`` as one staged part of the dataset at ``dataset``; returns its :class:`PartInfo`.

    Safe to call from any number of processes at once (each part gets a new
    id). ``data`` is an array of samples (written as by
    :func:`zring.write_dataset`) or, with ``ragged=True`` or when it is not
    a NumPy array, an iterable of variable-length arrays (as by
    :func:`zring.write_ragged`); ``kwargs`` go to that function (``codec``,
    ``dtype``, ``item_shape``, ...). The part is invisible to readers until
    :func:`commit` lists it.

    Raises:
        ValueError: no records (a part holds at least one), or as the
            writer raises.
    """
    root = Path(dataset)
    staging = root / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    name = _part_name(_job)
    kwargs.setdefault("progress", False)
    if ragged is None:
        ragged = not isinstance(data, np.ndarray)
    if not ragged and len(data) == 0:
        raise ValueError("no records to write; a part holds at least one")
    with _writing(staging):
        if ragged:
            write_ragged(staging / name, data, **kwargs)
        else:
            write_dataset(staging / name, data, **kwargs)
    records, content, _schema = _zring.part_fingerprint(str(staging / name))
    return PartInfo(name=name, records=int(records), content=str(content), dataset=os.path.abspath(root))


@contextlib.contextmanager
def _writing(staging: Path):
    """A part being written: a shared lock on the staging folder, so that a
    commit's cleanup leaves the folders being built (``.NAME.*.partial``)."""
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _writers_active(staging: Path) -> bool:
    """Whether a :func:`write_part` is writing into ``staging`` now."""
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def _part_name(job: str | None = None) -> str:
    """A new part id: ``p-<uuid>``, or ``p-<job>-<uuid>`` for a part staged
    by a writing job that removes its own leftovers
    (:func:`_remove_job_leftovers`)."""
    return f"p-{job}-{uuid.uuid4().hex}" if job else f"p-{uuid.uuid4().hex}"


def _remove_job_leftovers(root: Path, job: str) -> None:
    """Remove what job ``job``'s tasks left in the staging area of the
    dataset at ``root``: the parts of failed or retried attempts, which no
    commit lists (the committed ones have left ``staging/``), and the folders
    they were building. Other writers' staged parts stay."""
    staging = root / STAGING_DIR
    if not staging.is_dir():
        return
    with _commit_lock(root):
        for child in staging.iterdir():
            if child.name.startswith((f"p-{job}-", f".building-{job}-")) and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)


def _stage(dataset: str | os.PathLike[str], store: str | os.PathLike[str],
           job: str | None = None) -> tuple[PartInfo, str | None]:
    """Moves the complete store at ``store`` (on the dataset's file system)
    into the dataset's staging area as a new part, as :func:`write_part`
    leaves the one it writes; returns its :class:`PartInfo` and its schema
    (JSON, without the codec; ``None`` for raw records), which
    :func:`commit` requires of every part alike."""
    staging = Path(dataset) / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    name = _part_name(job)
    os.rename(store, staging / name)
    records, content, schema = _zring.part_fingerprint(str(staging / name))
    return PartInfo(name=name, records=int(records), content=str(content)), schema


@contextlib.contextmanager
def _commit_lock(root: Path):
    """One commit at a time per dataset (an advisory lock on ``.commit.lock``)."""
    fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_parts(dataset: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The committed parts of the dataset at ``dataset``, in order: dicts of
    ``dir`` (relative to the dataset), ``records``, ``content``, ``start``
    (the dataset index of the part's first record) and ``number`` (its place
    in the manifest); ``[]`` for a folder with no manifest yet. Opens (and
    checks) every part."""
    root = Path(dataset)
    if not (root / MANIFEST).is_file():
        return []
    with contextlib.closing(_zring.Parts(str(root))) as p:
        return list(p.parts_list())


def rank_plan(dataset: str | os.PathLike[str], ranks: int) -> list[list[str]]:
    """The part directories (relative to the dataset) each of ``ranks`` ranks
    reads when each opens only its own parts (``Dataset(path,
    rank_parts=(rank, ranks))``): ``plan[rank]``, in manifest order. Reads
    the manifest only, so it runs where the parts are not.

    Each part, in manifest order, goes to the rank with the fewest records so
    far (the lowest on a tie): deterministic, balanced within one part's
    records, and stable under appends (a part never moves to another rank
    when parts are appended after it, so a rank's saved loader state resumes
    over its grown parts). A run with another rank count is another split of
    the parts: a state saved with ``ranks`` ranks does not resume with
    another count (the loader refuses it, naming both counts). ``zring parts
    PATH --ranks N --rank K`` prints what rank ``K``'s host needs (the
    manifest and ``plan[K]``), for ``rsync --files-from``; docs/parts.rst,
    "Datasets beyond one host", has the rest.
    """
    plan: list[list[str]] = [[] for _ in range(int(ranks))]
    for d, _records, rank in _zring.rank_plan(str(dataset), int(ranks)):
        plan[rank].append(d)
    return plan


def _listed(root: Path) -> list[tuple[str, int, str]]:
    """The manifest's parts without opening them, its checksum checked."""
    if not (root / MANIFEST).is_file():
        return []
    return [(d, int(r), str(c)) for d, r, c in _zring.manifest_parts(str(root))]


#: Seconds a part an overwrite commit dropped stays on disk (a commit at
#: least that much later removes it), so that readers of the generation
#: before keep reading it.
KEEP_DROPPED = 3600.0

#: Seconds a staged part is kept before a commit may remove it as a leftover
#: (``remove_uncommitted=True``): another writer's parts, staged and not yet
#: committed, are younger than this.
STAGED_GRACE = 3600.0


def _age(path: Path, now: float) -> float:
    """Seconds since ``path`` (a staged part's folder) last changed."""
    try:
        return now - path.lstat().st_mtime
    except FileNotFoundError:
        return -1.0


def _remove_staged(staging: Path, grace: float) -> None:
    """Remove the staged leftovers at least ``grace`` seconds old; never a
    folder being written (``.NAME.*.partial``) while a write is running."""
    active = _writers_active(staging)
    now = time.time()
    for child in staging.iterdir():
        if active and child.name.startswith(".") and child.name.endswith(".partial"):
            continue
        if _age(child, now) < grace:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def commit(dataset: str | os.PathLike[str], infos: Iterable[PartInfo], mode: str = "append",
           *, remove_uncommitted: bool | float = True) -> int:
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

    A commit that fails (a part refused, the manifest damaged, a part
    listed twice) leaves the manifest as it was and puts the parts it was
    given back under ``staging/``, so they can be committed again.

    Then the leftovers under ``staging/`` are removed: the parts of failed or
    retried tasks, which no manifest will name. A staged part cannot say
    whether a task failed after writing it or another writer's driver has
    yet to commit it, so ``remove_uncommitted=True`` (the default) removes
    only staged parts at least :data:`STAGED_GRACE` (an hour) old, and never
    a part being written: every writer's parts are safe for that long. A
    number removes those at least that many seconds old (``0``: every
    staged part not being written now, for a driver that is the dataset's
    only writer and commits once its tasks have finished); ``False``
    removes nothing.

    Committing a part twice (a driver that retries its commit) is harmless:
    a part already under ``parts/`` is not moved again, and a part listed
    twice is an error.

    Raises:
        ValueError: an unknown ``mode``, a part listed twice, or a part
            missing from the staging area (never written there, written
            for another dataset, or removed).
        CorruptError: a part whose records differ from its PartInfo, or
            whose schema differs from the other parts', or a damaged
            manifest (each naming the file, and what to do).
        NotAStoreError: a committed part missing (naming it).
    """
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    if remove_uncommitted is True:
        grace: float | None = STAGED_GRACE
    elif remove_uncommitted is False:
        grace = None
    else:
        grace = float(remove_uncommitted)
        if not grace >= 0:
            raise ValueError(f"remove_uncommitted must be True, False or seconds >= 0, got {remove_uncommitted!r}")
    root = Path(dataset)
    infos = list(infos)
    for info in infos:
        if not isinstance(info, PartInfo):
            raise TypeError(f"commit takes PartInfo objects from write_part, got {type(info).__name__}")
    seen: set[str] = set()
    for info in infos:
        if info.name in seen:
            raise ValueError(f"part {info.name} is given twice; give each PartInfo once")
        seen.add(info.name)
    root.mkdir(parents=True, exist_ok=True)
    (root / PARTS_DIR).mkdir(exist_ok=True)
    staging = root / STAGING_DIR
    with _commit_lock(root):
        previous = _listed(root)
        old = previous if mode == "append" else []
        old_dirs = {d for d, _, _ in old}
        entries = list(old)
        moved: list[str] = []
        try:
            for info in infos:
                rel = f"{PARTS_DIR}/{info.name}"
                if rel in old_dirs:
                    continue  # committed before: a retried commit
                src, dst = staging / info.name, root / PARTS_DIR / info.name
                if src.is_dir() and not dst.exists():
                    os.rename(src, dst)
                    moved.append(info.name)
                elif not dst.is_dir():
                    if info.dataset and os.path.abspath(root) != info.dataset:
                        raise ValueError(
                            f"part {info.name} was written for the dataset {info.dataset}, not {root}: commit it "
                            "to the dataset given to write_part"
                        )
                    raise ValueError(
                        f"part {info.name} is not staged in {staging}: it was removed (or never written there); "
                        "write it again"
                    )
                entries.append((rel, info.records, info.content))
            if moved:
                _fsync_dir(root / PARTS_DIR)
                if staging.is_dir():
                    _fsync_dir(staging)
            generation = _zring.commit_parts(str(root), entries, mode == "overwrite")
        except BaseException:
            # Nothing committed: the parts go back to staging, to be committed again.
            staging.mkdir(exist_ok=True)
            for name in moved:
                with contextlib.suppress(OSError):
                    os.rename(root / PARTS_DIR / name, staging / name)
            raise
        listed = {d.split("/", 1)[1] for d, _, _ in entries}
        dropped = {d.split("/", 1)[1] for d, _, _ in previous} - listed
        marks = root / DROPPED_DIR
        if dropped:
            # Dropped by an overwrite: marked now, removed by a commit once
            # KEEP_DROPPED old, so a reader of the old generation reads on.
            marks.mkdir(exist_ok=True)
            for name in dropped:
                (marks / name).touch()
        now = time.time()
        for child in (root / PARTS_DIR).iterdir():
            if child.name in listed:
                continue
            mark = marks / child.name
            if mark.exists():
                if _age(mark, now) >= KEEP_DROPPED:
                    shutil.rmtree(child, ignore_errors=True)
            else:
                # Moved by a commit that died before its manifest: staged again.
                staging.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):
                    os.rename(child, staging / child.name)
        if marks.is_dir():
            for mark in marks.iterdir():
                if mark.name in listed or not (root / PARTS_DIR / mark.name).exists():
                    mark.unlink(missing_ok=True)
        if grace is not None and staging.is_dir():
            _remove_staged(staging, grace)
    return int(generation)
