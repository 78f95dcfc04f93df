"""Object-storage benchmark: a dataset of parts on a local S3 server, read
through zring's per-host cache.

The server is s3s-fs on 127.0.0.1 (a folder served as a bucket; ``--install``
builds it into ``target/tools`` with cargo, about 14 minutes), else moto's.
Sections, in one run:

1. ``ceiling``: the server's own rate for the ranged GETs the cache makes
   (8 MiB, 16 in flight, every chunk byte once), fetched by curl (SigV4)
   and discarded: what no client of this server can beat; and the same GETs
   written to files on the cache's disk (what a cache must also do; on two
   cores the client's copies take CPU from the server).
2. ``stage``: zring's first fetch of the same share into an empty cache
   (``zring.remote.stage``): MiB/s, its ratio to the ceiling, CPU-seconds per
   GiB. Beside it, the upload of the dataset (``zring.remote.upload``).
3. ``steady``: a mode-3 DataLoader over the staged copy against the same
   loader over the local copy, page cache dropped before each round,
   rounds interleaved.
4. ``half cap``: the cache capped at half the share, three mode-3 cycles:
   bytes fetched per cycle against ``(1 - 0.5)`` of the chunk bytes, the
   most blocks the cache held (sampled every 100 ms) against the cap, and
   seconds the reads waited on fetches; eviction by next use and LRU.
5. ``paced``: the half-cap cache read at a training step's pace (each
   step's bytes at 100 MiB/s): how long ``next()`` waits once the first
   window is in.

    python benches/remote.py [--gib 1] [--rounds 5] [--install]

Data in ``$ZRING_BENCH_DIR/remote`` (default ``bench-data/remote``); root for
drop_caches. The result goes to ``bench-results/remote.md``.
"""

from __future__ import annotations

import argparse
import resource
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import zring  # noqa: E402
from zring import parts, remote  # noqa: E402

REPO = common.REPO
KEYS = {"aws_access_key_id": "zring", "aws_secret_access_key": "zring-bench", "aws_region": "us-east-1"}
BUCKET = "bench"
RECORD = 64 << 10
PER_PART = 1024


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3s_fs(install: bool) -> Path | None:
    exe = REPO / "target" / "tools" / "bin" / "s3s-fs"
    if not exe.exists() and install:
        subprocess.run(["cargo", "install", "s3s-fs", "--version", "0.14.1", "--locked", "--features", "binary",
                        "--root", str(REPO / "target" / "tools")], check=True)
    return exe if exe.exists() else None


