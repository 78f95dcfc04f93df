"""Folders of files and WebDataset tar shards for :func:`zring.convert`:
one ragged uint8 store per file extension, with the files' names or the
samples' keys as its names."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from collections.abc import Sequence
from typing import Iterable, Iterator

import numpy as np

from ._zrecord import _progress
from ._sink import _Sink, _write_names


def _bytes_records(sink: _Sink, items: Iterable[bytes], block_bytes: int) -> None:
    """Appends each item as one uint8 record, in blocks of about ``block_bytes``."""
    block: list[bytes] = []
    size = 0

    def flush() -> None:
        nonlocal block, size
        if not block:
            return
        lens = np.array([len(b) for b in block], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        sink.ragged(np.frombuffer(b"".join(block), dtype=np.uint8), offsets)
        block, size = [], 0

    for b in items:
        block.append(b)
        size += len(b)
        if size >= block_bytes:
            flush()
    flush()


def _convert_folder(src: Path, dst: Path, extensions: Sequence[str] | None, codec: str, block_bytes: int,
                    progress: bool | None) -> dict[str, int]:
    wanted = {e.lower().lstrip(".") for e in extensions} if extensions else None
    rels = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in files:
            if wanted is None or f.rsplit(".", 1)[-1].lower() in wanted and "." in f:
                rels.append(os.path.relpath(os.path.join(root, f), src))
    rels.sort()
    if not rels:
        raise ValueError(f"{src} holds no files" + (f" with extensions {sorted(wanted)}" if wanted else ""))
    bar = _progress(len(rels), f"convert {src.name}", progress)
    sink = _Sink(dst, np.dtype(np.uint8), None, codec)
    ok = False
    try:
        def read() -> Iterator[bytes]:
            for r in rels:
                yield (src / r).read_bytes()
                if bar is not None:
                    bar.update(1)
        _bytes_records(sink, read(), block_bytes)
        ok = True
    finally:
        if bar is not None:
            bar.close()
        sink.close(failed=not ok)
    _write_names(dst, [r.replace(os.sep, "/") for r in rels])
    return {"": sink.records}


def _tar_files(src: Path) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.rglob("*.tar") if p.is_file())
        if not files:
            raise ValueError(f"{src} holds no .tar shards")
        return files
    return [src]


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's split of a member name: key up to the first dot of the
    file name, extension after it."""
    head, _, base = name.rpartition("/")
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return (f"{head}/{stem}" if head else stem), ext


def _samples(shards: Sequence[Path]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample, in shard order."""
    for shard in shards:
        key, sample = None, {}
        try:
            with tarfile.open(shard, mode="r|*") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    k, ext = _split_key(m.name)
                    if not ext:
                        raise ValueError(f"{shard}: member {m.name!r} has no extension, so no store to go to")
                    if k != key:
                        if key is not None:
                            yield key, sample
                        key, sample = k, {}
                    if ext in sample:
                        raise ValueError(f"{shard}: sample {k!r} has two {ext!r} members")
                    f = tf.extractfile(m)
                    sample[ext] = f.read() if f is not None else b""
        except (tarfile.TarError, EOFError) as e:
            # A shard cut short (a copy interrupted) or not a tar file: name it,
            # among the hundreds a dataset may have.
            raise ValueError(f"{shard}: not a complete tar shard ({e}); nothing was written") from e
        if key is not None:
            yield key, sample


def _convert_tar(src: Path, dst: Path, codec: str, block_bytes: int, progress: bool | None) -> dict[str, int]:
    shards = _tar_files(src)
    bar = _progress(0, f"convert {src.name}", progress)
    sinks: dict[str, _Sink] = {}
    keys: list[str] = []
    blocks: dict[str, list[bytes]] = {}
    size = 0

    def flush() -> None:
        nonlocal size
        for ext, items in blocks.items():
            _bytes_records(sinks[ext], items, block_bytes)
            items.clear()
        size = 0

    ok = False
    try:
        for key, sample in _samples(shards):
            if not sinks:
                for ext in sorted(sample):
                    if not ext.replace(".", "").replace("_", "").replace("-", "").isalnum():
                        raise ValueError(f"extension {ext!r} of sample {key!r} cannot name a store")
                    sinks[ext] = _Sink(dst / f"{ext}.zr", np.dtype(np.uint8), None, codec)
                    blocks[ext] = []
            if sample.keys() != sinks.keys():
                raise ValueError(
                    f"sample {key!r} has members {sorted(sample)}, the first sample had {sorted(sinks)}: "
                    "every sample needs the same extensions"
                )
            for ext, b in sample.items():
                blocks[ext].append(b)
                size += len(b)
            keys.append(key)
            if bar is not None:
                bar.update(1)
            if size >= block_bytes:
                flush()
        if not sinks:
            raise ValueError(f"{src} holds no samples")
        flush()
        ok = True
    finally:
        if bar is not None:
            bar.close()
        for s in sinks.values():
            s.close(failed=not ok)
    for ext in sinks:
        _write_names(dst / f"{ext}.zr", keys)
    return {ext: s.records for ext, s in sinks.items()}
