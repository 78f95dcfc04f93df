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
manifest in one atomic rename, then removes whatever else is staged: the
parts of failed or retried attempts, which no manifest ever names. A
part is read only once a manifest lists it.

The layout::

    corpus/
      manifest.json        committed parts, in order (docs: "Datasets of parts")
      parts/<id>/          one store per committed part
      staging/<id>/        written, not yet committed
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _zring
from ._zrecord import write_dataset, write_ragged

__all__ = ["PartInfo", "commit", "list_parts", "rank_plan", "write_part"]

MANIFEST = "manifest.json"
PARTS_DIR = "parts"
STAGING_DIR = "staging"
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


def write_part(dataset: str | os.PathLike[str], data: Any, *, ragged: bool | None = None,
               **kwargs: Any) -> PartInfo:
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
    name = f"p-{uuid.uuid4().hex}"
    kwargs.setdefault("progress", False)
    if ragged is None:
        ragged = not isinstance(data, np.ndarray)
    if ragged:
        write_ragged(staging / name, data, **kwargs)
    else:
        if len(data) == 0:
            raise ValueError("no records to write; a part holds at least one")
        write_dataset(staging / name, data, **kwargs)
    records, content, _schema = _zring.part_fingerprint(str(staging / name))
    return PartInfo(name=name, records=int(records), content=str(content))


def _stage(dataset: str | os.PathLike[str], store: str | os.PathLike[str]) -> tuple[PartInfo, str | None]:
    """Moves the complete store at ``store`` (on the dataset's file system)
    into the dataset's staging area as a new part, as :func:`write_part`
    leaves the one it writes; returns its :class:`PartInfo` and its schema
    (JSON, without the codec; ``None`` for raw records), which
    :func:`commit` requires of every part alike."""
    staging = Path(dataset) / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    name = f"p-{uuid.uuid4().hex}"
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
    """The manifest's parts without opening them (the commit checks the
    manifest's checksum itself)."""
    path = root / MANIFEST
    if not path.is_file():
        return []
    doc = json.loads(path.read_text(encoding="utf-8"))
    return [(p["dir"], int(p["records"]), str(p["content"])) for p in doc.get("parts", [])]


def commit(dataset: str | os.PathLike[str], infos: Iterable[PartInfo], mode: str = "append",
           *, remove_uncommitted: bool = True) -> int:
    """Commit the staged parts ``infos``, in that order; returns the manifest's generation.

    ``mode="append"`` lists the dataset's committed parts first, unchanged,
    then ``infos`` (a loader state saved before resumes over the grown
    dataset: the new parts join at its next cycle); ``"overwrite"`` lists
    ``infos`` only, and the parts no longer listed are removed. The manifest
    is replaced in one atomic rename, so a reader sees the old list or the
    new one. A part is checked (its records and schema) before the manifest
    names it, and every part must have the dtype and shape of the others.

    Then, with ``remove_uncommitted`` (the default), everything else under
    ``staging/`` is removed: the parts of failed or retried tasks. Commit
    once every task of the job has finished (a task still writing would
    lose its part); with ``remove_uncommitted=False`` staged parts stay for
    a later commit.

    Committing a part twice (a driver that retries its commit) is harmless:
    a part already under ``parts/`` is not moved again, and a part listed
    twice is an error.

    Raises:
        ValueError: an unknown ``mode``, or a part missing from the staging
            area (never written, or removed by another commit).
        CorruptError: a part whose records differ from its PartInfo, or
            whose schema differs from the other parts'.
    """
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    root = Path(dataset)
    infos = list(infos)
    for info in infos:
        if not isinstance(info, PartInfo):
            raise TypeError(f"commit takes PartInfo objects from write_part, got {type(info).__name__}")
    root.mkdir(parents=True, exist_ok=True)
    (root / PARTS_DIR).mkdir(exist_ok=True)
    staging = root / STAGING_DIR
    with _commit_lock(root):
        old = _listed(root) if mode == "append" else []
        old_dirs = {d for d, _, _ in old}
        entries = list(old)
        moved = False
        for info in infos:
            rel = f"{PARTS_DIR}/{info.name}"
            if rel in old_dirs:
                continue  # committed before: a retried commit
            src, dst = staging / info.name, root / PARTS_DIR / info.name
            if src.is_dir() and not dst.exists():
                os.rename(src, dst)
                moved = True
            elif not dst.is_dir():
                raise ValueError(
                    f"part {info.name} is not staged in {staging}: it was never written there, or another commit "
                    "removed it; write it again"
                )
            entries.append((rel, info.records, info.content))
        if moved:
            _fsync_dir(root / PARTS_DIR)
            if staging.is_dir():
                _fsync_dir(staging)
        generation = _zring.commit_parts(str(root), entries, mode == "overwrite")
        listed = {d.split("/", 1)[1] for d, _, _ in entries}
        # Unlisted parts: those an overwrite dropped, or moved by a commit
        # that failed before its manifest.
        for child in (root / PARTS_DIR).iterdir():
            if child.name not in listed:
                shutil.rmtree(child, ignore_errors=True)
        if remove_uncommitted and staging.is_dir():
            for child in staging.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    return int(generation)

