"""Datasets of parts: written by a pool of workers (a task failing after
writing its files included), committed by the driver, read as one dataset
by everything that reads a dataset, grown by appends under a saved loader
state, and refused, naming the part, when a part is missing or changed."""

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import zring
from zring import cli, parts

PER = 37  # records per part, so batches straddle parts


def _rows(k: int) -> np.ndarray:
    """Part k's records: ids k*PER .. (k+1)*PER, 3 int64 each."""
    ids = np.arange(k * PER, (k + 1) * PER, dtype=np.int64)
    return np.stack([ids, ids * 2, -ids], axis=1)


def _docs(k: int) -> list[np.ndarray]:
    """Part k's token documents: document i holds i % 7 + 1 tokens, all i."""
    return [np.full(i % 7 + 1, i, dtype=np.int32) for i in range(k * PER, (k + 1) * PER)]


def _write_task(args):
    root, k, marker = args
    info = parts.write_part(root, _docs(k))
    if marker is not None and not os.path.exists(marker):
        # The first attempt fails after writing its part: its files stay staged.
        open(marker, "w").close()
        raise RuntimeError(f"task {k} failed after writing")
    return k, info


def test_a_pool_writes_parts_and_the_driver_commits_each_record_once(tmp_path):
    root = str(tmp_path / "corpus")
    n = 8
    marker = str(tmp_path / "failed-once")
    ctx = multiprocessing.get_context("spawn")
    infos = {}
    with ctx.Pool(2) as pool:
        pending = [(root, k, marker if k == 3 else None) for k in range(n)]
        while pending:
            results = [(a, pool.apply_async(_write_task, (a,))) for a in pending]
            pending = []
            for a, r in results:
                try:
                    k, info = r.get(timeout=120)
                    infos[k] = info
                except RuntimeError:
                    pending.append(a)  # retried, as Ray retries a failed task
    assert os.path.exists(marker)
    # The failed attempt's part is staged beside the others, uncommitted.
    assert len(os.listdir(os.path.join(root, "staging"))) == n + 1
    # This driver is the dataset's only writer: every leftover goes now.
    generation = parts.commit(root, [infos[k] for k in range(n)], remove_uncommitted=0)
    assert generation == 1
    assert os.listdir(os.path.join(root, "staging")) == [], "no orphan left"
    assert sorted(os.listdir(os.path.join(root, "parts"))) == sorted(i.name for i in infos.values())
    ds = zring.RaggedDataset(root)
    assert len(ds) == n * PER
    values, splits = ds[np.arange(len(ds))]
    ids = [int(values[splits[i]]) for i in range(len(ds))]
    assert ids == list(range(n * PER)), "every document exactly once, in part order"
    listed = parts.list_parts(root)
    assert [p["records"] for p in listed] == [PER] * n
    assert [p["start"] for p in listed] == [k * PER for k in range(n)]


def _fixed(tmp_path, n=6, name="d"):
    root = str(tmp_path / name)
    parts.commit(root, [parts.write_part(root, _rows(k), codec="raw" if k % 2 else "zstd") for k in range(n)])
    return root


