"""zring: a persistent record store and endless step-based data loader.

A drop-in for loaderx 0.7.3 (``import zring as loaderx``): the same
``write_dataset``/``Dataset``/``RaggedDataset``/``pad``/``DataLoader``/
``Zrecord`` API, on a Rust engine. Extras: exact resume (``DataLoader(...,
state=...)``, ``DataLoader.state()``), sharding, ``stats()``, ``verify()``,
a typed exception hierarchy under :class:`ZringError`, importers from
Parquet, folders of files and WebDataset shards (:func:`convert`), packed
token rows for language models (:func:`pack`), train/validation/test
splits by document (:func:`split`), and the
``zring`` command.
"""

from ._zring import (
    __version__,
    ChecksumError,
    CorruptError,
    LockedError,
    NotAStoreError,
    PoisonedError,
    StaleError,
    Store,
    UnsupportedVersionError,
    ZringError,
    import_loaderx,
    set_cache_bytes,
)
from ._sampler import Sampler
from ._zrecord import Zrecord, ZrecordError, write_dataset, write_ragged
from ._convert import convert
from ._mix import Mixture, mix
from ._schedule import Schedule, schedule
from ._pack import Packed, pack
from ._curriculum import CurriculumLoader, Ramp, ramp, rampup_batch_size
from ._split import SplitDataset, SplitRaggedDataset, split
from .dataloader import DataLoader
from .dataset import Dataset, RaggedDataset, pad
from . import parts
from . import elastic

__all__ = [
    "ChecksumError",
    "CorruptError",
    "CurriculumLoader",
    "DataLoader",
    "Dataset",
    "LockedError",
    "Mixture",
    "NotAStoreError",
    "Packed",
    "PoisonedError",
    "StaleError",
    "RaggedDataset",
    "Ramp",
    "Sampler",
    "Schedule",
    "Store",
    "UnsupportedVersionError",
    "Zrecord",
    "ZrecordError",
    "ZringError",
    "convert",
    "import_loaderx",
    "mix",
    "pack",
    "pad",
    "ramp",
    "rampup_batch_size",
    "schedule",
    "parts",
    "elastic",
    "set_cache_bytes",
    "split",
    "write_dataset",
    "write_ragged",
]
