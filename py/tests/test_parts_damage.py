"""Datasets of parts damaged, misused and written by two processes at once
(the campaign of scripts/parts_campaign.py, as tests): every refusal names the
part or the manifest and says what to do, and no part written is lost, not
to a refused commit, nor to another writer's commit, nor to a commit that
died before its manifest. A reader holding a generation that an overwrite
removed is told to reopen."""

import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import zring
from zring import parts

PER = 11


def _rows(k: int) -> np.ndarray:
    ids = np.arange(k * PER, (k + 1) * PER, dtype=np.int64)
    return np.stack([ids, -ids], axis=1)


def _dataset(tmp_path, n=3, name="d"):
    root = str(tmp_path / name)
    infos = [parts.write_part(root, _rows(k)) for k in range(n)]
    parts.commit(root, infos)
    return root, [i.name for i in infos]


def _staged(root):
    return sorted(os.listdir(os.path.join(root, "staging")))


def _reads(root, n):
    ds = zring.Dataset(root)
    assert np.array_equal(ds[np.arange(len(ds))], np.concatenate([_rows(k) for k in range(n)]))


def test_another_writers_staged_part_survives_a_commit(tmp_path):
    """Two drivers: B commits while A's part is staged and not yet committed."""
    root, _ = _dataset(tmp_path)
    a = parts.write_part(root, _rows(3))
    b = parts.write_part(root, _rows(4))
    parts.commit(root, [b])
    assert a.name in _staged(root), "a commit removed another writer's staged part"
    parts.commit(root, [a])
    assert [p["dir"] for p in parts.list_parts(root)][-2:] == [f"parts/{b.name}", f"parts/{a.name}"]


def test_leftovers_of_no_job_go_only_at_the_age_asked(tmp_path):
    """Nothing proves a job-less part's writer gone, so no commit removes it
    unless asked for parts of an age (its writer's driver may commit it a
    day later)."""
    root, _ = _dataset(tmp_path)
    old = parts.write_part(root, _rows(3))
    young = parts.write_part(root, _rows(4))
    hour_ago = time.time() - 3600 - 5
    os.utime(os.path.join(root, "staging", old.name), (hour_ago, hour_ago))
    parts.commit(root, [])
    assert _staged(root) == sorted([old.name, young.name]), "a default commit removes no job-less part"
    parts.commit(root, [], remove_uncommitted=False)
    assert _staged(root) == sorted([old.name, young.name])
    parts.commit(root, [], remove_uncommitted=3600)
    assert _staged(root) == [young.name]
    parts.commit(root, [], remove_uncommitted=0)
    assert _staged(root) == []
    with pytest.raises(ValueError, match="remove_uncommitted"):
        parts.commit(root, [], remove_uncommitted=-1)


def test_a_part_being_written_is_not_removed_even_at_once(tmp_path):
    """remove_uncommitted=0 removes what is staged, but not a store being
    built by a live writer; one whose writer is gone goes."""
    root, _ = _dataset(tmp_path)
    staging = os.path.join(root, "staging")
    live = os.path.join(staging, f".p-0123.{os.getpid()}-1.partial")
    dead_pid = _dead_pid()
    dead = os.path.join(staging, f".p-0124.{dead_pid}-1.partial")
    os.makedirs(live)
    os.makedirs(dead)
    parts.commit(root, [], remove_uncommitted=0)
    assert os.path.isdir(live), "a live writer's store being built"
    assert not os.path.exists(dead), "a dead writer's leftover"


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_live_jobs_parts_stay_and_a_dead_jobs_go(tmp_path):
    """A job's finished parts stay while any process holds the job, however
    old; once the job is gone the next commit removes them."""
    root, _ = _dataset(tmp_path)
    job = parts.Job(root)
    mine = parts.write_part(root, _rows(3), job=job.id)
    hour_ago = time.time() - 10 * 3600
    os.utime(os.path.join(root, "staging", mine.name), (hour_ago, hour_ago))
    other = parts.write_part(root, _rows(4))
    parts.commit(root, [other], remove_uncommitted=0)
    assert _staged(root) == [mine.name], "another writer's commit keeps a live job's part"
    # The job dies (its driver releases the lock without ending the job).
    job._hold.close()
    job._hold = None
    parts.commit(root, [])
    assert _staged(root) == [], "a dead job's part goes"
    # A job that commits removes its own leftovers and its lock.
    with parts.Job(root) as job2:
        keep = parts.write_part(root, _rows(5), job=job2)
        drop = parts.write_part(root, _rows(6), job=job2)
        job2.commit([keep])
        assert _staged(root) == [], f"{drop.name}: a job's commit removes its own leftover"
    assert os.listdir(os.path.join(root, "staging")) == []
    # A job left without committing removes what it staged.
    with parts.Job(root) as job3:
        parts.write_part(root, _rows(7), job=job3)
    assert os.listdir(os.path.join(root, "staging")) == []
    assert f"parts/{keep.name}" in [p["dir"] for p in parts.list_parts(root)]


