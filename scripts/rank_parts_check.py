"""Ranks reading only their own parts (issue 37's must-show for ``rank_parts``):

    .venv/bin/python scripts/rank_parts_check.py [--ranks 4] [--batch 64] [--dir DIR]

Writes, under ``DIR`` (default: a fresh temporary directory, removed at the
end), a dataset of parts of ids ``0 .. N-1`` (records ``[id, -id]``, int64;
part sizes random multiples of the batch, so that the batch divides every
rank's records and a cycle drops none) and three more datasets of parts for
a 0.7/0.2/0.1 mixture. Then, for each rank, a host folder holding only what
``zring parts PATH --ranks R --rank K`` lists for it (the manifest and its
own parts; copied with ``rsync --files-from`` when rsync is installed, else
file by file): the other ranks' parts are not there, so a rank that touched
one would fail.

Each rank runs as its own process, all at once, on its own host folder:

1. one cycle of its sampler (``len // batch`` steps) in mode 0, 2 and 3,
   recording the ids delivered;
2. a 0.7/0.2/0.1 ``zring.mix`` of the three datasets, ``--mix-steps``
   steps of ``--batch`` rows: the largest distance, over all steps, of each
   source's rows so far from its share of the rank's rows so far;
3. a state saved at step ``--mix-steps // 2`` (written to a file) and a
   digest of the batches after it.

Then a second set of processes, one per rank, resumes each rank's mixture
from its saved state and digests the same batches; and, with JAX installed,
``--ranks`` JAX processes (joined by ``jax.distributed`` over loopback, one
CPU device each) run ``zring.jax.global_loader`` on their host folders with
the batch axis over all of them: each keeps its first cycle's rows, and the
union is checked as above. Last, in this process, a state saved with
``--ranks`` ranks is resumed with half as many: the message is printed.

Prints the figures and exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import zring
from zring import cli, parts

WEIGHTS = [0.7, 0.2, 0.1]
MIX_BASE = 1_000_000  # source k's ids start at k * MIX_BASE


def _write(root: Path, sizes: list[int], first: int) -> None:
    infos, start = [], first
    for n in sizes:
        ids = np.arange(start, start + n, dtype=np.int64)
        infos.append(parts.write_part(root, np.stack([ids, -ids], axis=1)))
        start += n
    parts.commit(root, infos)


def _stage(root: Path, host: Path, rank: int, ranks: int) -> list[str]:
    """Copies what ``zring parts --rank`` lists for ``rank`` into ``host``."""
    out = subprocess.run([sys.executable, "-c", "import sys; from zring import cli; sys.exit(cli.main(sys.argv[1:]))",
                          "parts", str(root), "--ranks", str(ranks), "--rank", str(rank)],
                         check=True, capture_output=True, text=True).stdout
    listed = out.split()
    host.mkdir(parents=True)
    if shutil.which("rsync"):
        lst = host.parent / f"{host.name}.files"
        lst.write_text(out)
        subprocess.run(["rsync", "-ar", f"--files-from={lst}", f"{root}/", f"{host}/"], check=True)
        lst.unlink()
    else:
        for rel in listed:
            src, dst = root / rel, host / rel
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dst)
    return listed[1:]


def _digest(batches: list[tuple[np.ndarray, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for x, s in batches:
        h.update(np.ascontiguousarray(x).tobytes())
        h.update(np.ascontiguousarray(s).astype(np.int64).tobytes())
    return h.hexdigest()[:16]


def _mixture(host_root: Path, rank: int, ranks: int) -> zring.Mixture:
    return zring.mix([{"x": zring.Dataset(host_root / f"mix{k}", rank_parts=(rank, ranks))} for k in range(3)],
                     WEIGHTS)


def worker(args: argparse.Namespace) -> None:
    """One rank's process: the cycles, the mixture, the saved state."""
    host, rank, ranks, batch = Path(args.host), args.rank, args.ranks, args.batch
    report: dict = {"rank": rank}
    ds = zring.Dataset(host / "main", rank_parts=(rank, ranks))
    report["records"] = len(ds)
    report["cycles"] = {}
    for mode in (0, 2, 3):
        extra = {"block_records": 16, "window_blocks": 8} if mode == 3 else {}
        with zring.DataLoader({"x": ds}, batch_size=batch, mode=mode, seed=17, rank_parts=(rank, ranks),
                              **extra) as dl:
            ids = [int(i) for _ in range(len(ds) // batch) for i in next(dl)["x"][:, 0]]
        report["cycles"][mode] = ids
    ds.close()

    mix = _mixture(host, rank, ranks)
    half = args.mix_steps // 2
    w = np.array(WEIGHTS)
    counts = np.zeros(3)
    worst = np.zeros(3)
    after: list[tuple[np.ndarray, np.ndarray]] = []
    with zring.DataLoader(mix, batch_size=batch, mode=2, seed=23, rank_parts=(rank, ranks)) as dl:
        for t in range(args.mix_steps):
            if t == half:
                Path(args.state).write_text(json.dumps(dl.state()))
            x = next(dl)["x"]
            counts += np.bincount(dl.last_sources, minlength=3)
            worst = np.maximum(worst, np.abs(counts - w * batch * (t + 1)))
            if t >= half:
                after.append((x.copy(), dl.last_sources.copy()))
    report["mix_rows"] = counts.tolist()
    report["mix_worst"] = worst.tolist()
    report["digest_before"] = _digest(after)
    Path(args.out).write_text(json.dumps(report))


def resume(args: argparse.Namespace) -> None:
    """A new process for the rank: resume the mixture from its saved state."""
    host, rank, ranks = Path(args.host), args.rank, args.ranks
    state = json.loads(Path(args.state).read_text())
    batches = []
    with zring.DataLoader(_mixture(host, rank, ranks), state=state) as dl:
        for _ in range(args.mix_steps - args.mix_steps // 2):
            x = next(dl)["x"]
            batches.append((x.copy(), dl.last_sources.copy()))
    Path(args.out).write_text(json.dumps({"rank": rank, "digest_after": _digest(batches)}))


def jax_worker(args: argparse.Namespace) -> None:
    """One JAX process of ``--ranks``: global_loader over its own parts."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import zring.jax as zjax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.ranks,
                               process_id=args.rank, initialization_timeout=120)
    rank, ranks, batch = jax.process_index(), jax.process_count(), args.batch
    ds = zring.Dataset(Path(args.host) / "main", rank_parts=(rank, ranks))
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    steps = args.jax_steps
    mine: list[int] = []
    with zjax.global_loader({"x": ds}, batch * ranks, sharding, mode=2, seed=29, rank_parts=(rank, ranks),
                            num_workers=1) as g:
        for t in range(steps):
            arr = next(g)["x"]
            if t < len(ds) // batch:  # this rank's first cycle
                for s in arr.addressable_shards:
                    mine.extend(int(i) for i in np.asarray(s.data)[:, 0])
    Path(args.out).write_text(json.dumps({"rank": rank, "ids": mine, "records": len(ds)}))
    jax.distributed.shutdown()


def _run_all(cmds: list[list[str]], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    bad = [(i, p.returncode, log) for i, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    if bad:
        for i, rc, log in bad:
            print(f"--- process {i} failed (rc {rc}):\n{log[-3000:]}", file=sys.stderr)
        raise SystemExit(1)
    return time.perf_counter() - t0


def _coverage(name: str, per_rank: list[list[int]], total: int) -> bool:
    seen = np.bincount(np.array([i for ids in per_rank for i in ids], dtype=np.int64), minlength=total)
    ok = len(seen) == total and bool((seen == 1).all())
    print(f"  {name:<26} rows {int(seen.sum()):>7,} of {total:,} records: once {int((seen == 1).sum()):,}, "
          f"never {int((seen == 0).sum()):,}, twice or more {int((seen > 1).sum()):,}  "
          f"{'OK' if ok else 'FAIL'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--parts", type=int, default=24)
    ap.add_argument("--mix-steps", type=int, default=400)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-jax", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    ranks, batch = args.ranks, args.batch
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rank-parts-"))
    if args.dir and tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        return _check(tmp, rng, args, ranks, batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check(tmp: Path, rng: np.random.Generator, args: argparse.Namespace, ranks: int, batch: int) -> int:
    data = tmp / "data"
    sizes = (rng.integers(1, 41, size=args.parts) * batch).tolist()
    _write(data / "main", sizes, 0)
    total = int(sum(sizes))
    mix_sizes = [(rng.integers(20, 200, size=n)).tolist() for n in (16, 10, 8)]
    for k, s in enumerate(mix_sizes):
        _write(data / f"mix{k}", s, k * MIX_BASE)
    print(f"dataset: {args.parts} parts, {total:,} records (parts of {min(sizes):,} to {max(sizes):,}, "
          f"multiples of the batch {batch}); mixture sources: {[len(s) for s in mix_sizes]} parts, "
          f"{[int(sum(s)) for s in mix_sizes]} records; {ranks} ranks")

    hosts = []
    for r in range(ranks):
        host = tmp / f"host{r}"
        staged = {}
        for name in ("main", "mix0", "mix1", "mix2"):
            staged[name] = _stage(data / name, host / name, r, ranks)
        others = [d for k, dirs in enumerate(parts.rank_plan(data / "main", ranks)) if k != r for d in dirs]
        assert not any((host / "main" / d).exists() for d in others)
        hosts.append(host)
        print(f"  host {r}: {len(staged['main'])} of {args.parts} parts staged "
              f"({'rsync --files-from' if shutil.which('rsync') else 'copied'}), other ranks' parts absent")

    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--ranks", str(ranks), "--batch", str(batch), "--mix-steps", str(args.mix_steps)]
    secs = _run_all([me + ["worker", "--host", str(hosts[r]), "--rank", str(r), *common,
                           "--state", str(tmp / f"state{r}.json"), "--out", str(tmp / f"report{r}.json")]
                     for r in range(ranks)])
    reports = [json.loads((tmp / f"report{r}.json").read_text()) for r in range(ranks)]
    print(f"\n{ranks} rank processes at once ({secs:.1f} s), each on its own host folder:")
    ok = True
    loads = [rep["records"] for rep in reports]
    print(f"  records per rank: {loads} (balance: max - min = {max(loads) - min(loads):,}, largest part "
          f"{max(sizes):,})")
    for mode, name in ((0, "mode 0 (sequential)"), (2, "mode 2 (cyclic)"), (3, "mode 3 (blocked)")):
        ok &= _coverage(f"one cycle, {name}", [rep["cycles"][str(mode)] for rep in reports], total)

    print(f"\n0.7/0.2/0.1 mixture, {args.mix_steps} steps of {batch} rows per rank:")
    w = np.array(WEIGHTS)
    for rep in reports:
        rows = np.array(rep["mix_rows"])
        worst = np.array(rep["mix_worst"])
        fine = bool((worst <= 1).all())
        ok &= fine
        print(f"  rank {rep['rank']}: rows {rows.astype(int).tolist()} of {int(rows.sum()):,} (shares "
              f"{(w * rows.sum()).round(1).tolist()}), largest distance from its share at any step "
              f"{worst.round(2).tolist()} rows  {'OK' if fine else 'FAIL'}")

    secs = _run_all([me + ["resume", "--host", str(hosts[r]), "--rank", str(r), *common,
                           "--state", str(tmp / f"state{r}.json"), "--out", str(tmp / f"resume{r}.json")]
                     for r in range(ranks)])
    print(f"\nresume, {ranks} new processes from each rank's state at step {args.mix_steps // 2} ({secs:.1f} s):")
    for r, rep in enumerate(reports):
        again = json.loads((tmp / f"resume{r}.json").read_text())
        same = again["digest_after"] == rep["digest_before"]
        ok &= same
        print(f"  rank {r}: the {args.mix_steps - args.mix_steps // 2} batches after the state: uninterrupted "
              f"{rep['digest_before']}, resumed {again['digest_after']}  {'OK' if same else 'FAIL'}")

    state = json.loads((tmp / "state1.json").read_text())
    fewer = max(1, ranks // 2)
    srcs = [zring.Dataset(data / f"mix{k}", rank_parts=(1 % fewer, fewer)) for k in range(3)]
    try:
        zring.DataLoader(zring.mix([{"x": s} for s in srcs], WEIGHTS), state=state).close()
        print(f"\nFAIL: rank 1's state resumed with {fewer} ranks")
        ok = False
    except ValueError as exc:
        print(f"\nrank 1's state resumed with {fewer} ranks: refused: {exc}")
    for s in srcs:
        s.close()

    if not args.no_jax:
        try:
            import jax  # noqa: F401
        except ImportError:
            print("\n(jax not installed: global_loader check skipped)")
            return 0 if ok else 1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        steps = max(loads) // batch
        secs = _run_all([me + ["jax", "--host", str(hosts[r]), "--rank", str(r), *common, "--port", str(port),
                               "--jax-steps", str(steps), "--out", str(tmp / f"jax{r}.json")]
                         for r in range(ranks)], env=env)
        jrep = [json.loads((tmp / f"jax{r}.json").read_text()) for r in range(ranks)]
        print(f"\nzring.jax.global_loader, {ranks} JAX processes (jax.distributed, one CPU device each), "
              f"global batch {batch * ranks}, {steps} steps ({secs:.1f} s):")
        ok &= _coverage("each rank's first cycle", [j["ids"] for j in jrep], total)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("worker", "resume", "jax"):
        ap = argparse.ArgumentParser()
        ap.add_argument("what")
        for a in ("--host", "--state", "--out"):
            ap.add_argument(a)
        for a in ("--rank", "--ranks", "--batch", "--mix-steps", "--port", "--jax-steps"):
            ap.add_argument(a, type=int, default=0)
        a = ap.parse_args()
        {"worker": worker, "resume": resume, "jax": jax_worker}[a.what](a)
    else:
        sys.exit(main())
