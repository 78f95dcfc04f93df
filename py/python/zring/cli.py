"""The ``zring`` command: inspect, check, convert, compact and benchmark stores.

    zring info PATH
    zring verify PATH
    zring parts PATH [--ranks N [--rank K]]
    zring convert SRC DST [--codec zstd] [--chunk-bytes N] [--columns A,B] [--fill X] [--kind K] [--dtype D] [--overwrite]
                  [--workers N]
    zring compact PATH [--format {1,2}]
    zring bench PATH [--batch-size 256] [--batches 200] [--seed 0] [--cache-bytes N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import _schema
from ._zring import Parts, Store, ZringError
from ._convert import KINDS, convert
from ._zrecord import WRITE_CHUNK_BYTES


def _disk_bytes(path: Path) -> int:
    """Bytes allocated on disk by every file under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def _describe_schema(text: str | None) -> tuple[str, str, str]:
    if text is None:
        return "raw records (no schema.json)", "-", "-"
    try:
        schema = json.loads(text)
    except json.JSONDecodeError:
        return "unreadable schema.json", "-", "-"
    try:
        dtype = str(_schema.decode_dtype(schema))
    except (TypeError, ValueError, KeyError):
        dtype = schema.get("dtype_name") or schema.get("dtype", "?")
    if schema.get("ragged"):
        return "ragged dataset", str(dtype), f"(rows, {', '.join(map(str, schema.get('item_shape', [])))})"
    return "dataset", str(dtype), str(tuple(schema.get("shape", [])))


def _open(path: str, ranks: int | None = None, rank: int | None = None) -> Any:
    """A read-only handle on the store, or on the dataset of parts (rank
    ``rank`` of ``ranks``'s share of it, when given), at ``path``."""
    if (Path(path) / "manifest.json").is_file():
        return Parts(path, rank_parts=None if rank is None else (rank, ranks))
    if rank is not None:
        raise ValueError(f"--ranks/--rank read a dataset of parts; {path} has no manifest.json")
    return Store(path, "r")


