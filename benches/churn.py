"""Hot gathers beside another process's page-cache churn.

A process that creates and deletes a 1 MiB file in /dev/shm every few
milliseconds shrinks the host's count of file pages each time. Such churn must
not make zring forget which of its own pages are in memory. Interleaved
rounds, each in one process over the same hot store (every page in memory):

  - ``overwrite``: the churn process rewrites its 1 MiB /dev/shm file in place
    (the same system calls and copying, no pages freed);
  - ``delete``: it writes the file, then deletes it.

Reported: hot raw gathers of 256 × 12 KiB random records per second, median of
rounds, and delete ÷ overwrite (1.0: the churn costs nothing more than its CPU).

    python benches/churn.py [--gib 1] [--rounds 5] [--secs 3] [--period-ms 3]

In the project venv with zring built by ``make develop-bench``; data in
$ZRING_BENCH_DIR/churn (default ``bench-data/churn``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget  # noqa: E402  (its store builder)
import common  # noqa: E402
from common import REPO, shown  # noqa: E402

BATCH = 256


def churn(mode: str, period: float) -> None:
    """The other process: 1 MiB into /dev/shm every ``period`` seconds."""
    path = f"/dev/shm/zring-churn-{os.getpid()}"
    data = os.urandom(1 << 20)
    try:
        while True:
            t = time.perf_counter()
            with open(path, "r+b" if mode == "overwrite" and os.path.exists(path) else "wb") as f:
                f.write(data)
            if mode == "delete":
                os.unlink(path)
            time.sleep(max(0.0, period - (time.perf_counter() - t)))
    finally:
        if os.path.exists(path):
            os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--period-ms", type=float, default=3.0)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--churn", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.churn:
        churn(args.churn, args.period_ms / 1e3)
        return
    import numpy as np

    import zring

    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "churn"
    paths, n = budget.ensure_data(data, args.gib, libs=("zring",))
    ds = zring.Dataset(str(paths["zring"]))
    rng = np.random.default_rng(1)
    for s in range(0, n, 4096):  # every page into memory
        ds.__getitems__(np.arange(s, min(n, s + 4096), dtype=np.int64))
    rates: dict[str, list[float]] = {"overwrite": [], "delete": []}
    for r in range(args.rounds):
        for mode in ("overwrite", "delete") if r % 2 == 0 else ("delete", "overwrite"):
            other = subprocess.Popen([sys.executable, __file__, "--churn", mode, "--period-ms", str(args.period_ms)])
            try:
                time.sleep(0.2)
                k, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < args.secs:
                    ds.__getitems__(rng.integers(0, n, size=BATCH, dtype=np.int64))
                    k += 1
                rates[mode].append(k / (time.perf_counter() - t0))
            finally:
                other.terminate()
                other.wait()
        print(f"  round {r + 1}: overwrite {rates['overwrite'][-1]:.0f}, delete {rates['delete'][-1]:.0f} gathers/s",
              file=sys.stderr, flush=True)
    ratios = [d / o for d, o in zip(rates["delete"], rates["overwrite"])]
    med = {m: statistics.median(v) for m, v in rates.items()}
    text = "\n".join([
        f"## Hot gathers beside /dev/shm churn ({args.rounds} interleaved rounds of {args.secs:g} s)",
        "",
        f"Machine: {common.machine(data)}. Store: {n} × 12 KiB raw records ({shown(paths['zring'])}), all in memory. "
        f"The other process writes a 1 MiB /dev/shm file every {args.period_ms:g} ms.",
        "",
        "| other process | hot gathers of 256 per second (median) |",
        "|---|---:|",
        f"| rewrites its file in place | {med['overwrite']:.0f} |",
        f"| writes, then deletes its file | {med['delete']:.0f} |",
        f"| delete ÷ overwrite, median of rounds (range) | **{statistics.median(ratios):.2f}** "
        f"({min(ratios):.2f}–{max(ratios):.2f}) |",
        "",
        f"Command: `{' '.join(['python benches/churn.py', *sys.argv[1:]])}`.",
    ]) + "\n"
    print(text)
    common.write_result(REPO / "bench-results" / "churn.md", text)


if __name__ == "__main__":
    main()