def test_a_dataset_of_parts_reads_as_the_concatenation(tmp_path):
    root = _fixed(tmp_path)
    want = np.concatenate([_rows(k) for k in range(6)])
    ds = zring.Dataset(root)
    assert (len(ds), ds.shape, ds.dtype) == (len(want), (3,), np.int64)
    assert np.array_equal(ds[:], want)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(want), 500)
    assert np.array_equal(ds[idx], want[idx])
    assert np.array_equal(ds[-1], want[-1])
    assert ds.verify()["records"] == len(want)
    assert ds.stats()["parts"] == 6 and ds.stats()["records"] == len(want)
    with pytest.raises(IndexError):
        ds[len(want)]
    # A loader cycle (mode 2) covers every record once, each row its record.
    with zring.DataLoader({"x": ds}, batch_size=len(want) // 6, mode=2, seed=3) as dl:
        seen = []
        for _ in range(6):
            b = next(dl)
            assert np.array_equal(b["x"], want[dl.last_indices])
            seen.extend(dl.last_indices.tolist())
    assert sorted(seen) == list(range(len(want)))
    # zring.mix over a dataset of parts and a single store.
    single = str(tmp_path / "single")
    zring.write_dataset(single, want[:50])
    with zring.DataLoader(zring.mix([{"x": ds}, {"x": zring.Dataset(single)}], [0.75, 0.25]),
                          batch_size=40, mode=1) as dl:
        for _ in range(5):
            b = next(dl)
            src = dl.last_sources
            assert np.array_equal(b["x"][src == 0], want[dl.last_indices[src == 0]])


def test_ragged_parts_pack_into_rows(tmp_path):
    root = str(tmp_path / "docs")
    parts.commit(root, [parts.write_part(root, _docs(k)) for k in range(5)])
    ds = zring.RaggedDataset(root)
    with zring.DataLoader(zring.pack(ds, 16), batch_size=4, mode=2) as dl:
        total = 0
        for _ in range(3):
            b = next(dl)
            toks, seg = b["tokens"], b["segment_ids"]
            assert toks.shape == (4, 16)
            # Within a segment, every token is the document's id, and the
            # id's document holds id % 7 + 1 tokens.
            for r in range(4):
                for s in set(seg[r].tolist()) - {0}:
                    vals = toks[r][seg[r] == s]
                    assert len(set(vals.tolist())) == 1
                    total += len(vals)
    assert total > 0


def test_a_part_missing_changed_or_of_another_dtype_is_an_error_naming_it(tmp_path, capsys):
    root = _fixed(tmp_path, n=3)
    names = [p["dir"] for p in parts.list_parts(root)]
    # Another dtype is refused at commit, naming the part.
    bad = parts.write_part(root, _rows(9).astype(np.int32))
    with pytest.raises(zring.CorruptError, match=bad.name):
        parts.commit(root, [bad])
    assert [p["dir"] for p in parts.list_parts(root)] == names, "the manifest is unchanged"
    # A part changed after its commit.
    with zring.Zrecord(os.path.join(root, names[1])) as z:
        z.delete([0])
    with pytest.raises(zring.CorruptError, match=names[1]):
        zring.Dataset(root)
    assert cli.main(["verify", root]) == 1
    assert names[1] in capsys.readouterr().err
    # A part missing.
    shutil.rmtree(os.path.join(root, names[1]))
    with pytest.raises(zring.NotAStoreError, match=names[1]):
        zring.Dataset(root)
    # A damaged manifest.
    root2 = _fixed(tmp_path, n=2, name="e")
    m = os.path.join(root2, "manifest.json")
    with open(m) as f:
        text = f.read()
    with open(m, "w") as f:
        f.write(text.replace('"records": 37', '"records": 36', 1))
    with pytest.raises(zring.CorruptError, match="manifest.json"):
        zring.Dataset(root2)


def test_cli_info_and_verify_read_a_dataset_of_parts(tmp_path, capsys):
    root = _fixed(tmp_path, n=3)
    assert cli.main(["info", root]) == 0
    out = capsys.readouterr().out
    assert "parts         3 (manifest generation 1)" in out
    assert f"records       {3 * PER}" in out
    assert cli.main(["verify", root]) == 0
    assert f"records={3 * PER}" in capsys.readouterr().out


def _cycle(dl, steps):
    """The indices of the next ``steps`` batches."""
    out = []
    for _ in range(steps):
        next(dl)
        out.append(dl.last_indices.tolist())
    return out


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_a_state_saved_over_one_manifest_resumes_over_ten_appended_parts(tmp_path, mode):
    root = str(tmp_path / "grow")
    parts.commit(root, [parts.write_part(root, _rows(k)) for k in range(6)])
    n0 = 6 * PER  # 222 records, batches of 37: cycles of 6 steps
    B = PER
    extra = {"block_records": 8, "window_blocks": 4} if mode == 3 else {}
    with zring.DataLoader({"x": zring.Dataset(root)}, batch_size=B, mode=mode, seed=7, **extra) as dl:
        _cycle(dl, 2)
        state = dl.state()
        uninterrupted = _cycle(dl, 4)  # to the end of the saved cycle
    assert state["fingerprints"]["x"]["records"] == n0
    saved = json.loads(json.dumps(state))

    generation = parts.commit(root, [parts.write_part(root, _rows(k)) for k in range(6, 16)], mode="append")
    assert generation == 2
    grown = zring.Dataset(root)
    n1 = 16 * PER
    assert len(grown) == n1
    with zring.DataLoader({"x": grown}, state=saved) as dl:
        rest = []
        for _ in range(4):
            b = next(dl)
            assert np.array_equal(b["x"][:, 0], dl.last_indices)
            rest.append(dl.last_indices.tolist())
        assert rest == uninterrupted, "the saved cycle finishes as the uninterrupted run"
        after = [i for step in _cycle(dl, 16) for i in step]
    if mode == 1:
        # iid draws with replacement: the new records join.
        assert max(after) >= n0
    else:
        assert sorted(after) == list(range(n1)), "the next cycle covers old and new records once"

    # An overwrite that drops a part: the state no longer fits.
    listed = parts.list_parts(root)
    keep = [parts.PartInfo(p["dir"].split("/", 1)[1], p["records"], p["content"]) for p in listed[1:]]
    parts.commit(root, keep, mode="overwrite")
    dropped = os.path.join(root, listed[0]["dir"])
    assert os.path.isdir(dropped), "the dropped part stays an hour, for readers of the generation before"
    mark = os.path.join(root, "dropped", listed[0]["dir"].split("/", 1)[1])
    hour_ago = time.time() - parts.KEEP_DROPPED - 5
    os.utime(mark, (hour_ago, hour_ago))
    parts.commit(root, [])
    assert not os.path.exists(dropped) and not os.path.exists(mark), "then a commit removes it"
    with pytest.raises(ValueError, match="stream \"x\" changed since the state was saved"):
        zring.DataLoader({"x": zring.Dataset(root)}, state=saved)


CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # before zring looks at it
    import numpy as np, zring
    root, n = sys.argv[1], int(sys.argv[2])
    ds = zring.Dataset(root)
    assert len(ds) == n
    want = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx = rng.integers(0, n, 256)
        assert np.array_equal(ds[idx][:, 0], want[idx])
    with zring.DataLoader({"x": ds}, batch_size=128, num_workers=2, mode=1) as dl:
        for _ in range(20):
            b = next(dl)
            assert np.array_equal(b["x"][:, 0], want[dl.last_indices])
    print("ok", flush=True)
    """
)


def test_hundreds_of_parts_under_ulimit_64(tmp_path):
    root = str(tmp_path / "many")
    k = 150
    parts.commit(root, [parts.write_part(root, _rows(j), codec="raw") for j in range(k)])
    out = subprocess.run([sys.executable, "-c", CHILD, root, str(k * PER)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


LIMITED = textwrap.dedent(
    """
    import os, resource, sys
    limit = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))  # before zring looks at it
    import numpy as np, zring
    root, n = sys.argv[1], int(sys.argv[2])
    most = 0
    def fds():
        global most
        most = max(most, len(os.listdir("/proc/self/fd")))
    ds = zring.Dataset(root)
    fds()
    assert len(ds) == n
    rng = np.random.default_rng(1)
    gathered = 0
    for _ in range(30):
        idx = rng.integers(0, n, 256)
        assert np.array_equal(ds[idx][:, 0], idx)
        gathered += idx.size
        fds()
    # Every part once, in one gather: more parts than the open set holds.
    idx = np.arange(0, n, 7)
    assert np.array_equal(ds[idx][:, 0], idx)
    fds()
    with zring.DataLoader({"x": ds}, batch_size=128, num_workers=2, mode=1) as dl:
        for _ in range(30):
            b = next(dl)
            assert np.array_equal(b["x"][:, 0], dl.last_indices)
            fds()
    print(most, flush=True)
    """
)


def test_five_hundred_parts_open_and_gather_under_ulimit_128(tmp_path):
    """Five hundred parts, each two descriptors when open, read by a process
    allowed 128 (the ratio of a thousand parts under `ulimit -n 256`): the
    open set and the descriptor cache stay inside the limit whatever the
    gathers touch, one gather over every part included."""
    root = str(tmp_path / "many")
    k, per = 500, 7
    infos = [parts.write_part(root, np.arange(j * per, (j + 1) * per, dtype=np.int64)[:, None], codec="raw",
                              progress=False) for j in range(k)]
    parts.commit(root, infos)
    out = subprocess.run([sys.executable, "-c", LIMITED, root, str(k * per), "128"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) < 128


def test_read_stats_count_every_record_gathered_over_parts(tmp_path):
    """Records a gather copies from the parts' mappings are counted into
    each part's read statistics in batches; the dataset's read_stats count
    every one of them."""
    root = str(tmp_path / "counted")
    n = 30
    parts.commit(root, [parts.write_part(root, _rows(j), codec="raw") for j in range(n)])
    ds = zring.Dataset(root)
    rng = np.random.default_rng(2)
    before = ds.read_stats()["records"]
    for _ in range(7):
        ds[rng.integers(0, n * PER, 100)]
    stats = ds.read_stats()
    assert stats["records"] - before == 700
    assert stats["page_cache_hits"] + stats["cache_hits"] + stats["cache_misses"] <= stats["records"]


def test_four_ranks_each_reading_only_its_parts_cover_every_record_once(tmp_path, capsys):
    root = str(tmp_path / "ranked")
    sizes = [37, 5, 60, 12, 33, 8, 41, 20, 3, 50, 27, 14]
    infos, start = [], 0
    for n in sizes:
        ids = np.arange(start, start + n, dtype=np.int64)
        infos.append(parts.write_part(root, np.stack([ids, -ids], axis=1)))
        start += n
    parts.commit(root, infos)
    total = start
    plan = parts.rank_plan(root, 4)
    assert sorted(d for dirs in plan for d in dirs) == sorted(p["dir"] for p in parts.list_parts(root))
    loads = [sum(p["records"] for p in parts.list_parts(root) if p["dir"] in dirs) for dirs in plan]
    assert max(loads) - min(loads) <= max(sizes), loads
    assert cli.main(["parts", root, "--ranks", "4"]) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert sorted((int(r), d) for r, d in printed) == sorted((r, d) for r, dirs in enumerate(plan) for d in dirs)

    seen = []
    for rank in range(4):
        # The rank's host holds only its own parts.
        host = tmp_path / f"host{rank}"
        shutil.copytree(root, host)
        for r, dirs in enumerate(plan):
            if r != rank:
                for d in dirs:
                    shutil.rmtree(host / d)
        with pytest.raises(zring.NotAStoreError):
            zring.Dataset(host)  # the whole dataset is not on this host
        ds = zring.Dataset(host, rank_parts=(rank, 4))
        assert len(ds) == loads[rank]
        with zring.DataLoader({"x": ds}, batch_size=8, mode=2, seed=rank) as dl:
            for _ in range(3):
                b = next(dl)
                assert np.array_equal(b["x"][:, 1], -b["x"][:, 0])
            state = dl.state()
            after = [next(dl)["x"][:, 0].tolist() for _ in range(2)]
        with zring.DataLoader({"x": ds}, state=state) as dl:
            assert [next(dl)["x"][:, 0].tolist() for _ in range(2)] == after, "resume is exact"
        # One cycle of the rank's loader: a batch of all its records.
        with zring.DataLoader({"x": ds}, batch_size=len(ds), mode=2, seed=rank) as dl:
            seen.extend(next(dl)["x"][:, 0].tolist())
    assert sorted(seen) == list(range(total)), "the ranks' cycles cover every record exactly once"
    with pytest.raises(ValueError, match="rank_parts"):
        zring.Dataset(root, rank_parts=(4, 4))


def test_global_loader_reads_a_dataset_of_parts_as_one_store(tmp_path):
    jax = pytest.importorskip("jax")
    import zring.jax as zjax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    root = _fixed(tmp_path, n=4)
    single = str(tmp_path / "single")
    zring.write_dataset(single, np.concatenate([_rows(k) for k in range(4)]))
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))
    got = {}
    for name, path in (("parts", root), ("single", single)):
        with zjax.global_loader({"x": zring.Dataset(path)}, 16, sharding, mode=2, seed=3, num_workers=1) as g:
            got[name] = [np.asarray(next(g)["x"]) for _ in range(4)]
    for a, b in zip(got["parts"], got["single"]):
        np.testing.assert_array_equal(a, b)


FORK = textwrap.dedent(
    """
    import os, sys
    import numpy as np, zring
    ds = zring.Dataset(sys.argv[1])
    want = ds[:]
    with zring.DataLoader({"x": ds}, batch_size=16, mode=1, num_workers=2) as dl:
        next(dl)  # the gather threads are busy while the parent forks
        pid = os.fork()
        if pid == 0:
            ok = 0
            try:
                idx = np.random.default_rng(0).integers(0, len(want), 100)
                ok = int(np.array_equal(ds[idx], want[idx]))
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        next(dl)
    print("ok" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else f"child {status}")
    """
)


def test_a_forked_child_reads_a_dataset_of_parts_a_loader_was_reading(tmp_path):
    # In a process of its own: this one may have imported jax, which warns at fork.
    root = _fixed(tmp_path, n=5)
    out = subprocess.run([sys.executable, "-c", FORK, root], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("backend", ["uring", "pread"])
@pytest.mark.parametrize("mmap", ["1", "0"])
def test_random_gathers_over_many_parts_match_one_store(tmp_path, monkeypatch, backend, mmap):
    """A batch over many parts is one engine gather (records copied from the
    parts' mappings, or read through the backend without them): the same
    bytes as one store of the same records, fixed and ragged."""
    n = 40
    fixed = _fixed(tmp_path, n=n, name="fixed")
    docs = str(tmp_path / "docs")
    parts.commit(docs, [parts.write_part(docs, _docs(k), codec="raw" if k % 3 else "zstd") for k in range(n)])
    zring.write_dataset(tmp_path / "one-fixed", np.concatenate([_rows(k) for k in range(n)]))
    zring.write_ragged(tmp_path / "one-docs", [d for k in range(n) for d in _docs(k)])
    monkeypatch.setenv("ZRING_BACKEND", backend)
    monkeypatch.setenv("ZRING_MMAP", mmap)
    rng = np.random.default_rng(7)
    pf, sf = zring.Dataset(fixed), zring.Dataset(tmp_path / "one-fixed")
    pr, sr = zring.RaggedDataset(docs), zring.RaggedDataset(tmp_path / "one-docs")
    assert len(pf) == len(sf) == len(pr) == len(sr) == n * PER
    for _ in range(20):
        idx = rng.integers(0, n * PER, 256)
        a, b = pf[idx], sf[idx]
        assert a.tobytes() == b.tobytes()
        assert np.array_equal(a[:, 0], idx)  # and each row is its record
        (pv, po), (sv, so) = pr[idx], sr[idx]
        assert np.array_equal(po, so) and pv.tobytes() == sv.tobytes()
        assert set(pv[po[3]:po[4]].tolist()) == {idx[3]}
    # Sorted (few parts, long runs) and a single part's worth.
    idx = np.arange(n * PER)
    assert pf[idx].tobytes() == sf[idx].tobytes()
    assert pr[idx][0].tobytes() == sr[idx][0].tobytes()
