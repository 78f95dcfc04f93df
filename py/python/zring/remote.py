"""Datasets in object storage (S3, GCS, Azure Blob): read through a
per-host cache on local disk, written from a cluster.

A dataset in a bucket is laid out as on a local disk: a single store's
files, or a dataset of parts (``manifest.json`` and ``parts/p-.../``).
Reading one stages the host's share into a cache folder (``cache=``) laid
out the same way, which the engine then reads as any local dataset, with
io_uring at the local disk's rate::

    ds = zring.Dataset("s3://corpus/tokens", cache="nvme-cache",
                       rank_parts=(rank, ranks))

Only the parts of ``rank_parts`` (and the manifest) are fetched, in 8 MiB
ranged GETs, 16 in flight, each with ``If-Match`` on the ETag the listing
gave (an object replaced during the fetch is a :class:`zring.StaleError`,
never a mix of versions). The processes of a host share one cache: they
stage a share in turn, each object is fetched once, and a share staged
before is reused as it is (objects whose ETag changed in the bucket are
fetched again; a dataset grown by appends fetches only the new parts).
Each rank's share has a folder of its own in the cache.

``cache_disk_bytes`` caps the cache folder; datasets no process has open
are removed, least recently staged first, to make room. A single store
larger than the cap is refused with the bytes it needs. A dataset of parts
whose share is larger than the cap is staged lazily: its tables and heads
whole, its chunk files as holes filled line by line (256 KiB lines,
neighbours fetched as one GET of up to 8 MiB) as they are read, evicting
the lines a mode-3 loader needs furthest in the future (the loader hands
the cache its windows to the end of the next cycle), so a cycle after the
first fetches about ``1 - cap/share`` of the share, and the blocks the
cache holds never pass the cap. Such a dataset is read in mode 3: modes 1
and 2 draw any record at any step and are refused.

Credentials come from the environment and the instance or web-identity
chains, as ``object_store`` reads them (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_NAME``, ...); ``storage_options`` passes the
store's configuration keys (``aws_endpoint``, ``aws_region``, ...) and the
tier's own: ``timeout`` (seconds per request, default 30),
``connect_timeout`` (5), ``max_retries`` (10), ``retry_timeout``
(120: a request and its retries end with an error naming the object and
range by then), ``cache_line_bytes`` (262144) and ``cache_eviction``
(``"next_use"``, or ``"lru"`` to compare). ``"credentials"`` may be a
callable that returns a dict of ``key_id``, ``secret_key`` and optionally
``token`` and ``expires_in`` (seconds): it signs s3:// requests and is
called again a tenth of the lifetime (at most a minute) before they expire,
so a run outlives any one set (profiles, SSO, a vault: what the callable
reads; object_store alone reads the environment and instance chains). Throttling (503, 429, SlowDown) and cut connections are
retried with exponential backoff.

:func:`zring.ray.write` writes to a URL: each task uploads its part under
``parts/``, and the driver commits with a conditional write of the
manifest, so concurrent committers never lose each other's parts and a
failed job leaves nothing listed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import _util
from . import _zring

__all__ = ["is_url", "stage", "upload", "options"]

_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "azure://", "file://")


def is_url(path: Any) -> bool:
    """Whether ``path`` is an object-storage URL rather than a local path."""
    return isinstance(path, str) and path.startswith(_SCHEMES)


def _available() -> None:
    if not hasattr(_zring, "stage"):
        raise RuntimeError("this build of zring has no object-storage tier (built without the 'remote' feature)")


#: The credentials callables of ``storage_options`` in this process, by
#: the id their option carries to the extension.
_CREDENTIALS: dict[int, Any] = {}


def options(storage_options: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """``storage_options`` checked: a mapping of option names to strings
    (numbers and bools are written as strings). ``"credentials"`` may be a
    callable returning a dict of ``key_id``, ``secret_key`` and optionally
    ``token`` and ``expires_in`` (seconds): it signs s3:// requests, and is
    called again before the credentials it gave expire (AWS profiles, SSO,
    a vault: whatever the callable reads)."""
    if storage_options is None:
        return []
    if not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict of option names to values, got "
                        f"{type(storage_options).__name__}")
    out = []
    for k, v in storage_options.items():
        if not isinstance(k, str):
            raise TypeError(f"storage_options keys are option names (str), got {k!r}")
        if k == "credentials":
            if not callable(v):
                raise TypeError(f"storage_options['credentials'] must be a callable returning a dict of key_id, "
                                f"secret_key, token and expires_in, got {type(v).__name__}")
            _CREDENTIALS[id(v)] = v
            out.append((k, str(id(v))))
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        if not isinstance(v, (str, int, float)):
            raise TypeError(f"storage_options[{k!r}] must be a string, got {type(v).__name__}")
        out.append((k, str(v)))
    return out


def decoded_bytes(store: str | os.PathLike[str]) -> int:
    """The decoded bytes of the records of the local store at ``store`` (what
    a manifest records for each part, and ranks are balanced by)."""
    with _zring.Store(os.fspath(store), "r") as s:
        return int(s.stats()["logical_bytes"])


def stage(url: str, cache: str | os.PathLike[str], *, rank: int | None = None, ranks: int | None = None,
          cache_bytes: int | None = None, storage_options: Mapping[str, Any] | None = None,
          progress: bool = False) -> dict[str, Any]:
    """Copy the dataset at ``url`` (or rank ``rank`` of ``ranks``'s share of
    a dataset of parts) into the cache folder ``cache``, before a run or
    from the CLI (``zring stage``). Returns what was done: ``path`` (the
    local copy), ``share_bytes``, ``fetched_bytes``, ``fetched_objects``,
    ``reused_objects``, ``removed_bytes``, ``requests``.

    Raises:
        ValueError: the share is larger than ``cache_bytes`` (the message
            names the bytes needed), or a bad argument.
        FileNotFoundError: no dataset at ``url``, or a listed part is missing.
        StaleError: an object was replaced while it was fetched.
        TimeoutError: the server did not answer within the retry deadline.
    """
    _available()
    if not is_url(url):
        raise ValueError(f"{url!r} is not an object-storage URL (s3://, gs://, az:// or file://)")
    if (rank is None) != (ranks is None):
        raise ValueError("give rank and ranks together (or neither, for the whole dataset)")
    pair = None
    if ranks is not None:
        r = _util.integer(rank, "rank", 0, _util.U32_MAX)
        n = _util.integer(ranks, "ranks", 1, _util.U32_MAX)
        if r >= n:
            raise ValueError(f"rank={r} of ranks={n}: need 0 <= rank < ranks")
        pair = (r, n)
    cap = None if cache_bytes is None else _util.integer(cache_bytes, "cache_bytes", 1, 2**63 - 1)
    report = None
    if progress:
        def report(done: int, total: int) -> None:
            pct = 100.0 * done / total if total else 100.0
            print(f"\r  fetched {done / 2**20:9.1f} of {total / 2**20:.1f} MiB ({pct:5.1f} %)", end="",
                  file=sys.stderr, flush=True)
    try:
        out = dict(_zring.stage(url, os.fspath(cache), options(storage_options), pair, cap, report))
    except ValueError as e:
        raise ValueError(_speak(str(e), "cache_bytes")) from None
    if progress:
        print(file=sys.stderr)
    return out


def _speak(message: str, cap: str) -> str:
    """The tier's message about its cap, naming the argument ``cap``."""
    import re

    return re.sub(r"the cache's cap of (\d+) B", rf"{cap}=\1", message).replace("raise the cap", f"raise {cap}")


