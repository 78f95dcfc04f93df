"""One-shot writes seal table format 2: what a store written once takes on
disk, and what the seal costs the write.

Each round writes the same data twice, in alternating order: once as
``append=True`` into a new directory (the write path without the seal: the
format-1 table an append writes, which is what a one-shot write left before
it sealed) and once as a one-shot write (built beside, its table sealed in
format 2, renamed into place). Sizes are ``du`` of the store directory
(apparent bytes, ``du -sb``); times are medians over the rounds.

* ``--labels`` (default 20 million) int64 labels through ``write_dataset``
  (its default codec, zstd, which keeps an 8-byte label raw);
* ``--ragged`` (default 2 million) int32 token records of 8..127 tokens
  through ``write_ragged`` (raw): table bytes per record;
* the same data through ``Store`` directly: the time of ``seal()`` alone.

    python benches/seal.py [--labels 20000000] [--ragged 2000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine, versions, write_result  # noqa: E402

import zring  # noqa: E402

DATA = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "seal"


def du(path: Path) -> int:
    """Apparent bytes of the directory, as ``du -sb`` counts them."""
    return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])


def table(path: Path) -> tuple[int, int]:
    with zring.Zrecord(path, readonly=True) as z:
        s = z.stats()
    return s["table_format"], s["table_bytes"]


def rounds(n: int, write) -> dict[str, list[tuple[float, int, tuple[int, int]]]]:
    """``write(path, sealed)`` n times each way, alternating which goes first."""
    out: dict[str, list] = {"append": [], "sealed": []}
    for r in range(n):
        order = ("append", "sealed") if r % 2 == 0 else ("sealed", "append")
        for how in order:
            p = DATA / f"{how}-{r}"
            shutil.rmtree(p, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            t = time.perf_counter()
            write(p, how == "sealed")
            secs = time.perf_counter() - t
            out[how].append((secs, du(p), table(p)))
            print(f"round {r} {how}: {secs:.2f} s, {du(p):,} B, table {table(p)}", flush=True)
            shutil.rmtree(p)
    return out


def seal_alone(labels: np.ndarray, src: np.ndarray, lens: np.ndarray, n: int) -> dict[str, list[float]]:
    """Seconds of ``Store.seal`` alone (after the appends' sync), n times each."""
    from zring import _zring

    out: dict[str, list[float]] = {"labels": [], "ragged": []}
    offsets = np.zeros(len(lens), np.uint64)
    np.cumsum(lens[:-1], out=offsets[1:])
    for _ in range(n):
        for kind in ("labels", "ragged"):
            p = DATA / "alone"
            shutil.rmtree(p, ignore_errors=True)
            with _zring.Store(p, "x", codec="raw", sealable=True) as s:
                if kind == "labels":
                    s.append_fixed(labels.view(np.uint8), 8)
                else:
                    s.append(src, offsets, lens)
                s.sync()
                t = time.perf_counter()
                assert s.seal()["format_after"] == 2
                out[kind].append(time.perf_counter() - t)
            shutil.rmtree(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=20_000_000)
    ap.add_argument("--ragged", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "seal.md")
    args = ap.parse_args()
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    med = lambda xs: float(np.median(xs))  # noqa: E731

    labels = np.arange(args.labels, dtype=np.int64)
    payload = labels.nbytes
    res = rounds(args.rounds, lambda p, sealed: zring.write_dataset(p, labels, append=not sealed))
    lines = [
        f"## {args.labels:,} int64 labels, `write_dataset` (codec zstd: labels stay raw; {payload / 1e6:.0f} MB)", "",
        "| write | table | `du -sb` | × the labels | written in (median) | each round |",
        "|---|---|---:|---:|---:|---|",
    ]
    for how, name in (("append", "`append=True` (no seal)"), ("sealed", "one-shot (sealed)")):
        rs = res[how]
        fmt, tb = rs[0][2]
        size = rs[0][1]
        lines.append(f"| {name} | format {fmt}, {tb / 1e6:,.3f} MB | {size / 1e6:,.1f} MB | {size / payload:.3f} | "
                     f"{med([r[0] for r in rs]):.2f} s | {', '.join(f'{r[0]:.2f}' for r in rs)} |")
    lines.append("")
    print("\n".join(lines), flush=True)

    rng = np.random.default_rng(0)
    lens = rng.integers(8, 128, args.ragged)
    tokens = rng.integers(0, 50_000, int(lens.sum()), dtype=np.int32)
    arrays = np.split(tokens, np.cumsum(lens)[:-1])
    res = rounds(args.rounds, lambda p, sealed: zring.write_ragged(p, arrays, codec="raw", append=not sealed))
    n = args.ragged
    lines += [
        f"## {n:,} ragged records (int32 tokens, 8..127 each, {tokens.nbytes / 1e6:,.0f} MB), `write_ragged`, raw", "",
        "| write | table | table bytes | per record | `du -sb` | written in (median) | each round |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for how, name in (("append", "`append=True` (no seal)"), ("sealed", "one-shot (sealed)")):
        rs = res[how]
        fmt, tb = rs[0][2]
        lines.append(f"| {name} | format {fmt} | {tb / 1e6:,.1f} MB | {tb / n:.2f} B | {rs[0][1] / 1e6:,.1f} MB | "
                     f"{med([r[0] for r in rs]):.2f} s | {', '.join(f'{r[0]:.2f}' for r in rs)} |")
    lines.append("")
    alone = seal_alone(labels, tokens.view(np.uint8), (lens * 4).astype(np.uint64), args.rounds)
    lines += [
        "## `Store.seal` alone (after the appends' sync), raw", "",
        "| store | seal (median) | each round |", "|---|---:|---|",
        *(f"| {what} | {med(alone[k]) * 1e3:.0f} ms | {', '.join(f'{t * 1e3:.0f}' for t in alone[k])} |"
          for k, what in (("labels", f"{args.labels:,} int64 labels"), ("ragged", f"{n:,} ragged records"))),
        "",
    ]
    text = "\n".join([
        "# One-shot writes seal table format 2", "",
        f"`python benches/seal.py --labels {args.labels} --ragged {args.ragged} --rounds {args.rounds}` — "
        f"{machine(DATA)}", "",
        versions(("zring", "numpy")), "",
        "Each round writes the data both ways, alternating which goes first; the two cores were shared "
        "with other builds, so times are noisy: compare the medians.", "",
        *lines,
    ])
    write_result(args.out, text)
    print(text)
    shutil.rmtree(DATA, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