def _commit_many(args):
    root, tag, n, start = args
    start.wait()
    names = []
    for c in range(n):
        info = parts.write_part(root, _rows(100 * tag + c))
        parts.commit(root, [info])
        names.append(info.name)
    return names


def test_two_processes_committing_at_once_both_land(tmp_path):
    root, first = _dataset(tmp_path, n=1)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as m:
        start = m.Event()
        with ctx.Pool(2) as pool:
            res = pool.map_async(_commit_many, [(root, t, 12, start) for t in (1, 2)])
            start.set()
            a, b = res.get(timeout=300)
    listed = [p["dir"].split("/", 1)[1] for p in parts.list_parts(root)]
    assert sorted(listed) == sorted(first + a + b), "every commit landed, no part lost"
    # Each writer's parts in its own order.
    assert [n for n in listed if n in a] == a and [n for n in listed if n in b] == b
    assert len(zring.Dataset(root)) == 25 * PER


def test_a_refused_commit_leaves_its_parts_staged(tmp_path):
    root, names = _dataset(tmp_path)
    bad = parts.write_part(root, _rows(3).astype(np.int32))
    good = parts.write_part(root, _rows(3))
    with pytest.raises(zring.CorruptError, match=f"{bad.name}.*dtype or shape differs; write it again"):
        parts.commit(root, [good, bad])
    assert _staged(root) == sorted([bad.name, good.name]), "both parts staged again"
    assert sorted(os.listdir(os.path.join(root, "parts"))) == sorted(names)
    parts.commit(root, [good])
    assert bad.name in _staged(root), "the next commit keeps the refused part"
    _reads(root, 4)


def test_a_part_given_twice_is_refused_and_kept(tmp_path):
    root, _ = _dataset(tmp_path)
    info = parts.write_part(root, _rows(3))
    with pytest.raises(ValueError, match=f"part {info.name} is given twice"):
        parts.commit(root, [info, info])
    parts.commit(root, [parts.write_part(root, _rows(3))])
    assert info.name in _staged(root)
    # Committed twice in two commits (a retried commit): harmless.
    root2, _ = _dataset(tmp_path, name="e")
    info = parts.write_part(root2, _rows(3))
    assert parts.commit(root2, [info]) + 1 == parts.commit(root2, [info])
    _reads(root2, 4)


def test_a_part_committed_to_another_dataset_names_both(tmp_path):
    root, _ = _dataset(tmp_path)
    other = str(tmp_path / "other")
    info = parts.write_part(other, _rows(3))
    with pytest.raises(ValueError, match=f"{info.name} was written for the dataset {other}, not {root}"):
        parts.commit(root, [info])
    assert _staged(other) == [info.name]
    parts.commit(other, [info])
    # Removed from the staging area: write it again.
    gone = parts.write_part(root, _rows(3))
    shutil.rmtree(os.path.join(root, "staging", gone.name))
    with pytest.raises(ValueError, match=f"{gone.name} is not staged .*write it again"):
        parts.commit(root, [gone])
    _reads(root, 3)


