"""Datasets of parts under the conditions users run them in: a campaign.

    .venv/bin/python scripts/parts_campaign.py [--dir DIR] [--seconds 60] [--phase all|readers|damage|writers]

Three phases, each in its own folder under ``DIR`` (default: a fresh
temporary directory, removed at the end):

``readers``
    One writer process keeps committing new parts (``mode="append"``, one part
    a commit) while three reader processes, rank 0, 1 and 2 of 3, loop: open
    ``Dataset(path, rank_parts=(r, 3))`` (and the whole dataset), check that
    it holds exactly the records of the manifest generation it opened (the
    rank's parts of that generation, every record the value it was written
    with), run a ``DataLoader(..., rank_parts=(r, 3))`` for a few steps, save
    its state, resume a new loader from it (same batches), and resume the
    same state over the dataset opened again after later commits (the saved
    cycle goes on unchanged). Each reader also keeps the dataset it opened
    first, and reads all of it again at every round while the writer
    commits. Rank 2 runs as uid 65534 (``setpriv``) when the script runs as
    root; the dataset is written with group/other read permissions (umask
    022). A ``yes > /dev/null`` process keeps a core busy beside them. Any
    exception, torn manifest, wrong record or differing resume is a failure.

``damage``
    A dataset damaged in each way a user meets (a part folder missing, a
    chunk file of a part truncated, the manifest edited by hand, a part of
    another dtype committed, a part committed to another dataset, twice, in
    one call twice, after its staged folder was removed, an append while a
    part is missing): each must raise a zring or Python exception that names
    the part (or the manifest) and says what to do, and afterwards every
    part written is still there (committed, or staged for a commit again).

``writers``
    Two processes each write and commit ``--commits`` parts, one part a
    commit, at the same time. Every commit must either land or be refused
    with an exception saying what to do; at the end every part whose commit
    returned is in the manifest, and a refused part is still staged.

Prints a table of the checks and exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

import zring
from zring import parts

RANKS = 3
BATCH = 8


def part_rows(k: int) -> int:
    """Records in part number ``k`` (varied, so that the rank plan is not trivial)."""
    return 12 + (k * 7) % 23


def part_start(k: int) -> int:
    """Dataset index of part ``k``'s first record: the sum of the parts before it."""
    return sum(part_rows(j) for j in range(k))


def part_data(k: int) -> np.ndarray:
    """Part ``k``'s records: ``[id, k]`` (int64), ids the dataset's indices."""
    ids = np.arange(part_start(k), part_start(k) + part_rows(k), dtype=np.int64)
    return np.stack([ids, np.full_like(ids, k)], axis=1)


# --------------------------------------------------------------------------- readers phase


def role_writer(root: str, seconds: float, first: int) -> int:
    """Commit one part at a time (numbers ``first``, ``first + 1``, ...) until ``seconds`` pass."""
    end = time.monotonic() + seconds
    k = first
    while time.monotonic() < end:
        info = parts.write_part(root, part_data(k))
        parts.commit(root, [info], mode="append")
        k += 1
    print(json.dumps({"role": "writer", "commits": k - first, "parts": k}))
    return 0


def _expected(ds) -> tuple[int, np.ndarray, list[int]]:
    """The generation ``ds`` opened, the records its parts must hold, and their numbers."""
    store = ds._store
    listed = store.parts_list()
    numbers = [int(p["number"]) for p in listed]
    rows = np.concatenate([part_data(k) for k in numbers]) if numbers else np.zeros((0, 2), np.int64)
    return int(store.generation), rows, numbers


