"""Datasets of parts written in parallel: Ray Data's sink and ``zring convert --workers``.

Two measurements, each contender interleaved with the other round by round
(``--rounds``, medians and ratios):

* ``ray``: Ray Data in local mode (``ray.init(num_cpus=2)``) writes
  ``--docs`` token documents (int32; document ``i`` starts with ``i``, then
  ``i % 127`` more tokens) into at least 16 parts with ``zring.ray`` (one
  write task per block, ``--blocks`` blocks). One write task's first
  attempt dies (its worker exits) after writing its part's files; Ray
  retries it. Each round then checks that every document is there exactly
  once and that no staged part (orphan) is left. Against it: one process's
  ``zring.write_ragged`` of the same documents (built in memory first, not
  timed). Ray's first job (starting its workers) is a small warm-up write,
  timed apart. Rows/s of each, and Ray's floor: the same pipeline into a sink
  that drops the blocks (what Ray itself costs here).
* ``convert``: ``zring convert SRC DST --workers 2`` against ``--workers 1``
  on ``--files`` Parquet files (``train-000NN-of-000MM.parquet``, columns
  ``id`` and ``tokens``), each run a fresh ``zring`` command.

    python benches/ray_write.py --dir DIR                 # both, 1 M documents, 64 files
    python benches/ray_write.py --dir DIR --only convert --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import zring
from zring import parts


def doc_lengths(ids: np.ndarray) -> np.ndarray:
    return ids % 127 + 1


def doc_values(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documents of ``ids``: (values, offsets); document ``i`` is ``i``
    followed by ``i % 127`` tokens ``(i * 31 + j) % 50000``."""
    lens = doc_lengths(ids)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    owner = np.repeat(ids, lens)
    j = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lens)
    values = np.where(j == 0, owner, (owner * 31 + j) % 50000).astype(np.int32)
    return values, offsets


def check(path: Path, n: int) -> int:
    """Every document exactly once (by its first token) and whole; no orphan.
    Returns the number of parts."""
    docs = zring.RaggedDataset(str(path))
    assert len(docs) == n, (len(docs), n)
    firsts = np.empty(n, np.int64)
    step = 100_000
    for lo in range(0, n, step):
        idx = np.arange(lo, min(n, lo + step))
        values, splits = docs[idx]
        firsts[lo:lo + len(idx)] = values[splits[:-1]]
        assert (np.diff(splits) == doc_lengths(values[splits[:-1]].astype(np.int64))).all()
    assert (np.sort(firsts) == np.arange(n)).all(), "a document missing or twice"
    staging = path / "staging"
    assert not staging.exists() or not os.listdir(staging), f"orphans left: {os.listdir(staging)}"
    listed = parts.list_parts(path)
    assert sorted(os.listdir(path / "parts")) == sorted(p["dir"].split("/")[1] for p in listed), "orphan parts"
    return len(listed)