def _rank_args(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--ranks``/``--rank``, or None."""
    if args.rank is None and args.ranks is None:
        return None
    if args.rank is None or args.ranks is None:
        return "give --ranks N and --rank K together (rank K of N ranks' share)"
    if args.ranks < 1 or not 0 <= args.rank < args.ranks:
        return f"--rank {args.rank} is not one of --ranks {args.ranks} (0 to {max(args.ranks - 1, 0)})"
    return None


def _present_parts(path: Path) -> set[str]:
    """The manifest's part directories present in the folder."""
    manifest = json.loads((path / "manifest.json").read_text())
    return {p["dir"] for p in manifest.get("parts", []) if (path / p["dir"]).is_dir()}


def _whose_folder(path: Path, ranks: int | None) -> str | None:
    """When the folder holds some of a dataset's parts and not all: whose
    share it holds (rank R of N, trying N = ``ranks``, else 2 to 1024), or
    None when it holds all of them or matches no rank."""
    from .parts import rank_plan

    if not (path / "manifest.json").is_file():
        return None
    try:
        present = _present_parts(path)
        plan = rank_plan(path, 1)[0]
    except (OSError, ValueError, ZringError):
        return None
    if len(present) == len(plan):
        return None
    for n in ([ranks] if ranks else range(2, 1025)):
        if n > len(plan) and ranks is None:
            break
        for r, dirs in enumerate(rank_plan(path, n)):
            if set(dirs) == present:
                return (f"{path} holds rank {r} of {n}'s parts ({len(present)} of {len(plan)}): "
                        f"run with --ranks {n} --rank {r}")
    return None


def _tokens(schema_text: str | None, logical: int) -> int | None:
    """Rows of a ragged dataset (tokens, for a token store), from its
    logical bytes; None for other stores."""
    try:
        schema = json.loads(schema_text or "{}")
        if not schema.get("ragged"):
            return None
        row = _schema.decode_dtype(schema).itemsize * int(np.prod(schema.get("item_shape", []) or [1]))
        return logical // row if row else None
    except (TypeError, ValueError, KeyError):
        return None


def _open_or_explain(args: argparse.Namespace) -> Any:
    """The handle of ``args``' store or share; None after printing why it
    cannot be opened (a rank's parts missing, naming whose the folder holds)."""
    bad = _rank_args(args)
    if bad:
        print(bad, file=sys.stderr)
        return None
    try:
        return _open(args.path, args.ranks, args.rank)
    except (ZringError, OSError, ValueError) as exc:
        if not (Path(args.path) / "manifest.json").is_file():
            raise  # main() names the store, or the stores a folder holds
        whose = _whose_folder(Path(args.path), args.ranks)
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        if whose:
            print(whose, file=sys.stderr)
        return None


def cmd_info(args: argparse.Namespace) -> int:
    handle = _open_or_explain(args)
    if handle is None:
        return 1
    with handle as store:
        stats = store.stats()
        reads = store.read_stats()
        kind, dtype, shape = _describe_schema(store.schema())
        codec = json.loads(store.schema() or "{}").get("codec", "-")
        whole = None
        if args.rank is not None:
            listed = store.parts_list()
            whole = (stats["parts"], len(_whole_plan(Path(args.path))), sum(p["records"] for p in listed))
        schema_text = store.schema()
    logical = stats.get("logical_bytes", stats.get("live_bytes", 0))
    # A rank's share is the parts it holds; the folder may hold others' too.
    disk = _disk_bytes(Path(args.path)) if whole is None else stats.get("chunk_bytes", 0)
    print(f"path          {args.path}")
    print(f"kind          {kind}")
    if whole is not None:
        print(f"parts         {whole[0]} of {whole[1]}: rank {args.rank} of {args.ranks}'s share "
              f"(manifest generation {stats['generation']})")
    elif "parts" in stats:
        print(f"parts         {stats['parts']} (manifest generation {stats['generation']})")
        whose = _whose_folder(Path(args.path), None)
        if whose:
            print(f"note          {whose}")
    print(f"records       {stats.get('records', 0)}")
    tokens = _tokens(schema_text, logical)
    if tokens is not None:
        print(f"rows (tokens) {tokens}")
    print(f"codec         {codec}")
    print(f"dtype         {dtype}")
    print(f"sample shape  {shape}")
    print(f"logical size  {_human(logical)}")
    print(f"on disk       {_human(disk)}" + (" (its chunk files)" if whole is not None else ""))
    print(f"ratio         {logical / disk:.2f}x" if disk else "ratio         -")
    print(f"reclaimable   {_human(stats.get('reclaimable', 0))}")
    print(f"dictionary    {'yes' if stats.get('has_dict') else 'no'}")
    print(f"memory budget {_human(reads['budget_bytes'])} ({reads['budget_source']})")
    print(f"read policy   {reads['policy']}: {reads['policy_reason']}")
    return 0


def _print_reads(r: dict) -> None:
    print(f"read policy: {r['policy']} ({r['policy_reason']})")
    print(f"reads: {r['records']:,} records, hit rate {r['hit_rate']:.1%} "
          f"(record cache {r['cache_hits']:,}, page cache {r['page_cache_hits']:,}); "
          f"from disk or buffered reads {_human(r['bytes_read'])}, from the record cache "
          f"{_human(r['bytes_from_cache'])}, from the page cache {_human(r['bytes_from_page_cache'])}; "
          f"record cache holds {_human(r['cache_held'])} of {_human(r['cache_capacity'])}")


def _whole_plan(path: Path) -> list[str]:
    from .parts import rank_plan

    return rank_plan(path, 1)[0]


def cmd_verify(args: argparse.Namespace) -> int:
    # Opening a dataset of parts checks each part against its manifest.
    handle = _open_or_explain(args)
    if handle is None:
        return 1
    with handle as store:
        try:
            report = store.verify()
        except ZringError as exc:
            print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print("ok: " + ", ".join(f"{k}={v}" for k, v in report.items()))
    return 0


def cmd_parts(args: argparse.Namespace) -> int:
    from .parts import rank_plan

    if args.rank is not None and not 0 <= args.rank < args.ranks:
        print(f"--rank {args.rank} is not one of --ranks {args.ranks} (0 to {args.ranks - 1})", file=sys.stderr)
        return 2
    plan = rank_plan(args.path, args.ranks)
    if args.rank is not None:
        # What rank K's host needs, one path a line relative to the dataset:
        # a list for rsync --files-from (or an object-store copy).
        print("manifest.json")
        for d in plan[args.rank]:
            print(d)
        return 0
    for rank, dirs in enumerate(plan):
        for d in dirs:
            print(f"{rank}\t{d}" if args.ranks > 1 else d)
    if args.ranks > 1:
        # The balance, on stderr: stdout stays a list of parts.
        from .parts import rank_balance

        bal = rank_balance(args.path, args.ranks)
        unit = "bytes" if all(b["bytes"] is not None for b in bal) else "records"
        top = max(b[unit] for b in bal) or 1
        for rank, b in enumerate(bal):
            size = _human(b["bytes"]) if b["bytes"] is not None else "-"
            print(f"rank {rank}: {b['parts']} parts, {b['records']} records, {size} decoded "
                  f"({b[unit] / top:.1%} of the largest rank's {unit})", file=sys.stderr)
    return 0


def _fill(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fill takes a number, got {text!r}") from None


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--workers takes a positive number of processes, got {text!r}")
    return n


def cmd_convert(args: argparse.Namespace) -> int:
    src, dst = Path(args.src), Path(args.dst)
    t = time.perf_counter()
    counts = convert(
        src, dst,
        columns=args.columns.split(",") if args.columns else None,
        fill=args.fill,
        extensions=args.ext.split(",") if args.ext else None,
        codec=args.codec,
        kind=args.kind,
        overwrite=args.overwrite,
        block_bytes=args.chunk_bytes,
        progress=None if args.progress is None else args.progress,
        workers=args.workers,
        dtype=args.dtype,
    )
    secs = time.perf_counter() - t
    for name, n in counts.items():
        where = dst / f"{name}.zr" if name else dst
        print(f"{where}: {n} records")
    print(f"converted {src} in {secs:.1f} s")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    # Opening for writing creates a store where there is none: a mistyped
    # PATH would "compact" a new empty store into being instead of failing.
    Store(args.path, "r").close()
    with Store(args.path, "a") as store:
        before = store.stats()
        report = store.compact(args.format)
        after = store.stats()
    print(f"compacted {args.path}: chunk bytes {_human(before.get('chunk_bytes', 0))} -> "
          f"{_human(after.get('chunk_bytes', 0))}, table format {before.get('table_format')} -> "
          f"{after.get('table_format')}, table {_human(before.get('table_bytes', 0))} -> "
          f"{_human(after.get('table_bytes', 0))}")
    if report:
        print("report: " + ", ".join(f"{k}={v}" for k, v in report.items()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Random batch gathers: throughput and latency percentiles."""
    with Store(args.path, "r", cache_bytes=args.cache_bytes) as store:
        n = len(store)
        if n == 0:
            print("error: the store is empty", file=sys.stderr)
            return 2
        rng = np.random.default_rng(args.seed)
        lat = np.empty(args.batches, dtype=np.int64)
        total_bytes = 0
        start = time.perf_counter_ns()
        for i in range(args.batches):
            idx = rng.integers(0, n, size=args.batch_size, dtype=np.uint64)
            t0 = time.perf_counter_ns()
            lens = store.lengths(idx)
            offsets = np.zeros(idx.size, dtype=np.uint64)
            np.cumsum(lens[:-1], out=offsets[1:])
            dst = np.empty(int(lens.sum()), dtype=np.uint8)
            store.gather_var(idx, dst, offsets)
            lat[i] = time.perf_counter_ns() - t0
            total_bytes += dst.size
        elapsed = (time.perf_counter_ns() - start) / 1e9
        reads = store.read_stats()
    q = np.percentile(lat, [50, 90, 99, 99.9]) / 1e3
    print(f"{args.batches} batches of {args.batch_size} random records from {n} "
          f"in {elapsed:.3f} s")
    print(f"throughput: {args.batches / elapsed:.1f} batches/s, "
          f"{args.batches * args.batch_size / elapsed:,.0f} records/s, "
          f"{total_bytes / elapsed / 2**20:.1f} MiB/s")
    print()
    print("| p50 (µs) | p90 (µs) | p99 (µs) | p99.9 (µs) | max (µs) |")
    print("|---------:|---------:|---------:|-----------:|---------:|")
    print(f"| {q[0]:8.1f} | {q[1]:8.1f} | {q[2]:8.1f} | {q[3]:10.1f} | {lat.max() / 1e3:8.1f} |")
    print()
    _print_reads(reads)
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from . import remote

    opts = {}
    for o in args.option:
        if "=" not in o:
            raise ValueError(f"--option {o!r}: expected KEY=VALUE")
        k, v = o.split("=", 1)
        opts[k] = v
    if (args.rank is None) != (args.ranks is None):
        raise ValueError("give --rank and --ranks together (or neither, for the whole dataset)")
    t = time.perf_counter()
    done = remote.stage(args.url, args.cache, rank=args.rank, ranks=args.ranks, cache_bytes=args.cache_bytes,
                        storage_options=opts, progress=sys.stderr.isatty())
    secs = time.perf_counter() - t
    mib = done["fetched_bytes"] / 2**20
    print(f"{done['path']}: fetched {done['fetched_objects']} objects ({mib:.1f} MiB in {secs:.1f} s, "
          f"{mib / max(secs, 1e-9):.1f} MiB/s), {done['reused_objects']} in place, share "
          f"{done['share_bytes'] / 2**20:.1f} MiB, removed {done['removed_bytes'] / 2**20:.1f} MiB")
    return 0


def _share_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--ranks", type=int, default=None, help="with --rank: a dataset of parts read by N ranks")
    s.add_argument("--rank", type=int, default=None,
                   help="check only rank K's share (what `zring parts --ranks N --rank K` lists): a host's folder")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zring", description="Inspect and manage zring stores.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("info", help="records, rows (tokens), codec, dtype/shape, size on disk, ratio")
    s.add_argument("path")
    _share_args(s)
    s.set_defaults(func=cmd_info)
    s = sub.add_parser("verify", help="read and checksum every record")
    s.add_argument("path")
    _share_args(s)
    s.set_defaults(func=cmd_verify)
    s = sub.add_parser("parts", help="a dataset of parts' committed part directories, and with --ranks N the rank "
                                     "that reads each (rank, tab, directory): what to stage on each host")
    s.add_argument("path")
    s.add_argument("--ranks", type=int, default=1)
    s.add_argument("--rank", type=int, default=None,
                   help="print only what rank K's host needs: manifest.json and its part directories, one a line "
                        "(for rsync --files-from)")
    s.set_defaults(func=cmd_parts)
    s = sub.add_parser("stage", help="copy a dataset in object storage (s3://, gs://, az://), or rank K of N's "
                                     "share of a dataset of parts, into a cache folder on local disk, before a run")
    s.add_argument("url")
    s.add_argument("--cache", required=True, help="the host's cache folder (what Dataset(url, cache=...) reads)")
    s.add_argument("--ranks", type=int, default=None)
    s.add_argument("--rank", type=int, default=None)
    s.add_argument("--cache-bytes", type=int, default=None, help="the cap on the cache folder's bytes")
    s.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a storage option (aws_endpoint=..., aws_region=..., timeout=30); repeatable")
    s.set_defaults(func=cmd_stage)
    s = sub.add_parser("convert", help="a .npy file, a loaderx store, Parquet files or a HuggingFace save_to_disk "
                                       "folder (Arrow files; one store per column), a folder of files or "
                                       "WebDataset tar shards (one store per extension), or a Megatron-LM .bin/.idx "
                                       "dataset (SRC its prefix or either file; one record per document, in DST/tokens.zr) "
                                       "into zring stores")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--codec", default="zstd", choices=("zstd", "raw"))
    s.add_argument("--chunk-bytes", type=int, default=WRITE_CHUNK_BYTES, help="bytes handed to one append")
    s.add_argument("--overwrite", action="store_true", help="replace an existing store at DST")
    s.add_argument("--columns", help="Parquet and Arrow: the columns to convert, comma-separated (default: all)")
    s.add_argument("--fill", type=_fill, help="what a null becomes (default: a null is an error)")
    s.add_argument("--ext", help="folder: keep only files with these extensions, comma-separated")
    s.add_argument("--kind", choices=KINDS, help="the source's kind (default: guessed)")
    s.add_argument("--dtype", help="Parquet and Arrow number columns, Megatron tokens: store every value as this "
                                   "NumPy dtype (int32, uint16, ...); widening always works, narrowing fails, "
                                   "naming a value, unless every value fits")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="show a progress bar (default: on a terminal)")
    s.add_argument("--workers", type=_workers, default=None, metavar="N",
                   help="a folder of Parquet, Arrow, tar or Megatron-LM files: write one part per file, N files "
                        "at a time in worker processes, so DST (per column: DST/COLUMN.zr) is a dataset of parts "
                        "(default: one store, written by this process)")
    s.set_defaults(func=cmd_convert)
    s = sub.add_parser("compact", help="reclaim the space of deleted records; --format upgrades the table")
    s.add_argument("path")
    s.add_argument("--format", type=int, choices=(1, 2), default=None,
                   help="rewrite the record table in this format (2: no entry per record for raw records of one "
                        "length, 12 bytes for others; default: keep the store's)")
    s.set_defaults(func=cmd_compact)
    s = sub.add_parser("bench", help="random-gather throughput and latency percentiles")
    s.add_argument("path")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--batches", type=int, default=200)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cache-bytes", type=int, default=None,
                   help="memory budget of the read policy (default: detected)")
    s.set_defaults(func=cmd_bench)
    return p


def _store_arg(args: argparse.Namespace) -> str | None:
    """The store (or source) the command was about, to name in its errors."""
    return getattr(args, "path", None) or getattr(args, "dst", None)


def _hint(path: str | None) -> str:
    """A hint when ``path`` is not a store but something near it is: the same
    name with ``.zr`` (what ``zring convert`` names per-column and
    per-extension stores), or a directory of such stores."""
    if path is None:
        return ""
    p = Path(path)
    if (p / "head.zr").is_file():
        return ""
    def a_store(d: Path) -> bool:  # a store, or a dataset of parts
        return (d / "head.zr").is_file() or (d / "manifest.json").is_file()

    near = p.with_name(p.name + ".zr") if p.name else None
    if near is not None and a_store(near):
        return f" (did you mean {near}?)"
    if p.is_dir():
        stores = sorted(c.name for c in p.iterdir() if c.name.endswith(".zr") and a_store(c))
        if stores:
            shown = ", ".join(str(p / c) for c in stores[:4]) + (", ..." if len(stores) > 4 else "")
            return f" ({p} is a directory of stores: {shown})"
    return ""


def _message(exc: BaseException, args: argparse.Namespace) -> str:
    """The one line an error prints: the store named (when the library's
    message does not already), the library's keyword arguments as flags, and
    a hint when a store is near the path given."""
    where = _store_arg(args)
    text = _in_flags(str(exc))
    if where is not None and where not in text and str(Path(where)) not in text:
        text = f"{where}: {text}"
    hint = _hint(getattr(args, "path", None)) if isinstance(exc, (ZringError, OSError)) else ""
    return f"error: {type(exc).__name__}: {text}{hint}"


def _quiet_stdout() -> None:
    """Points stdout at /dev/null after its reader went away (``zring info
    ... | head``), so the interpreter's last flush at exit does not print a
    second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


#: Exit status after Ctrl-C: 128 + SIGINT, as shells report it.
EXIT_INTERRUPTED = 130
#: Exit status when stdout's reader went away: 128 + SIGPIPE, what a command
#: killed by the signal would report.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zring`` command; returns the exit status.

    An error prints one line (``error: Type: message``, naming the store) and
    returns 1; Ctrl-C prints one line and returns 130 (a ``convert`` removes
    what it had written, leaving DST as it was); a closed stdout (``| head``)
    ends quietly with 141.
    """
    args = _parser().parse_args(argv)
    existed = args.command == "convert" and os.path.lexists(args.dst)
    try:
        status = args.func(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        left = ""
        if args.command == "convert":
            left = f"; {args.dst} is left as it was" if existed else f"; {args.dst} was not created"
        print(f"zring {args.command}: interrupted{left}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ZringError, OSError, ValueError, TypeError) as exc:
        print(_message(exc, args), file=sys.stderr)
        return 1


# The library's messages name its keyword arguments; the command's user sees flags.
_FLAGS = (
    (", or append=True to add records to it", ""),
    ("overwrite=True", "--overwrite"),
    ("fill=", "--fill"),
    ("columns=", "--columns"),
    ("workers=N", "--workers N"),
    ("workers=", "--workers"),
    ("dtype=", "--dtype "),
    ("kind='folder'", "--kind folder"),
    ("block_bytes", "--chunk-bytes"),
    ("cache_bytes", "--cache-bytes"),
    ("give rank and ranks together", "give --rank and --ranks together"),
    ("rank=", "--rank "),
    ("ranks=", "--ranks "),
)


def _in_flags(message: str) -> str:
    """``message`` with the library's keyword arguments named as this command's flags."""
    for kwarg, flag in _FLAGS:
        message = message.replace(kwarg, flag)
    return message


if __name__ == "__main__":
    sys.exit(main())