def _open_local(url: str, cache: Any, rank_parts: tuple[int, int] | None, cache_disk_bytes: int | None,
                storage_options: Mapping[str, Any] | None) -> tuple[Path, Any, tuple[int, int] | None]:
    """What ``Dataset(url, cache=...)`` opens: the staged share, held so no
    other process's stage evicts it while open, and ``(share bytes, cap)``
    when the share is larger than the cap and was staged lazily (its chunk
    files to be filled line by line), else None."""
    _available()
    if cache is None:
        raise ValueError(f"reading {url} needs cache=, a folder on local disk to stage it in (and "
                         f"cache_disk_bytes= to cap it)")
    rank, ranks = rank_parts if rank_parts is not None else (None, None)
    lazy = None
    try:
        done = stage(url, cache, rank=rank, ranks=ranks, cache_bytes=cache_disk_bytes,
                     storage_options=storage_options)
    except ValueError as e:
        over = "raise cache_bytes to at least" in str(e)
        parts_there = over and _zring.stat_object(url, options(storage_options), "manifest.json") is not None
        if not parts_there:
            raise ValueError(str(e).replace("cache_bytes", "cache_disk_bytes")) from None
        # A dataset of parts larger than the cap: read line by line (mode 3).
        pair = None if rank is None else (rank, ranks)
        try:
            done = dict(_zring.stage(url, os.fspath(cache), options(storage_options), pair, cache_disk_bytes,
                                     None, True))
        except ValueError as e2:
            raise ValueError(_speak(str(e2), "cache_disk_bytes")) from None
        lazy = (int(done["share_bytes"]), int(cache_disk_bytes))
    hold = _zring.CacheHold(os.fspath(cache), url, None if rank is None else (rank, ranks))
    return Path(done["path"]), hold, lazy


def upload(local: str | os.PathLike[str], url: str, *, storage_options: Mapping[str, Any] | None = None) -> int:
    """Copy the local dataset ``local`` (a store, or a dataset of parts) to
    ``url``; returns the bytes uploaded. A dataset of parts is uploaded part
    by part and committed with a conditional write of the manifest: over a
    dataset of parts at ``url`` already, its parts are appended (parts with
    the same name listed already are not listed twice)."""
    import json

    from . import parts as _parts

    _available()
    local = Path(local)
    opts = options(storage_options)
    if not (local / _parts.MANIFEST).is_file():
        return int(_zring.upload_store(url, opts, os.fspath(local)))
    schema = _zring.manifest_schema(os.fspath(local))
    schema = None if schema is None else (schema if isinstance(schema, str) else json.dumps(schema))
    sent, new = 0, []
    for p in _parts.list_parts(local):
        name = p["dir"].split("/", 1)[1]
        sent += int(_zring.upload_part(url, opts, os.fspath(local / p["dir"]), name))
        new.append((name, int(p["records"]), str(p["content"]), schema, decoded_bytes(local / p["dir"])))
    _zring.commit(url, opts, new, False)
    return sent
