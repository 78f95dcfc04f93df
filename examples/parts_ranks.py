"""Ranks that each hold and read only their own parts of a dataset of parts.

What it shows:

1. A dataset written in ``PARTS`` parts (``zring.parts.write_part`` and one
   ``commit``). Record ``i`` holds ``i``, so a batch names its records.
2. Each rank's host gets only what ``zring parts PATH --ranks N --rank K``
   lists for it: the manifest and that rank's parts (copied here into one
   folder per rank; on a cluster, ``rsync --files-from``). The other ranks'
   parts are not there, so a rank that touched one would fail.
3. ``RANKS`` processes, started as a launcher starts ranks, each open
   ``Dataset(host_folder, rank_parts=(rank, RANKS))`` and run a
   ``DataLoader(..., rank_parts=(rank, RANKS))`` for one cycle of its
   sampler, then save its state. The parent checks that each rank drew only
   records of its own parts, and that the ranks together drew every record
   of the dataset exactly once.
4. Three parts are appended (a new manifest generation). The rank plan is
   stable under appends, so each host only gets its new parts, and each rank
   resumes from its saved state over the grown dataset: its next cycle
   covers its old and new parts, and again the ranks together read every
   record once.

Run: ``python examples/parts_ranks.py [--ranks 3] [--parts 9]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring

BATCH = 16


def write_parts(root: str, first_part: int, count: int) -> None:
    """Parts ``first_part ..`` of the dataset: part ``k`` holds ``BATCH * (2 + k % 3)`` records.

    A batch size that divides every part's records divides every rank's, so a
    cycle drops no record and "every record once" is exact.
    """
    start = sum(BATCH * (2 + k % 3) for k in range(first_part))
    infos = []
    for k in range(first_part, first_part + count):
        n = BATCH * (2 + k % 3)
        infos.append(zring.parts.write_part(root, np.arange(start, start + n, dtype=np.int64)[:, None]))
        start += n
    zring.parts.commit(root, infos, mode="append")


def stage(root: str, host: Path, rank: int, ranks: int) -> list[str]:
    """Copy to ``host`` what rank ``rank``'s host needs (the ``zring parts --rank`` list)."""
    listed = subprocess.run([sys.executable, "-m", "zring.cli", "parts", root, "--ranks", str(ranks),
                             "--rank", str(rank)], check=True, capture_output=True, text=True).stdout.split()
    host.mkdir(parents=True, exist_ok=True)
    for rel in listed:
        src, dst = Path(root) / rel, host / rel
        if src.is_dir():
            if not dst.exists():  # a part never changes once committed
                shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return listed[1:]


def rank_main(host: str, rank: int, ranks: int, state: dict | None, out: mp.Queue) -> None:
    """One cycle of this rank's loader (resumed from ``state`` if given): the ids it drew and its state."""
    ds = zring.Dataset(host, rank_parts=(rank, ranks))
    ids = []
    with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=2, seed=7, rank_parts=(rank, ranks),
                          state=state) as dl:
        # A state saved at the end of a cycle: the next cycle covers the rank's parts grown.
        for _ in range(len(ds) // BATCH):
            ids.append(next(dl)["x"][:, 0].copy())
        saved = dl.state()
    own = ds[np.arange(len(ds))][:, 0]
    out.put((rank, np.concatenate(ids), own, saved))


def run_ranks(hosts: list[Path], ranks: int, states: list[dict | None]) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(str(hosts[r]), r, ranks, states[r], out)) for r in range(ranks)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, ids, own, state = out.get(timeout=300)
        got[rank] = (ids, own, state)
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"a rank exited with status {p.exitcode}")
    return got


def check(got: dict, total: int, label: str) -> bool:
    for rank, (ids, own, _) in got.items():
        if not np.isin(ids, own).all():
            print(f"FAILED ({label}): rank {rank} drew records outside its own parts", file=sys.stderr)
            return False
    every = np.sort(np.concatenate([ids for ids, _, _ in got.values()]))
    if not np.array_equal(every, np.arange(total)):
        print(f"FAILED ({label}): the ranks' cycles do not cover every record exactly once", file=sys.stderr)
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--parts", type=int, default=9)
    a = ap.parse_args()
    if a.parts < a.ranks:
        ap.error("write at least as many parts as ranks")
    with tempfile.TemporaryDirectory(prefix="zring-parts-ranks-") as tmp:
        root = str(Path(tmp) / "corpus")
        write_parts(root, 0, a.parts)
        total = len(zring.Dataset(root))
        hosts = [Path(tmp) / f"host{r}" / "corpus" for r in range(a.ranks)]
        for r, host in enumerate(hosts):
            mine = stage(root, host, r, a.ranks)
            print(f"rank {r}: {len(mine)} parts on its host ({len(zring.Dataset(host, rank_parts=(r, a.ranks)))} "
                  f"of {total} records)")
        got = run_ranks(hosts, a.ranks, [None] * a.ranks)
        if not check(got, total, "first cycle"):
            return 1
        print(f"one cycle of {a.ranks} ranks: each drew only its own parts' records; together every record once")

        write_parts(root, a.parts, 3)
        grown = len(zring.Dataset(root))
        for r, host in enumerate(hosts):
            stage(root, host, r, a.ranks)  # copies the new manifest and the rank's new parts only
        got = run_ranks(hosts, a.ranks, [got[r][2] for r in range(a.ranks)])
        if not check(got, grown, "after the append"):
            return 1
        print(f"3 parts appended ({total} -> {grown} records): each rank resumed from its state and its next "
              "cycle covered its old and new parts; together every record once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
