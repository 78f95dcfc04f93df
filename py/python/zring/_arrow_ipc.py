"""Arrow IPC sources for :func:`zring.convert`: HuggingFace ``save_to_disk``
folders and ``.arrow`` files (stream or file format), their columns stored
as Parquet columns are."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Iterator

import numpy as np

from ._parquet import _convert_columns, _plan, _pyarrow


#: What HuggingFace's ``Dataset.save_to_disk`` writes beside its Arrow files.
HF_STATE = "state.json"
HF_INFO = "dataset_info.json"
#: What ``DatasetDict.save_to_disk`` writes beside one folder per split.
HF_DICT = "dataset_dict.json"


def _is_hf_dataset(d: Path) -> bool:
    """Whether directory ``d`` is a HuggingFace ``save_to_disk`` folder of one split."""
    return (d / HF_STATE).is_file() and (d / HF_INFO).is_file()


def _arrow_files(src: Path) -> list[Path]:
    """The Arrow IPC files of ``src`` in row order: a file; a ``save_to_disk``
    folder's data files in the order its ``state.json`` lists them (sorted
    ``*.arrow`` names when it lists none); or a directory's ``*.arrow`` files
    in sorted order."""
    if not src.is_dir():
        return [src]
    listed: list[Path] = []
    if (src / HF_STATE).is_file():
        try:
            state = json.loads((src / HF_STATE).read_text(encoding="utf-8"))
            listed = [src / f["filename"] for f in state.get("_data_files", [])]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{src / HF_STATE} is not the state.json of a HuggingFace save_to_disk folder "
                             f"({type(e).__name__}: {e})") from None
        absent = [str(p) for p in listed if not p.is_file()]
        if absent:
            raise ValueError(f"{src / HF_STATE} lists data files that are missing: {absent}")
    files = listed or sorted(p for p in src.rglob("*.arrow") if p.is_file())
    if not files:
        raise ValueError(f"{src} holds no .arrow files")
    return files


def _ipc_reader(pa: Any, f: Path) -> Any:
    """A reader of Arrow IPC file ``f``: the stream format (what HuggingFace
    writes) or the file format, memory-mapped so batches are read without
    copies; a ValueError naming ``f`` when it is neither."""
    import pyarrow.ipc as ipc

    source = pa.memory_map(str(f))
    try:
        try:
            return ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            return ipc.open_file(source)
    except pa.ArrowInvalid as e:
        source.close()
        raise ValueError(f"{f} is not an Arrow IPC stream or file ({e})") from None


def _ipc_batches(pa: Any, f: Path) -> Iterator[Any]:
    """The record batches of Arrow IPC file ``f``, in order."""
    reader = _ipc_reader(pa, f)
    try:
        if hasattr(reader, "get_batch"):  # the file format
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
        else:
            yield from reader
    except (pa.ArrowInvalid, OSError) as e:
        # A file cut short (a copy interrupted; pyarrow reports a short
        # message body as an OSError): name it among the shards.
        raise ValueError(f"{f}: not a complete Arrow IPC file ({e}); nothing was written") from e


def _arrow_tables(pa: Any, files: Sequence[Path], schema: Any, names: Sequence[str],
                  block_bytes: int) -> Iterator[Any]:
    """Tables of about ``block_bytes`` (columns ``names``, one chunk each)
    from the record batches of ``files`` in order. HuggingFace writes batches
    of 1,000 rows; gathering them makes each append big enough to spread its
    compression over every core."""
    block: list[Any] = []
    size = 0
    for f in files:
        for batch in _ipc_batches(pa, f):
            if batch.schema.names != schema.names or any(
                    batch.schema.field(c).type != schema.field(c).type for c in names):
                raise ValueError(f"{f} has another schema than {files[0]}")
            batch = batch.select(list(names))
            block.append(batch)
            size += batch.nbytes
            if size >= block_bytes:
                yield pa.Table.from_batches(block).combine_chunks()
                block, size = [], 0
    if block:
        yield pa.Table.from_batches(block).combine_chunks()


def _convert_arrow(src: Path, dst: Path, columns: Sequence[str] | None, fill: Any, codec: str, block_bytes: int,
                   progress: bool | None, cast: np.dtype | None = None) -> dict[str, int]:
    pa, _ = _pyarrow()
    files = _arrow_files(src)
    schema = _ipc_reader(pa, files[0]).schema
    names, sources, plans = _plan(pa, schema, files[0], columns)
    # Memory-mapped: counting rows reads message headers, not the data.
    total = sum(b.num_rows for f in files for b in _ipc_batches(pa, f))
    return _convert_columns(pa, src, dst, sources, plans, _arrow_tables(pa, files, schema, names, block_bytes),
                            total, fill, codec, progress, cast)