def _check_open(ds, rank: int | None, initial: int) -> tuple[int, np.ndarray, list[int]]:
    """``ds`` holds exactly its generation's records (the rank's parts of them)."""
    gen, rows, numbers = _expected(ds)
    # Generation 1 committed ``initial`` parts, every later one a part more.
    count = initial + gen - 1
    if rank is None:
        want = list(range(count))
    else:
        # The plan of the newest manifest: prefix-stable, so its first ``count`` parts are planned as
        # they were at this generation.
        plan = zring._zring.rank_plan(str(ds.path), RANKS)
        want = [n for n, (_dir, _records, r, _bytes) in enumerate(plan) if r == rank and n < count]
    if numbers != want:
        raise AssertionError(f"generation {gen}: parts {numbers}, expected {want}")
    if len(ds) != len(rows):
        raise AssertionError(f"generation {gen}: {len(ds)} records, the parts list {len(rows)}")
    got = ds[np.arange(len(ds))]
    if not np.array_equal(got, rows):
        bad = int(np.flatnonzero((got != rows).any(axis=1))[0])
        raise AssertionError(f"generation {gen}: record {bad} is {got[bad].tolist()}, wrote {rows[bad].tolist()}")
    return gen, rows, numbers


def _batches(dl, n: int) -> list[np.ndarray]:
    return [next(dl)["x"].copy() for _ in range(n)]


def role_reader(root: str, rank: int, seconds: float, initial: int, out: str) -> int:
    end = time.monotonic() + seconds
    report = {"rank": rank, "uid": os.getuid(), "rounds": 0, "generations": [], "resumes": 0,
              "grown_resumes": 0, "held_reads": 0, "failures": []}
    held = None
    saved = None  # (state, the batches after it, the generation it was saved at)
    try:
        while time.monotonic() < end:
            ds = zring.Dataset(root, rank_parts=(rank, RANKS))
            gen, rows, numbers = _check_open(ds, rank, initial)
            whole = zring.Dataset(root)
            _check_open(whole, None, initial)
            whole.close()
            report["generations"].append(gen)
            if held is None:
                held = (ds, rows)
            # The dataset opened first, read again while the writer commits.
            hds, hrows = held
            if not np.array_equal(hds[np.arange(len(hds))], hrows):
                raise AssertionError("the dataset held since the first round reads other records")
            report["held_reads"] += 1
            ids = rows[:, 0]
            with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=2, seed=rank,
                                  rank_parts=(rank, RANKS)) as dl:
                before = _batches(dl, 2)
                for b in before:
                    if not np.isin(b[:, 0], ids).all():
                        raise AssertionError(f"generation {gen}: a batch holds records of another rank's parts")
                state = json.loads(json.dumps(dl.state()))  # as a file would keep it
                after = _batches(dl, 2)
            with zring.DataLoader({"x": ds}, state=state) as dl:
                if not all(np.array_equal(a, b) for a, b in zip(after, _batches(dl, 2))):
                    raise AssertionError(f"generation {gen}: the resumed loader's batches differ")
            report["resumes"] += 1
            cycle = len(ds) // BATCH
            if saved is not None and saved[2] < gen:
                # A state saved over an older generation, resumed over this one: the saved
                # cycle goes on unchanged (the steps after it are still in that cycle).
                st, want, _ = saved
                with zring.DataLoader({"x": ds}, state=st) as dl:
                    if not all(np.array_equal(a, b) for a, b in zip(want, _batches(dl, len(want)))):
                        raise AssertionError(f"generation {gen}: a state of generation {saved[2]} resumed otherwise")
                report["grown_resumes"] += 1
                saved = None
            if saved is None and cycle >= 6:
                saved = (state, after, gen)
            if ds is not held[0]:
                ds.close()
            report["rounds"] += 1
    except Exception as e:  # noqa: BLE001 - every exception is a finding
        report["failures"].append(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


def phase_readers(base: Path, seconds: float) -> list[tuple[str, bool, str]]:
    root = base / "readers" / "corpus"
    root.parent.mkdir(parents=True)
    os.chmod(base, 0o755)
    os.chmod(root.parent, 0o777)  # the readers' reports, uid 65534's included
    os.umask(0o022)
    initial = 4
    parts.commit(root, [parts.write_part(root, part_data(k)) for k in range(initial)])
    me = [sys.executable, os.path.abspath(__file__)]
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
    procs = []
    try:
        writer = subprocess.Popen([*me, "_writer", str(root), str(seconds), str(initial)],
                                  stdout=subprocess.PIPE, text=True)
        for r in range(RANKS):
            cmd = [*me, "_reader", str(root), str(r), str(seconds), str(initial), str(root.parent / f"r{r}.json")]
            if r == RANKS - 1 and os.getuid() == 0 and shutil.which("setpriv"):
                cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env={**os.environ, "HOME": "/"}))
        wout, _ = writer.communicate(timeout=seconds + 600)
        outs = [p.communicate(timeout=seconds + 600) for p in procs]
    finally:
        busy.send_signal(signal.SIGTERM)
        busy.wait()
    results = []
    wrote = json.loads(wout.strip().splitlines()[-1]) if writer.returncode == 0 else {}
    results.append(("readers: writer commits one part at a time", writer.returncode == 0,
                    f"{wrote.get('commits', '?')} commits, {wrote.get('parts', '?')} parts"))
    for r, (p, (o, e)) in enumerate(zip(procs, outs)):
        rep_path = root.parent / f"r{r}.json"
        if p.returncode != 0 or not rep_path.exists():
            results.append((f"readers: rank {r}", False, f"exit {p.returncode}: {e.strip()[-800:]}"))
            continue
        rep = json.loads(rep_path.read_text())
        gens = rep["generations"]
        ok = not rep["failures"] and rep["rounds"] > 0
        detail = (f"uid {rep['uid']}: {rep['rounds']} rounds over generations {min(gens, default=0)}.."
                  f"{max(gens, default=0)}, {rep['resumes']} resumes, {rep['grown_resumes']} over a later "
                  f"generation, {rep['held_reads']} reads of the dataset held")
        if rep["failures"]:
            detail += "; FAILED: " + rep["failures"][0][:1500]
        results.append((f"readers: rank {r} of {RANKS}", ok, detail))
    return results