def test_a_damaged_manifest_is_refused_naming_it_and_loses_nothing(tmp_path):
    root, names = _dataset(tmp_path)
    m = os.path.join(root, "manifest.json")
    with open(m, "rb") as f:
        good = f.read()
    info = parts.write_part(root, _rows(3))
    for damaged in [good.replace(f'"records": {PER}'.encode(), f'"records": {PER + 1}'.encode(), 1), b"{ not json"]:
        with open(m, "wb") as f:
            f.write(damaged)
        for call in (lambda: parts.commit(root, [info]), lambda: zring.Dataset(root), lambda: parts.rank_plan(root, 2)):
            with pytest.raises(zring.CorruptError, match="manifest.json.*restore manifest.json from a copy"):
                call()
        assert _staged(root) == [info.name]
    with open(m, "wb") as f:
        f.write(good)
    parts.commit(root, [info])
    _reads(root, 4)


def test_a_missing_or_truncated_part_names_it_and_what_to_do(tmp_path):
    root, names = _dataset(tmp_path)
    folder = os.path.join(root, "parts", names[1])
    aside = str(tmp_path / "aside")
    os.rename(folder, aside)
    with pytest.raises(zring.NotAStoreError, match=f"{names[1]}.*restore the folder parts/{names[1]} from a copy"):
        zring.Dataset(root)
    os.rename(aside, folder)
    chunk = sorted(p for p in os.listdir(folder) if p.startswith("chunk-"))[0]
    path = os.path.join(folder, chunk)
    with open(path, "rb") as f:
        saved = f.read()
    with open(path, "r+b") as f:
        f.truncate(len(saved) // 2)
    with pytest.raises(zring.CorruptError, match=f"{chunk}.*part 1 of the dataset .*restore the folder parts/{names[1]}"):
        zring.Dataset(root)
    with open(path, "wb") as f:
        f.write(saved)
    _reads(root, 3)


def test_parts_of_a_commit_that_died_before_its_manifest_are_staged_again(tmp_path):
    root, _ = _dataset(tmp_path)
    info = parts.write_part(root, _rows(3))
    # A commit killed between moving the part and writing the manifest.
    os.rename(os.path.join(root, "staging", info.name), os.path.join(root, "parts", info.name))
    parts.commit(root, [])
    assert _staged(root) == [info.name]
    parts.commit(root, [info])
    _reads(root, 4)


def test_a_reader_of_a_generation_an_overwrite_dropped_reads_on_then_is_told_to_reopen(tmp_path):
    root, _ = _dataset(tmp_path, n=40)
    # 64 descriptors: a few parts open at a time, so reading the last part opens it again.
    code = textwrap.dedent(f"""
        import os, resource, time, numpy as np, zring
        from zring import parts
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        ds = zring.Dataset({root!r})
        n = len(ds)
        want = np.array([[n - 1, 1 - n]])  # the last record, in part 39 (not read before the overwrite)
        parts.commit({root!r}, [parts.write_part({root!r}, np.zeros((5, 2), np.int64))], mode="overwrite")
        assert len(zring.Dataset({root!r})) == 5
        # The last part, not open since the open checked it, is still there to read.
        assert np.array_equal(ds[[n - 1]], want)
        print("read on")
        # An hour later a commit removes the dropped parts: the old reader is told to reopen.
        marks = os.path.join({root!r}, "dropped")
        hour_ago = time.time() - parts.KEEP_DROPPED - 5
        for m in os.listdir(marks):
            os.utime(os.path.join(marks, m), (hour_ago, hour_ago))
        parts.commit({root!r}, [])
        assert sorted(os.listdir(os.path.join({root!r}, "parts"))) == [p["dir"][6:] for p in parts.list_parts({root!r})]
        assert os.listdir(marks) == []
        try:
            ds[[n - {PER} - 1]]  # in part 38, not open
        except zring.StaleError as e:
            print("stale:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "read on" in out.stdout, out.stdout
    assert "removed by a later commit" in out.stdout and "reopen" in out.stdout, out.stdout


def test_the_schema_is_the_one_read_at_open(tmp_path):
    """Dataset() reads the schema after opening the parts: a part removed meanwhile
    (by an overwrite an hour old) does not make the dataset look like a raw store."""
    root, names = _dataset(tmp_path)
    p = zring._zring.Parts(root)
    text = p.schema()
    shutil.rmtree(os.path.join(root, "parts", names[0]))
    assert p.schema() == text and json.loads(text)["dtype"] == "<i8"