class Server:
    def __init__(self, root: Path, install: bool):
        self.port = free_port()
        exe = s3s_fs(install)
        if exe is not None:
            (root / BUCKET).mkdir(parents=True, exist_ok=True)
            self.kind = "s3s-fs 0.14.1"
            cmd = [str(exe), "--host", "127.0.0.1", "--port", str(self.port), "--access-key",
                   KEYS["aws_access_key_id"], "--secret-key", KEYS["aws_secret_access_key"], str(root)]
        else:
            self.kind = "moto (s3s-fs not built; --install builds it)"
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        if exe is None:
            import boto3
            boto3.client("s3", endpoint_url=self.endpoint, **{k: v for k, v in KEYS.items() if k != "aws_region"},
                         region_name=KEYS["aws_region"]).create_bucket(Bucket=BUCKET)

    def options(self, **extra) -> dict[str, str]:
        return {"aws_endpoint": self.endpoint, **KEYS, **{k: str(v) for k, v in extra.items()}}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def write_local(root: Path, gib: float) -> int:
    """Parts of raw 64 KiB records (their index in the first 8 bytes); the chunk bytes."""
    n_parts = max(2, int(gib * (1 << 30) // (RECORD * PER_PART)))
    if (root / "manifest.json").exists() and len(parts.list_parts(root)) == n_parts:
        return n_parts * PER_PART * RECORD
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    for k in range(n_parts):
        a = rng.integers(0, 255, size=(PER_PART, RECORD), dtype=np.uint8)
        a[:, :8] = np.arange(k * PER_PART, (k + 1) * PER_PART, dtype=np.uint64).view(np.uint8).reshape(PER_PART, 8)
        parts.commit(root, [parts.write_part(root, a, codec="raw")])
    return n_parts * PER_PART * RECORD


def ceiling(srv: Server, url: str, opts: dict[str, str], line: int, parallel: int,
            into: Path | None = None) -> tuple[float, int]:
    """curl's rate for every chunk file's lines, ``parallel`` in flight, the
    bytes discarded or (``into``) each range written to a file of its own there."""
    objs = [(k, size) for k, size, _ in zring._zring.list_objects(url, list(opts.items()), "parts/")
            if k.rsplit("/", 1)[-1].startswith("chunk-")]
    cfg = []
    total = 0
    prefix = url.split("://", 1)[1]
    for key, size in objs:
        for start in range(0, size, line):
            end = min(start + line, size) - 1
            total += end - start + 1
            dst = os.devnull if into is None else str(into / f"{len(cfg)}.bin")
            cfg += [f'url = "{srv.endpoint}/{prefix}/{key}"', f'range = "{start}-{end}"', f'output = "{dst}"',
                    f'user = "{KEYS["aws_access_key_id"]}:{KEYS["aws_secret_access_key"]}"',
                    'aws-sigv4 = "aws:amz:us-east-1:s3"', 'header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"',
                    "silent", "fail", "next"]
    with tempfile.NamedTemporaryFile("w", suffix=".curl", delete=False) as f:
        f.write("\n".join(cfg[:-1]) + "\n")
    t, c = time.perf_counter(), children_cpu()
    subprocess.run(["curl", "--parallel", "--parallel-max", str(parallel), "--config", f.name], check=True,
                   stderr=subprocess.DEVNULL)
    secs, used = time.perf_counter() - t, children_cpu() - c
    os.unlink(f.name)
    CURL_CPU.append(used / (total / 2**30))
    return total / secs / 2**20, total


#: curl's CPU-s per GiB, one entry per ceiling run.
CURL_CPU: list[float] = []


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cycle(ds, n: int, seed: int = 1, window_blocks: int = 8) -> float:
    t = time.perf_counter()
    with zring.DataLoader({"x": ds}, batch_size=256, mode=3, seed=seed, block_records=64,
                          window_blocks=window_blocks) as dl:
        ids = []
        for _ in range(n // 256):
            ids.append(next(dl)["x"][:, :8].copy().view(np.uint64)[:, 0])
    secs = time.perf_counter() - t
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(n // 256 * 256)), "every record once"
    return secs


def paced(url: str, opts: dict[str, str], data: Path, cap: int, n: int, local: Path) -> list[str]:
    """A training step's pace (each step's bytes at half the fetch rate of the
    first cycle): after the first window, does any step wait on a fetch
    longer than the same loader over the local copy waits?"""
    cache = data / "cache-paced"
    shutil.rmtree(cache, ignore_errors=True)
    step_bytes = 256 * RECORD
    out = ["## A paced run through a cache at half the share: do steps wait on fetches?\n",
           "Each step sleeps as long as fetching its bytes at 100 MiB/s would take (about half what the "
           "first cycle fetches at), as a training step would. A window is 8 blocks of 64 records (2 steps). "
           "`next()` is timed, the first window's steps left out; the same loader over the local copy "
           "(page cache dropped) is the reference.\n",
           "| reading | cycle | steps | steps waiting > 1 ms | wait p50 (ms) | wait p99 (ms) | wait max (ms) "
           "| fetched (MiB) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    pause = step_bytes / (100 * 2**20)
    for label in ("cache at half the share", "local copy"):
        common.drop_caches()
        ds = (zring.Dataset(url, cache=cache, cache_disk_bytes=cap, storage_options=opts) if label.startswith("cache")
              else zring.Dataset(local))
        fetched = (lambda: ds.remote_stats()["bytes_fetched"]) if label.startswith("cache") else (lambda: 0)
        with ds, zring.DataLoader({"x": ds}, batch_size=256, mode=3, seed=3, block_records=64,
                                  window_blocks=8) as dl:
            for c_ in range(2):
                waits = []
                before = fetched()
                for k in range(n // 256):
                    t = time.perf_counter()
                    next(dl)
                    w = time.perf_counter() - t
                    if k >= 2:
                        waits.append(w)
                    time.sleep(pause)
                got = fetched() - before
                w = np.sort(np.array(waits)) * 1e3
                out.append(f"| {label} | {c_} | {len(w)} | {int((w > 1).sum())} | {np.percentile(w, 50):.2f} | "
                           f"{np.percentile(w, 99):.2f} | {w[-1]:.2f} | {got / 2**20:.0f} |")
    out.append("")
    return out


def allocated(d: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--install", action="store_true", help="build s3s-fs into target/tools first")
    a = ap.parse_args()
    data = Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "remote"
    data.mkdir(parents=True, exist_ok=True)
    local = data / "local"
    chunk_bytes = write_local(local, a.gib)
    s3root = data / "s3"
    shutil.rmtree(s3root, ignore_errors=True)
    srv = Server(s3root, a.install)
    out = [f"# Object storage: a dataset of parts through the per-host cache\n",
           f"`python benches/remote.py --gib {a.gib:g} --rounds {a.rounds}`; server: {srv.kind} on 127.0.0.1; "
           f"{chunk_bytes / 2**30:.2f} GiB of raw 64 KiB records in {chunk_bytes // (RECORD * PER_PART)} parts; "
           f"lines of 8 MiB, 16 ranged GETs in flight.\n", common.machine(data), ""]
    try:
        url = f"s3://{BUCKET}/ds"
        opts = srv.options()
        t, c = time.perf_counter(), cpu()
        sent = remote.upload(local, url, storage_options=opts)
        up_s, up_cpu = time.perf_counter() - t, cpu() - c
        out.append(f"Upload (`zring.remote.upload`): {sent / 2**20 / up_s:.0f} MiB/s, "
                   f"{up_cpu / (sent / 2**30):.2f} CPU-s per GiB.\n")

        rows = []
        for r in range(a.rounds):
            ceil, total = ceiling(srv, url, opts, 8 << 20, 16)
            files = data / "curl-files"
            shutil.rmtree(files, ignore_errors=True)
            files.mkdir()
            ceil_files, _ = ceiling(srv, url, opts, 8 << 20, 16, files)
            shutil.rmtree(files, ignore_errors=True)
            cache = data / "cache-stage"
            shutil.rmtree(cache, ignore_errors=True)
            t, c = time.perf_counter(), cpu()
            done = remote.stage(url, cache, storage_options=opts)
            secs, used = time.perf_counter() - t, cpu() - c
            rate = done["fetched_bytes"] / secs / 2**20
            rows.append((ceil, ceil_files, rate, used / (done["fetched_bytes"] / 2**30), CURL_CPU[-2]))
            common.note(f"round {r}: ceiling {ceil:.0f} MiB/s, stage {rate:.0f} MiB/s")
        out += ["## First fetch against the server's own rate\n",
                "| round | curl, bytes discarded (MiB/s) | curl to files (MiB/s) | zring stage (MiB/s) | ratio to discarded "
                "| ratio to files | zring CPU-s per GiB | curl (discarding) CPU-s per GiB |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r, (ceil, ceil_files, rate, cps, ccps) in enumerate(rows):
            out.append(f"| {r} | {ceil:.0f} | {ceil_files:.0f} | {rate:.0f} | {rate / ceil:.2f} | "
                       f"{rate / ceil_files:.2f} | {cps:.2f} | {ccps:.2f} |")
        ratios = sorted(r[2] / r[0] for r in rows)
        out.append(f"\nMedian ratio to curl discarding: {ratios[len(ratios) // 2]:.2f} "
                   f"(lowest {ratios[0]:.2f}, highest {ratios[-1]:.2f}). Client and server share the 2 cores.\n")

        staged = zring.Dataset(url, cache=data / "cache-stage", storage_options=opts)
        mine = zring.Dataset(local)
        n = len(mine)
        # Both copies read once before the rounds: this VM's disk is cached by
        # its host too, and the local copy was just read by the upload; the
        # rounds then compare two copies in the same state (page cache dropped
        # before each, both in the host's cache).
        for d in (data / "cache-stage", local):
            for f in sorted(d.rglob("chunk-*")):
                with open(f, "rb") as fh:
                    while fh.read(8 << 20):
                        pass
        steady = []
        for r in range(a.rounds):
            common.drop_caches()
            cached_s = cycle(staged, n, seed=r)
            common.drop_caches()
            local_s = cycle(mine, n, seed=r)
            steady.append((chunk_bytes / cached_s / 2**20, chunk_bytes / local_s / 2**20))
        staged.close()
        mine.close()
        out += ["## Steady state: mode 3 over the cached copy against the local copy (page cache dropped)\n",
                "| round | cached (MiB/s) | local (MiB/s) | ratio |", "|---:|---:|---:|---:|"]
        for r, (c_, l_) in enumerate(steady):
            out.append(f"| {r} | {c_:.0f} | {l_:.0f} | {c_ / l_:.2f} |")
        out.append("")

        share = remote.stage(url, data / "cache-stage", storage_options=opts)["share_bytes"]
        cap = share // 2
        out += [f"## Cap at half the share ({cap / 2**20:.0f} MiB of {share / 2**20:.0f} MiB), three mode-3 cycles\n",
                f"Lines of {RECORD // 1024} KiB (one record each; neighbours fetched in runs of up to 8 MiB).\n",
                "Windows of 8 blocks of 64 records (32 MiB) unless said: the window being read and the next, loaded "
                "ahead, are pinned, so they narrow the room eviction has.\n",
                "| eviction | window (MiB) | cycle | fetched (MiB) | / (0.5 x chunk bytes) | reads waited on fetches (s) "
                "| cycle (s) | most held (MiB) | CPU-s per GiB fetched |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for policy, wb in (("next_use", 8), ("lru", 8), ("next_use", 4)):
            cache = data / f"cache-{policy}-{wb}"
            shutil.rmtree(cache, ignore_errors=True)
            with zring.Dataset(url, cache=cache, cache_disk_bytes=cap,
                               storage_options={**opts, "cache_eviction": policy,
                                                "cache_line_bytes": str(RECORD)}) as ds:
                worst, stop = [0], threading.Event()

                def sample() -> None:
                    while not stop.is_set():
                        worst[0] = max(worst[0], allocated(cache))
                        time.sleep(0.1)
                th = threading.Thread(target=sample, daemon=True)
                th.start()
                for c_ in range(3):
                    before = ds.remote_stats()
                    t, c0 = time.perf_counter(), cpu()
                    secs = cycle(ds, n, seed=7 + c_, window_blocks=wb)
                    used = cpu() - c0
                    after = ds.remote_stats()
                    got = after["bytes_fetched"] - before["bytes_fetched"]
                    waited = after["fetch_seconds"] - before["fetch_seconds"]
                    out.append(f"| {policy} | {wb * 64 * RECORD // 2**20} | {c_} | {got / 2**20:.0f} | "
                               f"{got / (0.5 * chunk_bytes):.3f} | "
                               f"{waited:.1f} | {secs:.1f} | {worst[0] / 2**20:.0f} | "
                               f"{used / max(got / 2**30, 1e-9):.2f} |")
                stop.set()
                th.join()
                out.append("")
                assert worst[0] <= cap, f"{policy}: {worst[0]} B held, cap {cap}"
        out.append(f"Most held never above the cap ({cap / 2**20:.0f} MiB): allocated blocks of the cache folder, "
                   f"sampled every 100 ms. CPU-s per GiB fetched counts the whole process (the loader's decoding "
                   f"and checks included).\n")
        out += paced(url, opts, data, cap, n, local)
    finally:
        srv.stop()
    text = "\n".join(out)
    print(text)
    common.write_result(REPO / "bench-results" / "remote.md", text)


if __name__ == "__main__":
    main()
