"""Must-show for mixture schedules (issue 38, item 6).

A DataLoader over two sources whose weights go linearly from 0.7/0.3 to
0.3/0.7 over 1,000 steps of 256 rows, then hold. Checked against the
documented definition (zring._schedule) twice: (a) the pure function of the
step the loader uses, evaluated without a loader
(zring._schedule.allocation: each step's rows per source must be equal);
(b) the rule computed here in NumPy apart from it: after t steps each
source's target is 256 times the integral of its weight from 0 to t, and
(every source having a row per batch or more) the rows so far are the
largest-remainder rounding of the targets, so within one row of them.

1. A run of 1,500 steps: every step's rows per source equal (a) and (b);
   each source's rows so far are within one row of its target.
2. The run's state at step 500, resumed with another schedule (0.1/0.9 at
   step 0 to 0.9/0.1 at step 1,500, on the run's own step axis): steps 500
   to 1,499 are the definition's over the pieces the state now lists (the
   first schedule up to 500, the new one from there), each source's stream
   goes on at the record where the first run left it, and the resumed state
   says so. A second DataLoader seeked straight to step 800 of the changed
   run (its state) gives the same batches.

Run: .venv/bin/python scripts/schedules.py [DIR]   (writes the two sources
under DIR, a temporary directory by default; prints the figures as
Markdown).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring
from zring._schedule import allocation, pieces_targets

B = 256
STEPS = 1500
CHANGE = 500
LENGTHS = (300_000, 200_000)


def hamilton(targets: np.ndarray, rows: int) -> np.ndarray:
    base = np.floor(targets).astype(np.int64)
    left = rows - int(base.sum())
    order = np.lexsort((np.arange(len(targets)), -(targets - base)))
    base[order[:max(left, 0)]] += 1
    return base


def definition(pieces: list[dict], t: int) -> np.ndarray:
    """Rows per source among the first t steps: the documented rule in NumPy."""
    return hamilton(pieces_targets(pieces, t, B), t * B)


def check(pieces: list[dict], t: int, counts: np.ndarray) -> None:
    """Step t's rows per source against (a) and (b)."""
    pure = allocation(pieces, B, (t + 1) * B) - allocation(pieces, B, t * B)
    assert np.array_equal(counts, pure), (t, counts, pure)
    numpy = definition(pieces, t + 1) - definition(pieces, t)
    assert np.array_equal(counts, numpy), (t, counts, numpy)


