"""How random mode 3's batches are, against mode 2's, as the window moves.

The store: ``--records`` int64 labels sorted by class (``--classes``
classes of equal size, record ``i`` of class ``i * classes // records``),
the worst case for an order that reads blocks of consecutive records. For
each mode and block shape the DataLoader (batch 256) reads ``--cycles``
whole cycles and reports:

- distinct classes per batch of 256 (mean over the batches), and its ratio
  to mode 2's (uniform without replacement: the ceiling);
- the mean position correlation: Spearman's rho between a record's position
  in its cycle and its index, per cycle, the mean of |rho| over the cycles
  and seeds (0 for an order unrelated to the index; 1 for sequential).

Block shapes: ``--block`` records per block (default 86, the default for
12 KiB records: 1 MiB) and windows of ``--windows`` blocks.

    python benches/randomness.py            # results in bench-results/randomness.md

Needs only zring and numpy; data goes to $ZRING_BENCH_DIR/randomness (default
``bench-data/randomness``), made once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import REPO, shown  # noqa: E402

BATCH = 256


def store(data: Path, records: int, classes: int) -> Path:
    """The class-sorted label store, written once."""
    import zring

    path = data / f"labels-sorted-{records}-{classes}"
    if not path.exists():
        labels = (np.arange(records, dtype=np.int64) * classes) // records
        zring.write_dataset(str(path), labels)
    return path


def measure(path: Path, mode: int, seed: int, cycles: int, block: int | None, window: int | None) -> dict:
    """Distinct classes per batch and |Spearman rho| of position vs index."""
    import zring

    ds = zring.Dataset(str(path))
    n = len(ds)
    steps = n // BATCH
    kw = {} if mode != 3 else {"block_records": block, "window_blocks": window}
    dl = zring.DataLoader({"y": ds}, batch_size=BATCH, mode=mode, seed=seed, num_workers=2, **kw)
    distinct, rhos = [], []
    try:
        for _ in range(cycles):
            order = np.empty(steps * BATCH, dtype=np.int64)
            for k in range(steps):
                b = next(dl)
                y = np.asarray(b["y"]).reshape(-1)
                distinct.append(len(np.unique(y)))
                order[k * BATCH:(k + 1) * BATCH] = dl.last_indices
            # Positions are ranks already; indices of a cycle are distinct,
            # so their ranks are their order statistics.
            ranks = np.empty(len(order), dtype=np.float64)
            ranks[np.argsort(order, kind="stable")] = np.arange(len(order))
            pos = np.arange(len(order), dtype=np.float64)
            rhos.append(abs(float(np.corrcoef(pos, ranks)[0, 1])))
    finally:
        dl.close()
    return {"distinct": statistics.mean(distinct), "rho": statistics.mean(rhos)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=471_859, help="records (default: the cold store's)")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--block", type=int, default=86, help="mode 3 block_records (default 86: 1 MiB of 12 KiB)")
    ap.add_argument("--windows", default="8,32,64,128,256,512,1024",
                    help="mode 3 window_blocks to try (comma-separated)")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="default bench-results/randomness.md")
    args = ap.parse_args()
    data = args.data or Path(os.environ.get("ZRING_BENCH_DIR", REPO / "bench-data")) / "randomness"
    data.mkdir(parents=True, exist_ok=True)
    path = store(data, args.records, args.classes)
    seeds = range(1, args.seeds + 1)

    def over_seeds(mode: int, window: int | None) -> dict:
        runs = [measure(path, mode, s, args.cycles, args.block, window) for s in seeds]
        return {k: statistics.mean(r[k] for r in runs) for k in runs[0]}

    base = over_seeds(2, None)
    rows = [("mode 2 (cyclic)", None, base)]
    for w in (int(x) for x in args.windows.split(",")):
        r = over_seeds(3, w)
        rows.append((f"mode 3, window {w} blocks", w, r))
        print(f"  window {w}: distinct {r['distinct']:.1f} ({r['distinct'] / base['distinct']:.3f} of mode 2), "
              f"|rho| {r['rho']:.4f}", file=sys.stderr, flush=True)
    lines = [
        f"## Randomness of mode 3 against mode 2 on a class-sorted store",
        "",
        f"Store: {args.records} int64 labels sorted by class ({args.classes} classes of equal size). "
        f"DataLoader batch {BATCH}, {args.cycles} whole cycles per run, seeds {list(seeds)} (means over them). "
        f"Mode 3 blocks: {args.block} records (what 1 MiB holds of 12 KiB records); a window of W blocks "
        f"holds {args.block} × W records ({args.block} × W × 12 KiB of images).",
        "",
        "| order | records per window | distinct classes per batch of 256 | ÷ mode 2 | mean abs Spearman rho (position, index) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, w, r in rows:
        per = "all" if w is None else f"{args.block * w:,}"
        lines.append(f"| {label} | {per} | {r['distinct']:.1f} | {r['distinct'] / base['distinct']:.3f} | "
                     f"{r['rho']:.4f} |")
    argv = " ".join(sys.argv[1:])
    lines += ["", f"Command: `python benches/randomness.py{(' ' + argv) if argv else ''}`. Data: {shown(path)}."]
    text = "\n".join(lines) + "\n"
    print(text)
    common.write_result(args.out or REPO / "bench-results" / "randomness.md", text)


if __name__ == "__main__":
    main()
