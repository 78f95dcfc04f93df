"""Importers: Parquet files, Arrow IPC files (HuggingFace ``save_to_disk``
folders), folders of files and WebDataset tar shards into zring stores
(:func:`zring.convert`, and ``zring convert`` on the command line).

Every importer streams: a Parquet file a row group at a time, Arrow files,
folders and tar shards a block of about ``block_bytes`` at a time, so memory
stays bounded whatever the source's size. Each block is handed to the engine as one
append, which compresses its records on every core. The whole destination is
built in a temporary directory beside it and renamed into place when every
store in it is complete and synced, like :func:`zring.write_dataset`, each
store's table sealed in format 2 (no entry per record for fixed-width
columns, 12 bytes a record for the others).

What each source becomes:

* Parquet (a file, or a directory of ``*.parquet`` files read in sorted
  order; needs ``pyarrow``): ``DST/<column>.zr`` per column (``columns=``
  picks some). Fixed-width numbers and booleans become a :class:`~zring.Dataset` of
  scalars; fixed-size lists (nested too) a :class:`~zring.Dataset` with that item
  shape; variable-length lists of numbers a :class:`~zring.RaggedDataset` of the
  element type; strings and binary a :class:`~zring.RaggedDataset` of uint8 (the
  UTF-8 bytes). Timestamps, dates, times and durations become int64 (int32
  for date32/time32) counts since the epoch in the column's unit, which the
  store's schema records (``unit``, ``arrow_type``); dictionary (categorical)
  columns become their values; a struct of ``bytes`` (binary) and ``path``
  (string), HuggingFace's ``Image()`` feature, becomes a
  :class:`~zring.RaggedDataset` of the encoded bytes whose names are the paths. A
  null is an error naming its column unless ``fill=`` is given: then a null
  number (or list element) becomes ``fill`` (a fill the column's type cannot
  hold exactly is an error) and a null list, string or binary an empty
  record. Any other type (other structs, maps, lists of strings) is an error;
  every such column is named in one message.
* Arrow IPC files (needs ``pyarrow``): a HuggingFace ``Dataset.save_to_disk``
  folder (its ``data-0000i-of-0000N.arrow`` files in the order its
  ``state.json`` lists them), an ``.arrow`` file, or a directory of them read
  in sorted order, in the stream format (what HuggingFace writes) or the file
  format. Each column becomes ``DST/<column>.zr`` exactly as a Parquet column
  does. A ``DatasetDict`` folder (``dataset_dict.json``, a folder per split)
  is refused with the splits named: convert one split at a time. A folder
  that holds ``save_to_disk`` folders is refused too, rather than stored as
  opaque files (``kind="folder"`` stores them so on purpose).
* A folder of files: one uint8 record per file in ``DST``, a
  :class:`~zring.RaggedDataset`, files in sorted order of their relative paths,
  which are kept (:attr:`~zring.RaggedDataset.names`); ``extensions=`` keeps only
  files with those extensions.
* WebDataset shards (a ``.tar`` file, or a directory of them read in sorted
  order): members are grouped into samples by key (the member's path up to
  the first dot of its file name) in shard order, and each extension becomes
  ``DST/<extension>.zr`` (a :class:`~zring.RaggedDataset` of uint8), record ``i`` of
  every store belonging to sample ``i``; the keys are kept in each store's
  names. A sample lacking an extension others have is an error naming it.
* A Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, named by
  its prefix or either file): one record per document in ``DST/tokens.zr``,
  a :class:`~zring.RaggedDataset` of the token dtype, byte for byte
  (:mod:`zring._megatron`). Token corpora are thus named one way whatever
  their source: ``DST/<column>.zr``, the column ``tokens`` for Megatron
  (``input_ids``, say, for a tokenized Parquet or HuggingFace dataset).
  Megatron conversions made by zring 0.2 and earlier are a store at ``DST``; they
  still open there.
* A ``.npy`` file (:func:`zring.write_dataset`) and a loaderx store
  (:func:`zring.import_loaderx`), as before.

With ``workers=N`` a folder of many input files (``train-000NN-of-000MM.parquet``
files, HuggingFace Arrow files, tar shards, Megatron-LM partitions) becomes a
dataset of parts (:mod:`zring.parts`): each file is converted into one part,
by ``N`` worker processes at once, and the parts are committed in the files'
order, ``DST`` (a single store), ``DST/<column>.zr`` (one per column or
extension) or ``DST/tokens.zr`` (Megatron-LM) each a dataset of parts read as
one dataset.

``dtype=`` (``zring convert --dtype``) stores every value of the number
columns (Parquet, Arrow) or the tokens (Megatron) as that dtype: a uint16
Megatron import as int32 beside int32 stores, say, or int64 ``input_ids`` as
int32. Widening (``np.can_cast(..., "safe")``) always works; a narrowing
cast is checked block by block, and a value it cannot hold (70000 for
uint16, 1.5 for an integer) is a ValueError naming the column or file and
the value, with nothing left at ``DST``. String, binary and image columns
keep their bytes. The source's dtype is kept in each store's schema
(``converted_from``).

Names live in a ragged store of UTF-8 bytes, ``names/`` inside the store's
directory, record ``i`` naming record ``i``: read a name at a time (a billion
names are never one list in memory), and :meth:`zring.Zrecord.delete` and
``compact`` apply to them too, so they stay aligned. Stores converted by
earlier versions keep ``names.json`` (one JSON list), still read.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _megatron
from ._zrecord import WRITE_CHUNK_BYTES, _progress, _target, write_dataset
from ._zring import import_loaderx
from ._arrow_ipc import HF_DICT, HF_INFO, HF_STATE, _arrow_files, _convert_arrow, _is_hf_dataset
from ._files import _convert_folder, _convert_tar, _tar_files
from ._parquet import _convert_parquet, _parquet_files
from ._parquet import _plan_column  # noqa: F401 (imported from this module by ray.py)
from ._sink import _Sink


# --------------------------------------------------------------------------
# One part per input file (workers=)
# --------------------------------------------------------------------------

def _megatron_prefixes(src: Path) -> list[Path]:
    """The prefixes of the Megatron-LM datasets (``PREFIX.bin`` + ``PREFIX.idx``)
    in directory ``src`` (its partitions), in sorted order; ``[]`` when it
    holds anything else."""
    files = [p for p in src.rglob("*") if p.is_file()]
    if not files or any(p.suffix.lower() not in (".bin", ".idx") for p in files):
        return []
    prefixes = sorted({p.with_suffix("") for p in files})
    if any(_megatron.paths(p) is None for p in prefixes):
        return []
    return prefixes


def _input_files(src: Path, kind: str) -> list[Path]:
    """The input files of ``src``, one part each, in order."""
    if kind == "parquet":
        return _parquet_files(src)
    if kind == "arrow":
        return _arrow_files(src)
    if kind == "tar":
        return _tar_files(src)
    if kind == "megatron":
        return _megatron_prefixes(src) if src.is_dir() else [src]
    raise ValueError(
        f"workers= writes one part per input file of Parquet, Arrow, tar or Megatron-LM files; {src} is a "
        f"{kind} source, which converts into one store: leave workers= out"
    )


def _convert_file(kind: str, src: str, where: str, columns: Sequence[str] | None, fill: Any, codec: str,
                  block_bytes: int, cast: np.dtype | None = None) -> dict[str, tuple[Any, str | None]]:
    """Converts input file ``src`` as :func:`convert` would, then stages each
    of its stores as a part of its dataset under ``where`` (``where`` itself
    for a single store, ``where/<column>.zr`` per column); returns
    ``{column: (PartInfo, schema)}``. Runs in a worker process."""
    from . import parts

    import shutil
    import uuid

    root, file = Path(where), Path(src)
    work = root / f".convert-{uuid.uuid4().hex}"
    work.mkdir()
    try:
        out = work / "out"
        if kind == "parquet":
            counts = _convert_parquet(file, out, columns, fill, codec, False, cast)
        elif kind == "arrow":
            counts = _convert_arrow(file, out, columns, fill, codec, block_bytes, False, cast)
        elif kind == "tar":
            counts = _convert_tar(file, out, codec, block_bytes, False)
        else:
            counts = _megatron.convert(file, out, codec, block_bytes, False, _Sink, _progress, cast, counts=False)
        staged = {}
        for name in counts:
            if name:
                staged[name] = parts._stage(root / f"{name}.zr", out / f"{name}.zr")
            else:
                staged[name] = parts._stage(root, out)
        return staged
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops handing out files and
    removes what was written (one traceback, not one per worker)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _convert_parts(kind: str, src: Path, where: Path, workers: int, columns: Sequence[str] | None, fill: Any,
                   codec: str, block_bytes: int, progress: bool | None, cast: np.dtype | None = None) -> dict[str, int]:
    """One part per input file of ``src``, converted by ``workers`` processes
    (this one when 1) and committed, in the files' order, as a dataset of
    parts per store (module docs)."""
    from . import parts

    files = _input_files(src, kind)
    args = (columns, fill, codec, block_bytes, cast)
    bar = _progress(len(files), f"convert {src.name}", progress)
    results: list[dict[str, tuple[Any, str | None]]] = []
    try:
        if workers == 1:
            for f in files:
                results.append(_convert_file(kind, str(f), str(where), *args))
                if bar is not None:
                    bar.update(1)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # Spawned, not forked: the parent may hold pyarrow's and the
            # engine's threads.
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(min(workers, len(files)), mp_context=ctx, initializer=_ignore_sigint) as pool:
                futures = [pool.submit(_convert_file, kind, str(f), str(where), *args) for f in files]
                try:
                    for fut in futures:
                        results.append(fut.result())
                        if bar is not None:
                            bar.update(1)
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
    finally:
        if bar is not None:
            bar.close()
    first = results[0]
    for f, r in zip(files, results):
        if r.keys() != first.keys():
            raise ValueError(f"{f} converts into stores {sorted(r)}, {files[0]} into {sorted(first)}: every input "
                             f"file needs the same columns")
        for name, (_info, schema) in r.items():
            if schema != first[name][1]:
                raise ValueError(f"{f} has another schema than {files[0]}" + (f" (column {name!r})" if name else ""))
    counts = {}
    for name in first:
        root = where / f"{name}.zr" if name else where
        infos = [r[name][0] for r in results]
        parts.commit(root, infos, mode="overwrite")
        counts[name] = sum(i.records for i in infos)
    return counts


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

#: The kinds of source :func:`zring.convert` reads.
KINDS = ("parquet", "arrow", "folder", "tar", "npy", "loaderx", "megatron")


def _hf_folders(src: Path) -> list[Path]:
    """The HuggingFace ``save_to_disk`` folders (of a split, or of a
    ``DatasetDict``) at or under ``src``."""
    found = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        if HF_DICT in files or (HF_STATE in files and HF_INFO in files):
            found.append(Path(root))
    return found


def _kind(src: Path) -> str:
    if _megatron.paths(src) is not None:
        return "megatron"
    half = _megatron.describe(src)
    if half:
        raise ValueError(half)
    if src.is_file():
        suffix = src.suffix.lower()
        if suffix == ".npy":
            return "npy"
        if suffix == ".parquet":
            return "parquet"
        if suffix == ".tar":
            return "tar"
        if suffix == ".arrow":
            return "arrow"
        raise ValueError(f"cannot convert {src}: expected a .npy, .parquet, .arrow or .tar file, or a directory")
    if src.is_dir():
        if (src / "meta.zr").is_file():
            return "loaderx"
        if (src / HF_DICT).is_file():
            splits = sorted(p.name for p in src.iterdir() if p.is_dir() and _is_hf_dataset(p))
            raise ValueError(
                f"{src} is a HuggingFace DatasetDict saved with save_to_disk (splits {splits}); convert one "
                f"split's folder at a time, such as {src / (splits[0] if splits else 'train')}"
            )
        if _is_hf_dataset(src):
            return "arrow"
        entries = [p for p in src.rglob("*") if p.is_file()]
        if _megatron_prefixes(src):
            return "megatron"
        if entries and all(p.suffix.lower() == ".parquet" for p in entries):
            return "parquet"
        if entries and all(p.suffix.lower() == ".tar" for p in entries):
            return "tar"
        if entries and all(p.suffix.lower() == ".arrow" for p in entries):
            return "arrow"
        nested = _hf_folders(src)
        if nested:
            # Its Arrow files stored as opaque byte records would convert
            # "successfully" into something no one can read as the dataset.
            raise ValueError(
                f"{src} holds HuggingFace save_to_disk folders ({', '.join(str(p) for p in nested[:3])}"
                f"{', ...' if len(nested) > 3 else ''}); convert each of them, or pass kind='folder' to store "
                f"every file as a byte record"
            )
        return "folder"
    raise FileNotFoundError(f"{src} does not exist")


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, columns: Sequence[str] | None = None,
            fill: Any = None, extensions: Sequence[str] | None = None, codec: str = "zstd",
            kind: str | None = None, overwrite: bool = False, block_bytes: int = WRITE_CHUNK_BYTES,
            progress: bool | None = None, workers: int | None = None, dtype: Any = None) -> dict[str, int]:
    """Converts ``src`` into zring stores at ``dst`` (what each source
    becomes: the "Converting datasets" page, ``docs/convert.rst``); returns
    the records written per store: ``{column: n}`` for ``DST/<column>.zr``
    (``{"tokens": n}`` for Megatron), ``{"": n}`` for a single store at
    ``dst``.

    Args:
        src: A ``.parquet`` file or a directory of them, a HuggingFace
            ``save_to_disk`` folder or ``.arrow`` (Arrow IPC) files, a folder
            of files, a ``.tar`` shard or a directory of them, a ``.npy``
            file, a loaderx store, or a Megatron-LM indexed dataset (its
            prefix, or its ``.idx`` or ``.bin`` file). ``kind`` overrides the
            guess (``"parquet"``, ``"arrow"``, ``"folder"``, ``"tar"``,
            ``"npy"``, ``"loaderx"``, ``"megatron"``).
        dst: The store (``.npy``, loaderx, folder) or the directory of
            stores (Parquet and Arrow: ``DST/<column>.zr`` per column; tar:
            one per extension; Megatron: ``DST/tokens.zr``) to create.
        columns: Parquet or Arrow columns to convert (default: all).
        fill: What a null becomes (default: a null is an error); a value the
            column's type cannot hold exactly (1.5 in an integer column, -1 in
            an unsigned one) is a ValueError.
        extensions: Folder files to keep, by extension (default: all).
        codec: ``"zstd"`` (default), ``"raw"`` or ``"zstd_dict"`` is not
            offered here (a dictionary needs a sample of the whole column).
        overwrite: Replace an existing ``dst``.
        block_bytes: Bytes handed to one append (folders, tar, Arrow).
        progress: Show a tqdm bar; by default only when stderr is a terminal.
        workers: Write one part per input file (a Parquet, Arrow or tar
            file, or a Megatron-LM dataset of a folder of them, such as
            ``train-000NN-of-000MM.parquet`` files or Megatron partitions),
            converted by this many worker processes, and commit them in the
            files' order: ``dst`` (or ``dst/<column>.zr`` per column) is then
            a dataset of parts (:mod:`zring.parts`), read as one dataset by
            :class:`Dataset` and :class:`RaggedDataset`. Every file must
            convert into the same columns of the same dtypes and shapes.
            Default: one store, the files converted in order by this process.
        dtype: Store the number columns (Parquet, Arrow) or the tokens
            (Megatron) as this NumPy dtype: widening always, narrowing only
            if every value fits (a value that does not is a ValueError).

    Raises:
        FileExistsError: ``dst`` exists and ``overwrite`` is not set, or it
            is set and ``dst`` is not a store, a directory of stores or an
            empty directory (nothing is removed).
        ValueError: A column or member that cannot be mapped, a null without
            ``fill``, a sample missing an extension, an unknown ``kind``, a
            HuggingFace ``DatasetDict`` folder (convert one split's folder),
            a folder holding ``save_to_disk`` folders (unless
            ``kind="folder"``), or a ``dtype`` that is not numeric, is given
            for another kind of source, or cannot hold a value.
        ImportError: A Parquet or Arrow source without pyarrow installed.
    """
    src, dst = Path(src), Path(dst)
    if codec not in ("zstd", "raw"):
        raise ValueError(f"codec must be 'zstd' or 'raw' for convert, got {codec!r}")
    if int(block_bytes) <= 0:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    kind = kind or _kind(src)
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    cast = None
    if dtype is not None:
        try:
            cast = np.dtype(dtype).newbyteorder("<")
        except TypeError as e:
            raise ValueError(f"dtype={dtype!r} is not a NumPy dtype ({e})") from None
        if cast.kind not in "biuf":
            raise ValueError(f"dtype={dtype!r} is not a numeric dtype (int32, uint16, float32, ...)")
        if kind not in ("parquet", "arrow", "megatron"):
            raise ValueError(
                f"dtype={cast} casts Parquet and Arrow number columns and Megatron tokens only; a {kind} source "
                f"is stored as it is"
            )
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers= must be a positive number of processes, got {workers!r}")
    if kind == "megatron" and workers is None and src.is_dir():
        found = _megatron_prefixes(src)
        raise ValueError(
            f"{src} holds {len(found)} Megatron-LM datasets (partitions); pass workers=N to write one part "
            f"per dataset, or convert one prefix, such as {found[0] if found else src / 'PREFIX'}"
        )
    if workers is not None:
        _input_files(src, kind)  # a ValueError for a kind that is not in files
        if os.path.lexists(dst) and not overwrite:
            raise FileExistsError(f"{dst} already exists; pass overwrite=True to replace it")
        with _target(dst, overwrite, False) as where:
            return _convert_parts(kind, src, where, int(workers), columns, fill, codec, int(block_bytes), progress,
                                  cast)
    if os.path.lexists(dst) and not overwrite:
        # Said here rather than by the writers convert builds on, whose
        # message offers an append convert does not have.
        raise FileExistsError(f"{dst} already exists; pass overwrite=True to replace it")
    if kind == "npy":
        n = write_dataset(dst, np.load(src, mmap_mode="r"), codec=codec, overwrite=overwrite, progress=progress)
        return {"": n}
    with _target(dst, overwrite, False) as where:
        if kind == "loaderx":
            # Built in the (empty) staging directory, which the engine holds
            # by descriptor.
            stats = import_loaderx(str(src), str(where))
            return {"": int(stats["records"])}
        if kind == "parquet":
            return _convert_parquet(src, where, columns, fill, codec, progress, cast)
        if kind == "arrow":
            return _convert_arrow(src, where, columns, fill, codec, int(block_bytes), progress, cast)
        if kind == "folder":
            return _convert_folder(src, where, extensions, codec, int(block_bytes), progress)
        if kind == "megatron":
            return _megatron.convert(src, where, codec, int(block_bytes), progress, _Sink, _progress, cast)
        return _convert_tar(src, where, codec, int(block_bytes), progress)