def bench_ray(work: Path, n: int, blocks: int, rounds: int) -> list[str]:
    import pyarrow as pa
    import ray

    import zring.ray

    class DiesOnce(zring.ray.ZringDatasink):
        """Task 3's first attempt exits after writing its part's files."""

        def __init__(self, path, marker):
            super().__init__(path, column="tokens")
            self.marker = marker

        def write(self, blocks, ctx):
            result = super().write(blocks, ctx)
            if ctx.task_idx == 3 and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            return result

    class Discard(ray.data.Datasink):
        """Ray's floor: the same pipeline, each task's blocks read and dropped."""

        def write(self, blocks, ctx):
            return sum(len(b) for b in blocks)

    def batch(b):
        ids = np.asarray(b["id"], dtype=np.int64)
        values, offsets = doc_values(ids)
        return pa.table({"tokens": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))})

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    values, offsets = doc_values(np.arange(n, dtype=np.int64))
    docs = [values[offsets[i]:offsets[i + 1]] for i in range(n)]
    rows = {"ray": [], "one": [], "floor": []}
    lines = []
    try:
        # Ray's first job starts its workers, which import zring: timed apart.
        t = time.perf_counter()
        zring.ray.write(ray.data.range(20_000, override_num_blocks=4).map_batches(batch, batch_format="numpy"),
                        work / "warm-up", column="tokens")
        lines.append(f"warm-up (Ray's workers started, 20,000 documents): {time.perf_counter() - t:.1f} s")
        print(lines[-1], flush=True)
        shutil.rmtree(work / "warm-up")
        for r in range(rounds):
            for who in ("ray", "one", "floor") if r % 2 == 0 else ("floor", "one", "ray"):
                out = work / f"{who}-{r}"
                if who == "floor":
                    ds = ray.data.range(n, override_num_blocks=blocks).map_batches(batch, batch_format="numpy")
                    t = time.perf_counter()
                    ds.write_datasink(Discard())
                    secs = time.perf_counter() - t
                    lines.append(f"round {r}: Ray's floor (same pipeline, blocks dropped) {n / secs:,.0f} docs/s "
                                 f"({secs:.1f} s)")
                    rows[who].append(n / secs)
                    print(lines[-1], flush=True)
                    continue
                if who == "ray":
                    marker = work / f"died-{r}"
                    ds = ray.data.range(n, override_num_blocks=blocks).map_batches(batch, batch_format="numpy")
                    t = time.perf_counter()
                    sink = DiesOnce(str(out), str(marker))
                    ds.write_datasink(sink)
                    secs = time.perf_counter() - t
                    assert marker.exists(), "the task did not die"
                    assert sink.rows == n
                    k = check(out, n)
                    assert k >= 16, f"only {k} parts"
                    lines.append(f"round {r}: Ray {n / secs:,.0f} docs/s ({secs:.1f} s, {k} parts, one task died "
                                 f"after writing and was retried; every document once, no orphan)")
                else:
                    t = time.perf_counter()
                    zring.write_ragged(out, docs, progress=False)
                    secs = time.perf_counter() - t
                    assert len(zring.RaggedDataset(str(out))) == n
                    lines.append(f"round {r}: one process's write_ragged {n / secs:,.0f} docs/s ({secs:.1f} s)")
                rows[who].append(n / secs)
                print(lines[-1], flush=True)
                shutil.rmtree(out)
    finally:
        ray.shutdown()
    ratios = [a / b for a, b in zip(rows["ray"], rows["one"])]
    lines.append(f"median: Ray {statistics.median(rows['ray']):,.0f} docs/s, write_ragged "
                 f"{statistics.median(rows['one']):,.0f} docs/s, Ray's floor {statistics.median(rows['floor']):,.0f} "
                 f"docs/s; ratio Ray/one {statistics.median(ratios):.2f}x "
                 f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(lines[-1], flush=True)
    return lines


def bench_convert(work: Path, files: int, per_file: int, rounds: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = work / f"parquet-{files}x{per_file}"
    if not src.is_dir():
        tmp = work / "parquet.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for k in range(files):
            ids = np.arange(k * per_file, (k + 1) * per_file, dtype=np.int64)
            values, offsets = doc_values(ids)
            pq.write_table(pa.table({"id": ids, "tokens": pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), pa.array(values))}),
                tmp / f"train-{k:05d}-of-{files:05d}.parquet", row_group_size=2048)
        tmp.rename(src)
    size = sum(p.stat().st_size for p in src.iterdir())
    total = files * per_file
    zring_cmd = [sys.executable, "-m", "zring.cli"]
    secs = {1: [], 2: []}
    lines = [f"{files} Parquet files, {total:,} documents, {size / 2**20:.0f} MiB"]
    print(lines[-1], flush=True)
    for r in range(rounds):
        for w in (1, 2) if r % 2 == 0 else (2, 1):
            out = work / f"converted-{w}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([*zring_cmd, "convert", str(src), str(out), "--workers", str(w), "--no-progress"],
                           check=True, stdout=subprocess.DEVNULL)
            secs[w].append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            assert len(parts.list_parts(out / "tokens.zr")) == files
            assert len(zring.RaggedDataset(str(out / "tokens.zr"))) == total
            lines.append(f"round {r}: --workers {w}: {secs[w][-1]:.2f} s (CPU {cpu:.1f} s)")
            print(lines[-1], flush=True)
            shutil.rmtree(out)
    ratios = [a / b for a, b in zip(secs[1], secs[2])]
    lines.append(f"median: --workers 1 {statistics.median(secs[1]):.2f} s, --workers 2 "
                 f"{statistics.median(secs[2]):.2f} s, speedup {statistics.median(ratios):.2f}x "
                 f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="work directory (datasets are written and removed here)")
    ap.add_argument("--only", choices=("ray", "convert"))
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--blocks", type=int, default=20, help="Ray blocks, so write tasks and parts")
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--per-file", type=int, default=8_000, help="documents per Parquet file")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "ray"):
        bench_ray(work, args.docs, args.blocks, args.rounds)
    if args.only in (None, "convert"):
        bench_convert(work, args.files, args.per_file, args.rounds)


if __name__ == "__main__":
    main()