def run(loader, steps):
    out = []
    for _ in range(steps):
        next(loader)
        out.append((loader.last_step, loader.last_sources.copy(), loader.last_indices.copy()))
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="zring-schedules-"))
    sources = []
    for k, n in enumerate(LENGTHS):
        path = root / f"s{k}"
        if not path.exists():
            zring.write_dataset(path, np.arange(n, dtype=np.int64) * 10 + k)
        sources.append({"x": zring.Dataset(path)})
    first = zring.schedule([(0, [0.7, 0.3]), (1000, [0.3, 0.7])])
    second = zring.schedule([(0, [0.1, 0.9]), (1500, [0.9, 0.1])])
    print("| check | figure |\n|---|---|")

    # 1. The first schedule from step 0.
    with zring.DataLoader(zring.mix(sources, first), batch_size=B, mode=2, seed=7) as dl:
        a = run(dl, CHANGE)
        saved = dl.state()
        a += run(dl, STEPS - CHANGE)
    pieces_a = [{"from": 0, "points": [{"step": s, "weights": list(np.asarray(w) / np.sum(w))}
                                      for s, w in first.corners]}]
    total = np.zeros(2, np.int64)
    worst = np.zeros(2)
    for t, (step, src, _) in enumerate(a):
        assert step == t
        counts = np.bincount(src, minlength=2)
        check(pieces_a, t, counts)
        total += counts
        worst = np.maximum(worst, np.abs(total - pieces_targets(pieces_a, t + 1, B)))
    assert np.all(worst < 1)
    print(f"| steps 0-{STEPS - 1}, first schedule: rows per source per step = (a) pure function = (b) NumPy rule "
          f"| {STEPS} of {STEPS} |")
    print(f"| largest distance of rows so far from the integral (source 0, 1) | {worst[0]:.3f}, {worst[1]:.3f} rows |")
    c0 = np.bincount(a[0][1], minlength=2)
    c999 = np.bincount(a[999][1], minlength=2)
    print(f"| rows at step 0 / step 999 / step 1,499 (source 0) | {c0[0]} / {c999[0]} / "
          f"{np.bincount(a[-1][1], minlength=2)[0]} of {B} |")

    # 2. Resume at step 500 under the second schedule.
    assert saved["sampler"]["step"] == CHANGE and [p["from"] for p in saved["mixture"]["schedule"]] == [0]
    with zring.DataLoader(zring.mix(sources, second), state=saved) as dl:
        b = run(dl, STEPS - CHANGE)
        resumed_state = dl.state()
    pieces = resumed_state["mixture"]["schedule"]
    assert [p["from"] for p in pieces] == [0, CHANGE], pieces
    # The saved run's rows per source at step 500, and where each stream went on.
    at = definition(pieces, CHANGE)
    assert np.array_equal(at, definition(pieces_a, CHANGE))
    assert np.array_equal(allocation(pieces, B, CHANGE * B), allocation(pieces_a, B, CHANGE * B))
    for k in range(2):
        # Each stream goes on where the first run left it: source k's first
        # record of step 500 is the one the first run read there.
        assert a[CHANGE][2][a[CHANGE][1] == k][0] == b[0][2][b[0][1] == k][0], k
    total = definition(pieces, CHANGE).copy()
    worst = np.zeros(2)
    for i, (step, src, _) in enumerate(b):
        t = CHANGE + i
        assert step == t
        counts = np.bincount(src, minlength=2)
        check(pieces, t, counts)
        total += counts
        worst = np.maximum(worst, np.abs(total - pieces_targets(pieces, t + 1, B)))
    assert np.all(worst < 1)
    print(f"| resumed at {CHANGE} with 0.1/0.9 -> 0.9/0.1 over 1,500 steps: rows per source per step = (a) = (b) "
          f"over the state's pieces | {STEPS - CHANGE} of {STEPS - CHANGE} |")
    print(f"| resumed run, largest distance from the integral (source 0, 1) | {worst[0]:.3f}, {worst[1]:.3f} rows |")
    print(f"| rows of source 0 so far at step {CHANGE} (first run = resumed run) | {at[0]} = {at[0]} |")
    print(f"| each stream's first record at step {CHANGE}: first run = resumed run | "
          f"{a[CHANGE][2][a[CHANGE][1] == 0][0]}, {a[CHANGE][2][a[CHANGE][1] == 1][0]} = "
          f"{b[0][2][b[0][1] == 0][0]}, {b[0][2][b[0][1] == 1][0]} |")

    # The changed run seeked: its state at step 800, in a fresh loader.
    seek = dict(resumed_state)
    seek["sampler"] = dict(seek["sampler"], step=800)
    with zring.DataLoader(zring.mix(sources, second), state=seek) as dl:
        c = run(dl, 100)
    same = all(x[0] == y[0] and np.array_equal(x[1], y[1]) and np.array_equal(x[2], y[2])
               for x, y in zip(c, b[300:400]))
    assert same
    print("| changed run seeked to step 800 (fresh loader, same schedule): steps 800-899 equal | 100 of 100 |")
    print(f"\nstate[\"mixture\"][\"schedule\"] after the change: `{json.dumps(pieces)}`")

    # The documented limit: with sources of under a row per batch (the
    # rounding tree), a change may move a source's rows at the change step
    # by a row. How often, over 429 change steps.
    def piece(frm, pts):
        return {"from": frm, "points": [{"step": st, "weights": list(np.asarray(w, float) / np.sum(w))}
                                        for st, w in pts]}
    old = piece(0, [(0, [0.9989, 0.001, 0.0001]), (5000, [0.9898, 0.0002, 0.01])])
    moved, worst, tried = 0, 0, 0
    for t0 in range(1, 3000, 7):
        d = np.abs(allocation([old], B, t0 * B) - allocation([old, piece(t0, [(0, [0.99, 0.005, 0.005])])], B, t0 * B))
        tried, moved, worst = tried + 1, moved + int(d.max() > 0), max(worst, int(d.max()))
    assert worst <= 1
    print(f"\nSmall weights (rounding tree): 0.9989/0.001/0.0001 to 0.9898/0.0002/0.01 over 5,000 steps, changed to "
          f"0.99/0.005/0.005 at {tried} steps t0 (1, 8, ..., 2,997): at {moved} of them a source's rows so far at t0 "
          f"differ from the saved run's, by at most {worst} row (its stream skips or repeats a record there; the "
          f"documented limit). With every source at a row per batch or more in both schedules, never: the "
          f"targets up to t0 are the "
          f"saved run's to the bit, rounded alike (checked at step 500 above).")


if __name__ == "__main__":
    main()