# --------------------------------------------------------------------------- overwrite phase


def role_overwriter(root: str, seconds: float, keep: int) -> int:
    """Commit ``mode="overwrite"`` again and again: the newest ``keep`` parts, one new each time."""
    end = time.monotonic() + seconds
    infos = [parts.write_part(root, part_data(k)) for k in range(keep)]
    parts.commit(root, infos, mode="overwrite")
    k = keep
    while time.monotonic() < end:
        infos = infos[1:] + [parts.write_part(root, part_data(k))]
        parts.commit(root, infos, mode="overwrite")
        k += 1
    print(json.dumps({"role": "overwriter", "commits": k - keep + 1}))
    return 0


def _consistent(rows: np.ndarray) -> None:
    """``rows`` are whole parts, each ``part_data(k)`` for its ``k``."""
    at = 0
    while at < len(rows):
        k = int(rows[at, 1])
        want = part_data(k)
        if not np.array_equal(rows[at:at + len(want)], want):
            raise AssertionError(f"part {k} at row {at} holds other records")
        at += len(want)


def role_overwrite_reader(root: str, rank: int, seconds: float, out: str) -> int:
    end = time.monotonic() + seconds
    rep = {"rank": rank, "opens": 0, "stale": 0, "held_reads": 0, "failures": []}
    held = None
    try:
        while time.monotonic() < end:
            for rp in (None, (rank, RANKS)):
                ds = zring.Dataset(root, rank_parts=rp)
                rows = ds[np.arange(len(ds))]
                _consistent(rows if rp is None else rows[np.argsort(rows[:, 0], kind="stable")])
                rep["opens"] += 1
                if held is None:
                    held = (ds, rows)
                elif ds is not held[0]:
                    ds.close()
            try:
                if not np.array_equal(held[0][np.arange(len(held[0]))], held[1]):
                    raise AssertionError("a dataset held across overwrites reads other records")
                rep["held_reads"] += 1
            except zring.StaleError:
                rep["stale"] += 1  # told to reopen: the generation it read is gone
                held = None
    except Exception as e:  # noqa: BLE001
        rep["failures"].append(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(out, "w") as f:
        json.dump(rep, f)
    return 0


def phase_overwrite(base: Path, seconds: float) -> list[tuple[str, bool, str]]:
    root = base / "overwrite" / "corpus"
    root.parent.mkdir(parents=True)
    me = [sys.executable, os.path.abspath(__file__)]
    keep = 6
    parts.commit(root, [parts.write_part(root, part_data(k)) for k in range(keep)])
    writer = subprocess.Popen([*me, "_overwriter", str(root), str(seconds), str(keep)], stdout=subprocess.PIPE,
                              text=True)
    procs = [subprocess.Popen([*me, "_oreader", str(root), str(r), str(seconds), str(root.parent / f"o{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(RANKS)]
    wout, _ = writer.communicate(timeout=seconds + 600)
    outs = [p.communicate(timeout=seconds + 600) for p in procs]
    results = [("overwrite: writer commits mode=overwrite", writer.returncode == 0, (wout or "").strip())]
    for r, (p, (o, e)) in enumerate(zip(procs, outs)):
        path = root.parent / f"o{r}.json"
        if p.returncode != 0 or not path.exists():
            results.append((f"overwrite: reader {r}", False, f"exit {p.returncode}: {e.strip()[-800:]}"))
            continue
        rep = json.loads(path.read_text())
        detail = (f"{rep['opens']} opens (whole and rank {r} of {RANKS}), {rep['held_reads']} reads of a held "
                  f"dataset, {rep['stale']} StaleError (its generation removed: reopen)")
        if rep["failures"]:
            detail += "; FAILED: " + rep["failures"][0][:1500]
        results.append((f"overwrite: reader {r}", not rep["failures"], detail))
    return results


# --------------------------------------------------------------------------- crash phase


def phase_crash(base: Path, rounds: int) -> list[tuple[str, bool, str]]:
    """Committers killed (SIGKILL) at random points; then one commit: nothing lost, nothing left over."""
    root = base / "crash" / "corpus"
    parts.commit(root, [parts.write_part(root, part_data(0))])
    me = [sys.executable, os.path.abspath(__file__)]
    rng = np.random.default_rng(0)
    for i in range(rounds):
        p = subprocess.Popen([*me, "_committer", str(root), str(i % 2), "1000", str(root.parent / "c.json")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.5, 2.0)))
        p.kill()
        p.wait()
    written = {d.name for d in (root / "parts").iterdir()} | {
        d.name for d in (root / "staging").iterdir() if not d.name.startswith(".")}
    try:
        parts.commit(root, [], remove_uncommitted=False)
        listed = {p["dir"].split("/", 1)[1] for p in parts.list_parts(root)}
        staged = {d.name for d in (root / "staging").iterdir() if not d.name.startswith(".")}
        stray = {d.name for d in (root / "parts").iterdir()} - listed
        lost = written - listed - staged
        ok = not lost and not stray
        detail = (f"{rounds} committers killed: {len(listed)} parts committed, {len(staged)} staged (to commit "
                  f"again), {len(stray)} unlisted under parts/, {len(lost)} lost")
        zring.Dataset(root)
    except Exception as e:  # noqa: BLE001
        ok, detail = False, f"{type(e).__name__}: {e}"
    return [("crash: committers killed mid-commit", ok, detail)]


# --------------------------------------------------------------------------- damage phase


def _fresh(base: Path, name: str, n: int = 4) -> tuple[Path, list[str]]:
    root = base / "damage" / name
    infos = [parts.write_part(root, part_data(k)) for k in range(n)]
    parts.commit(root, infos)
    return root, [i.name for i in infos]


def _raises(fn, *needles: str) -> tuple[bool, str]:
    """Whether ``fn()`` raises an exception whose message holds every needle; the message."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
        missing = [n for n in needles if n not in msg]
        return not missing, msg + (f"  [missing: {missing}]" if missing else "")
    return False, "no exception"


def _intact(root: Path, names: list[str]) -> tuple[bool, str]:
    """Every part named is committed and reads the records it was written with."""
    try:
        ds = zring.Dataset(root)
        listed = [p["dir"].split("/", 1)[1] for p in ds._store.parts_list()]
        if listed != names:
            return False, f"manifest lists {listed}, expected {names}"
        want = np.concatenate([part_data(k) for k in range(len(names))])
        if not np.array_equal(ds[np.arange(len(ds))], want):
            return False, "records differ"
        return True, "all parts committed and intact"
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"


def phase_damage(base: Path) -> list[tuple[str, bool, str]]:
    out: list[tuple[str, bool, str]] = []

    def case(name: str, ok: bool, detail: str) -> None:
        out.append((f"damage: {name}", ok, detail))

    # A part folder missing: opening names it; put back, all is there.
    root, names = _fresh(base, "missing")
    gone = root / "parts" / names[1]
    aside = root.parent / "missing-aside"
    os.rename(gone, aside)
    ok, msg = _raises(lambda: zring.Dataset(root), names[1], "restore")
    # An append while it is missing: refused, and the new part is not lost.
    info = parts.write_part(root, part_data(4))
    ok2, msg2 = _raises(lambda: parts.commit(root, [info]), names[1])
    os.rename(aside, gone)
    ok3, msg3 = _intact(root, names)
    staged = (root / "staging" / info.name).is_dir() or (root / "parts" / info.name).is_dir()
    if staged:
        try:
            parts.commit(root, [info])
            ok4, msg4 = _intact(root, [*names, info.name])
        except Exception as e:  # noqa: BLE001
            ok4, msg4 = False, f"commit again: {type(e).__name__}: {e}"
    else:
        ok4, msg4 = False, "the refused part's files are gone"
    case("a part folder missing: opening", ok, msg)
    case("a part folder missing: an append meanwhile", ok2, msg2)
    case("a part folder missing: put back", ok3, msg3)
    case("a part folder missing: the refused append's part, committed again", ok4, msg4)

    # A truncated chunk file of a part: opening or reading names the part.
    root, names = _fresh(base, "truncated")
    pdir = root / "parts" / names[2]
    chunks = sorted(pdir.glob("chunk-*"))
    victim = max(chunks, key=lambda p: p.stat().st_size) if chunks else None
    if victim is None:
        case("a chunk file truncated", False, f"no chunk file found in {sorted(os.listdir(pdir))}")
    else:
        saved = victim.read_bytes()
        with open(victim, "r+b") as f:
            f.truncate(len(saved) // 2)

        def read_all():
            ds = zring.Dataset(root)
            ds[np.arange(len(ds))]
            return ds
        ok, msg = _raises(read_all, names[2])
        case(f"a chunk file truncated ({victim.relative_to(pdir)})", ok, msg)
        plan = parts.rank_plan(root, 2)
        other = 0 if f"parts/{names[2]}" not in plan[0] else 1
        try:
            rp = zring.Dataset(root, rank_parts=(other, 2))
            rp[np.arange(len(rp))]
            case("a chunk file truncated: the rank without that part reads", True, f"rank {other}: {len(rp)} records")
        except Exception as e:  # noqa: BLE001
            case("a chunk file truncated: the rank without that part reads", False, f"{type(e).__name__}: {e}")
        victim.write_bytes(saved)
        case("a chunk file truncated: put back", *_intact(root, names))

    # The manifest edited by hand (its checksum no longer matches).
    root, names = _fresh(base, "manifest")
    m = root / "manifest.json"
    good = m.read_bytes()
    m.write_text(good.decode().replace(f'"records": {part_rows(0)}', f'"records": {part_rows(0) + 1}', 1))
    ok, msg = _raises(lambda: zring.Dataset(root), "manifest.json")
    case("the manifest edited by hand: opening", ok, msg)
    info = parts.write_part(root, part_data(4))
    ok, msg = _raises(lambda: parts.commit(root, [info]), "manifest.json")
    case("the manifest edited by hand: a commit", ok, msg)
    m.write_text("{ not json")
    ok, msg = _raises(lambda: parts.commit(root, [info]), "manifest.json")
    case("the manifest not JSON: a commit", ok, msg)
    ok, msg = _raises(lambda: parts.list_parts(root), "manifest.json")
    case("the manifest not JSON: list_parts", ok, msg)
    ok, msg = _raises(lambda: parts.rank_plan(root, 2), "manifest.json")
    case("the manifest not JSON: rank_plan", ok, msg)
    m.write_bytes(good)
    still = (root / "staging" / info.name).is_dir() or (root / "parts" / info.name).is_dir()
    if still:
        parts.commit(root, [info])
        case("the manifest put back: the refused part committed", *_intact(root, [*names, info.name]))
    else:
        case("the manifest put back: the refused part committed", False, "the refused part's files are gone")

    # A part of another dtype.
    root, names = _fresh(base, "dtype")
    bad = parts.write_part(root, part_data(4).astype(np.int32))
    ok, msg = _raises(lambda: parts.commit(root, [bad]), bad.name, "dtype")
    case("a part of another dtype: commit", ok, msg)
    good_info = parts.write_part(root, part_data(4))
    parts.commit(root, [good_info])
    kept = (root / "staging" / bad.name).is_dir()
    case("a part of another dtype: its files kept after the next commit", kept,
         "staged again" if kept else "removed by the next commit (the refused part is lost)")
    case("a part of another dtype: the dataset", *_intact(root, [*names, good_info.name]))

    # A part written for another dataset.
    root, names = _fresh(base, "other")
    other = base / "damage" / "other-b"
    info = parts.write_part(other, part_data(4))
    ok, msg = _raises(lambda: parts.commit(root, [info]), info.name, str(other))
    case("a part written for another dataset, committed here", ok, msg)
    case("a part written for another dataset: still staged there", (other / "staging" / info.name).is_dir(), "")

    # Committed twice (a retried commit) and listed twice in one commit.
    root, names = _fresh(base, "twice")
    info = parts.write_part(root, part_data(4))
    g1 = parts.commit(root, [info])
    try:
        g2 = parts.commit(root, [info])
        case("a part committed twice", True, f"generations {g1}, {g2}; " + _intact(root, [*names, info.name])[1])
    except Exception as e:  # noqa: BLE001
        case("a part committed twice", False, f"{type(e).__name__}: {e}")
    info2 = parts.write_part(root, part_data(5))
    ok, msg = _raises(lambda: parts.commit(root, [info2, info2]), info2.name)
    case("a part listed twice in one commit", ok, msg)
    info3 = parts.write_part(root, part_data(5))
    parts.commit(root, [info3])
    kept = (root / "staging" / info2.name).is_dir()
    case("a part listed twice in one commit: its files after the next commit", kept,
         "staged again" if kept else "removed by the next commit (the part is lost)")

    # Committed after its staged folder was removed.
    root, names = _fresh(base, "unstaged")
    info = parts.write_part(root, part_data(4))
    shutil.rmtree(root / "staging" / info.name)
    ok, msg = _raises(lambda: parts.commit(root, [info]), info.name, "write it again")
    case("a part committed after its staged folder was removed", ok, msg)
    case("  ... the dataset", *_intact(root, names))
    return out


# --------------------------------------------------------------------------- writers phase


def role_committer(root: str, tag: int, commits: int, out: str) -> int:
    rep = {"tag": tag, "landed": [], "refused": [], "crashed": []}
    for c in range(commits):
        k = 1000 * (tag + 1) + c
        try:
            info = parts.write_part(root, part_data(k))
        except Exception as e:  # noqa: BLE001
            rep["crashed"].append(f"write_part: {type(e).__name__}: {e}")
            continue
        try:
            parts.commit(root, [info], mode="append")
            rep["landed"].append(info.name)
        except Exception as e:  # noqa: BLE001
            rep["refused"].append([info.name, f"{type(e).__name__}: {e}"])
    with open(out, "w") as f:
        json.dump(rep, f)
    return 0


def phase_writers(base: Path, commits: int) -> list[tuple[str, bool, str]]:
    root = base / "writers" / "corpus"
    parts.commit(root, [parts.write_part(root, part_data(0))])
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [subprocess.Popen([*me, "_committer", str(root), str(t), str(commits), str(root.parent / f"w{t}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for t in range(2)]
    outs = [p.communicate(timeout=1800) for p in procs]
    results = []
    listed = {p["dir"].split("/", 1)[1] for p in parts.list_parts(root)}
    for t, (p, (o, e)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            results.append((f"writers: writer {t}", False, f"exit {p.returncode}: {e.strip()[-800:]}"))
            continue
        rep = json.loads((root.parent / f"w{t}.json").read_text())
        lost = [n for n in rep["landed"] if n not in listed]
        refused_gone = [n for n, _ in rep["refused"] if not (root / "staging" / n).is_dir() and n not in listed]
        ok = not lost and not rep["crashed"] and not refused_gone and not rep["refused"]
        detail = (f"{len(rep['landed'])} of {commits} commits landed, {len(rep['refused'])} refused, "
                  f"{len(rep['crashed'])} writes crashed; {len(lost)} landed but not listed, "
                  f"{len(refused_gone)} refused and their files gone")
        if rep["refused"]:
            detail += "; first refusal: " + rep["refused"][0][1][:400]
        if rep["crashed"]:
            detail += "; first crash: " + rep["crashed"][0][:400]
        results.append((f"writers: writer {t} of 2", ok, detail))
    try:
        zring.Dataset(root)[np.arange(0)]
        results.append(("writers: the dataset opens", True, f"{len(listed)} parts"))
    except Exception as e:  # noqa: BLE001
        results.append(("writers: the dataset opens", False, f"{type(e).__name__}: {e}"))
    return results


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        role, args = sys.argv[1], sys.argv[2:]
        if role == "_writer":
            return role_writer(args[0], float(args[1]), int(args[2]))
        if role == "_reader":
            return role_reader(args[0], int(args[1]), float(args[2]), int(args[3]), args[4])
        if role == "_overwriter":
            return role_overwriter(args[0], float(args[1]), int(args[2]))
        if role == "_oreader":
            return role_overwrite_reader(args[0], int(args[1]), float(args[2]), args[3])
        if role == "_committer":
            return role_committer(args[0], int(args[1]), int(args[2]), args[3])
        raise SystemExit(f"unknown role {role}")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed at the end)")
    ap.add_argument("--seconds", type=float, default=60.0, help="readers phase: how long the writer commits")
    ap.add_argument("--commits", type=int, default=40, help="writers phase: commits per writer")
    ap.add_argument("--kills", type=int, default=12, help="crash phase: committers killed")
    ap.add_argument("--phase", choices=["all", "readers", "overwrite", "crash", "damage", "writers"], default="all")
    a = ap.parse_args()
    tmp = None
    if a.dir:
        base = Path(a.dir)
        base.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="campaign-", dir=base))
    else:
        tmp = tempfile.TemporaryDirectory()
        base = Path(tmp.name)
    results: list[tuple[str, bool, str]] = []
    try:
        if a.phase in ("all", "damage"):
            results += phase_damage(base)
        if a.phase in ("all", "writers"):
            results += phase_writers(base, a.commits)
        if a.phase in ("all", "crash"):
            results += phase_crash(base, a.kills)
        if a.phase in ("all", "overwrite"):
            results += phase_overwrite(base, a.seconds / 3)
        if a.phase in ("all", "readers"):
            results += phase_readers(base, a.seconds)
    finally:
        if tmp is not None:
            tmp.cleanup()
        else:
            shutil.rmtree(base, ignore_errors=True)
    print("| check | result | detail |\n| --- | --- | --- |")
    for name, ok, detail in results:
        print(f"| {name} | {'ok' if ok else 'FAIL'} | {detail.replace('|', '/').replace(chr(10), ' ')} |")
    failed = sum(not ok for _, ok, _ in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
