"""Ranks reading only their own parts (``rank_parts=``): four ranks, each run
in a copy of the dataset holding only the parts ``zring parts --ranks 4
--rank K`` lists for it (the other ranks' parts deleted), cover every record
exactly once over a cycle in every mode without replacement, draw only from
their own parts in iid mode, keep a 0.7/0.2/0.1 mixture's shares within a
row, pack their own documents, resume exactly, and refuse a state saved
with another rank count or by another rank."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import zring
from zring import cli, parts

RANKS = 4
BATCH = 8
# Part sizes, multiples of the batch, so that the batch divides every
# rank's records and a cycle drops none (as for one store, a cycle of B
# rows per step drops the records past the last whole batch).
SIZES = [40, 8, 64, 16, 32, 8, 48, 24, 16, 56, 24, 16]
WEIGHTS = [0.7, 0.2, 0.1]


def _write(root: Path, sizes: list[int], first: int = 0) -> int:
    """A dataset of parts whose records are ``[id, -id]``, ids from ``first``
    on in manifest order; returns the record count."""
    infos, start = [], first
    for n in sizes:
        ids = np.arange(start, start + n, dtype=np.int64)
        infos.append(parts.write_part(root, np.stack([ids, -ids], axis=1)))
        start += n
    parts.commit(root, infos)
    return start - first


def _host(root: Path, rank: int, host: Path, capsys) -> Path:
    """Rank ``rank``'s copy of the dataset: what ``zring parts --rank`` lists
    for it, copied; no other part is there."""
    assert cli.main(["parts", str(root), "--ranks", str(RANKS), "--rank", str(rank)]) == 0
    listed = capsys.readouterr().out.split()
    assert listed[0] == "manifest.json"
    assert sorted(listed[1:]) == sorted(parts.rank_plan(root, RANKS)[rank])
    host.mkdir(parents=True)
    shutil.copy(root / "manifest.json", host / "manifest.json")
    for d in listed[1:]:
        shutil.copytree(root / d, host / d)
    return host


@pytest.fixture()
def hosts(tmp_path, capsys):
    """A dataset of 12 parts and each of the 4 ranks' copies of it."""
    root = tmp_path / "corpus"
    total = _write(root, SIZES)
    copies = [_host(root, r, tmp_path / f"host{r}" / "corpus", capsys) for r in range(RANKS)]
    return root, total, copies


def _own_ids(root: Path, rank: int, ranks: int = RANKS) -> set[int]:
    """The ids of the records in rank ``rank``'s parts."""
    mine = set(parts.rank_plan(root, ranks)[rank])
    out: set[int] = set()
    for p in parts.list_parts(root):
        if p["dir"] in mine:
            out.update(range(p["start"], p["start"] + p["records"]))
    return out


@pytest.mark.parametrize("mode", [0, 2, 3])
def test_one_cycle_of_four_ranks_covers_every_record_once(hosts, mode):
    root, total, copies = hosts
    seen: list[int] = []
    for rank, host in enumerate(copies):
        with pytest.raises(zring.NotAStoreError):
            zring.Dataset(host)  # the other ranks' parts are not on this host
        ds = zring.Dataset(host, rank_parts=(rank, RANKS))
        assert len(ds) % BATCH == 0 and len(ds) == len(_own_ids(root, rank))
        extra = {"block_records": 4, "window_blocks": 3} if mode == 3 else {}
        with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=mode, seed=11, rank_parts=(rank, RANKS),
                              **extra) as dl:
            assert dl.rank_parts == (rank, RANKS)
            mine = []
            for _ in range(len(ds) // BATCH):
                x = next(dl)["x"]
                assert np.array_equal(x[:, 1], -x[:, 0])
                mine.extend(x[:, 0].tolist())
        assert sorted(mine) == sorted(_own_ids(root, rank)), f"rank {rank}: its cycle is its own records once"
        seen.extend(mine)
        ds.close()
    assert sorted(seen) == list(range(total)), "the ranks' cycles together cover every record exactly once"


def test_iid_ranks_draw_only_from_their_own_parts(hosts):
    root, _, copies = hosts
    for rank, host in enumerate(copies):
        with zring.Dataset(host, rank_parts=(rank, RANKS)) as ds, \
                zring.DataLoader({"x": ds}, batch_size=BATCH, mode=1, seed=3) as dl:
            assert dl.rank_parts == (rank, RANKS), "taken from the datasets"
            drawn = {int(i) for _ in range(20) for i in next(dl)["x"][:, 0]}
        assert drawn <= _own_ids(root, rank)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_a_rank_resumes_exactly_and_refuses_another_rank_count(hosts, mode):
    root, _, copies = hosts
    rank, host = 2, copies[2]
    ds = zring.Dataset(host, rank_parts=(rank, RANKS))
    extra = {"block_records": 4, "window_blocks": 3} if mode == 3 else {}
    with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=mode, seed=5, **extra) as dl:
        for _ in range(7):
            next(dl)
        state = dl.state()
        after = [next(dl)["x"][:, 0].tolist() for _ in range(12)]  # across its cycle's end (80 records: 10 steps)
    assert state["rank_parts"] == {"rank": rank, "ranks": RANKS}
    with zring.DataLoader({"x": ds}, state=state, num_workers=2) as dl:
        assert [next(dl)["x"][:, 0].tolist() for _ in range(12)] == after, "resume is exact"

    # The same host's data read as rank 2 of 3: the rank count is refused,
    # before the state's lengths or fingerprints are looked at.
    with zring.Dataset(root, rank_parts=(2, 3)) as other:
        with pytest.raises(ValueError, match=r"saved by rank 2 of 4 ranks, this loader is rank 2 of 3.*keeps its rank count"):
            zring.DataLoader({"x": other}, state=state)
    with zring.Dataset(root, rank_parts=(1, RANKS)) as other:
        with pytest.raises(ValueError, match=r"saved by rank 2 of 4, this loader reads rank 1's parts"):
            zring.DataLoader({"x": other}, state=state)
    with zring.Dataset(root) as whole:
        with pytest.raises(ValueError, match=r"rank_parts=\(2, 4\) to resume it"):
            zring.DataLoader({"x": whole}, state=state)
        with zring.DataLoader({"x": whole}, batch_size=BATCH, mode=mode, seed=5, **extra) as dl:
            whole_state = dl.state()
    assert "rank_parts" not in whole_state
    with pytest.raises(ValueError, match="saved by a loader over whole datasets"):
        zring.DataLoader({"x": ds}, state=whole_state)
    ds.close()


def test_a_mixture_of_three_part_datasets_keeps_each_ranks_shares(tmp_path, capsys):
    """0.7/0.2/0.1 of three datasets of parts, 4 ranks of 16 rows a step, each
    on its own copies: every rank's rows so far hold each source's share
    within a row at every step, from its own parts only; a rank resumes
    exactly."""
    batch, steps = 16, 60
    roots = []
    for k, sizes in enumerate([[300, 200, 250, 150, 100, 260], [90, 60, 120, 80, 50], [40, 30, 35, 25, 45]]):
        root = tmp_path / f"src{k}"
        _write(root, sizes, first=k * 1_000_000)
        roots.append(root)
    w = np.array(WEIGHTS)
    for rank in range(RANKS):
        hosts = [_host(root, rank, tmp_path / f"host{rank}" / root.name, capsys) for root in roots]
        sources = [zring.Dataset(h, rank_parts=(rank, RANKS)) for h in hosts]
        own = [{i + k * 1_000_000 for i in _own_ids(root, rank)} for k, root in enumerate(roots)]
        mix = zring.mix([{"x": s} for s in sources], WEIGHTS)
        with zring.DataLoader(mix, batch_size=batch, mode=2, seed=9, rank_parts=(rank, RANKS)) as dl:
            counts = np.zeros(3)
            rows: list[tuple[list[int], list[int]]] = []
            for t in range(steps):
                if t == steps // 2:
                    state = dl.state()
                x = next(dl)["x"]
                src = dl.last_sources
                counts += np.bincount(src, minlength=3)
                assert np.all(np.abs(counts - w * batch * (t + 1)) <= 1), (rank, t, counts)
                for k in range(3):
                    assert set(x[src == k, 0].tolist()) <= own[k], f"rank {rank} read only its own parts of source {k}"
                rows.append((x[:, 0].tolist(), src.tolist()))
        assert state["rank_parts"] == {"rank": rank, "ranks": RANKS}
        with zring.DataLoader(zring.mix([{"x": s} for s in sources], WEIGHTS), state=state) as dl:
            for t in range(steps // 2, steps):
                x = next(dl)["x"]
                assert (x[:, 0].tolist(), dl.last_sources.tolist()) == rows[t], "resume is exact"
        other = [zring.Dataset(root, rank_parts=(rank % 2, 2)) for root in roots]
        with pytest.raises(ValueError, match="keeps its rank count"):
            zring.DataLoader(zring.mix([{"x": s} for s in other], WEIGHTS), state=state)
        for s in sources + other:
            s.close()


def test_ranks_pack_their_own_documents(tmp_path, capsys):
    root = tmp_path / "docs"
    infos = [parts.write_part(root, [np.full(i % 9 + 1, i, dtype=np.int32) for i in range(40 * k, 40 * k + 40)])
             for k in range(8)]
    parts.commit(root, infos)
    tokens_seen: set[int] = set()
    for rank in range(RANKS):
        host = _host(root, rank, tmp_path / f"host{rank}" / "docs", capsys)
        docs = zring.RaggedDataset(host, rank_parts=(rank, RANKS))
        own = _own_ids(root, rank)
        with zring.DataLoader(zring.pack(docs, 32, labels=True), batch_size=4, mode=2, seed=1) as dl:
            assert dl.rank_parts == (rank, RANKS)
            first = [next(dl)["tokens"] for _ in range(3)]
            state = dl.state()
            after = [next(dl)["tokens"] for _ in range(40)]
        for t in first + after:
            assert set(np.unique(t).tolist()) <= own
            tokens_seen.update(np.unique(t).tolist())
        assert state["rank_parts"] == {"rank": rank, "ranks": RANKS}
        with zring.DataLoader(zring.pack(docs, 32, labels=True), state=state) as dl:
            for t in after:
                np.testing.assert_array_equal(next(dl)["tokens"], t)
        docs.close()
    assert tokens_seen == set(range(8 * 40)), "each document is some rank's"


def test_rank_parts_asks_for_datasets_opened_for_the_rank(tmp_path):
    root = tmp_path / "corpus"
    _write(root, [8, 8, 8])
    single = tmp_path / "single"
    zring.write_dataset(single, np.zeros((16, 2), dtype=np.int64), progress=False)
    with zring.Dataset(root) as whole, zring.Dataset(root, rank_parts=(0, 2)) as r0, \
            zring.Dataset(root, rank_parts=(1, 2)) as r1, zring.Dataset(single) as one:
        with pytest.raises(ValueError, match=r"opened over all its parts; open it with Dataset\(path, rank_parts=\(0, 2\)\)"):
            zring.DataLoader({"x": whole}, batch_size=4, rank_parts=(0, 2))
        with pytest.raises(ValueError, match=r"opened with rank_parts=\(1, 2\), the loader was given rank_parts=\(0, 2\)"):
            zring.DataLoader({"x": r1}, batch_size=4, rank_parts=(0, 2))
        with pytest.raises(ValueError, match="one store, not a dataset of parts"):
            zring.DataLoader(zring.mix([{"x": r0}, {"x": one}], [0.5, 0.5]), batch_size=4)
        with pytest.raises(ValueError, match=r"stream 'y' .* opened with rank_parts=\(1, 2\), another with rank_parts=\(0, 2\)"):
            zring.DataLoader({"x": r0, "y": r1}, batch_size=4)
        with pytest.raises(ValueError, match="need 0 <= rank < ranks"):
            zring.DataLoader({"x": r0}, batch_size=4, rank_parts=(2, 2))
    with pytest.raises(ValueError, match="rank 3 reads no part .* fewer parts than 4 ranks"):
        zring.Dataset(root, rank_parts=(3, 4))


def test_global_loader_reads_each_ranks_own_parts(hosts):
    pytest.importorskip("jax")
    import jax

    import zring.jax as zjax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    root, total, copies = hosts
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))
    seen: list[int] = []
    for rank, host in enumerate(copies):
        ds = zring.Dataset(host, rank_parts=(rank, RANKS))
        g = zjax.global_loader({"x": ds}, BATCH, sharding, mode=2, seed=4, rank_parts=(rank, RANKS))
        assert g.rank_parts == (rank, RANKS) and g.loader.rank_parts == (rank, RANKS)
        cycle = len(ds) // BATCH
        steps = [np.asarray(next(g)["x"])[:, 0].tolist() for _ in range(cycle)]
        seen.extend(i for s in steps for i in s)
        state = g.state()
        after = [np.asarray(next(g)["x"])[:, 0].tolist() for _ in range(3)]
        g.close()
        assert state["rank_parts"] == {"rank": rank, "ranks": RANKS} and state["global_batch_size"] == BATCH
        g = zjax.global_loader({"x": ds}, BATCH, sharding, state=state)
        assert [np.asarray(next(g)["x"])[:, 0].tolist() for _ in range(3)] == after, "resume is exact"
        g.close()
        with zjax.restore_loader({"x": ds}, state) as dl:
            assert next(dl)["x"][:, 0].tolist() == after[0]
        with zring.Dataset(root, rank_parts=(0, 2)) as other, \
                pytest.raises(zjax.StateMismatchError, match="keeps its rank count"):
            zjax.global_loader({"x": other}, BATCH, sharding, state=state)
        ds.close()
    assert sorted(seen) == list(range(total))


def test_a_ranks_state_resumes_over_appended_parts(tmp_path):
    """Parts appended after a rank saved its state: the rank finishes its
    cycle over its old parts as the uninterrupted run does, and its new
    parts join from its next cycle."""
    root = tmp_path / "corpus"
    _write(root, [16, 24, 8, 32, 16, 24])
    rank = 1
    with zring.Dataset(root, rank_parts=(rank, RANKS)) as ds:
        old = len(ds)
        old_ids = {int(i) for i in ds[:][:, 0]}
        with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=2, seed=8) as dl:
            next(dl)
            state = dl.state()
            rest = [next(dl)["x"][:, 0].tolist() for _ in range(old // BATCH - 1)]
    _write(root, [40, 8, 16, 24], first=120)
    with zring.Dataset(root, rank_parts=(rank, RANKS)) as grown:
        assert len(grown) > old
        new_ids = {int(i) for i in grown[:][:, 0]}
        assert old_ids < new_ids
        with zring.DataLoader({"x": grown}, state=state) as dl:
            assert [next(dl)["x"][:, 0].tolist() for _ in range(len(rest))] == rest
            nxt = [int(i) for _ in range(len(grown) // BATCH) for i in next(dl)["x"][:, 0]]
        assert sorted(nxt) == sorted(new_ids), "the next cycle covers the rank's old and new records once"


def test_processes_of_one_rank_split_its_rows_with_shard(hosts):
    """Two processes of rank 1 (one host), shard=(k, 2): together the rows
    of the rank's unsharded loader."""
    _, _, copies = hosts
    with zring.Dataset(copies[1], rank_parts=(1, RANKS)) as ds:
        with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=2, seed=6) as dl:
            whole = [next(dl)["x"][:, 0].tolist() for _ in range(5)]
        halves = []
        for k in range(2):
            with zring.DataLoader({"x": ds}, batch_size=BATCH, mode=2, seed=6, shard=(k, 2)) as dl:
                halves.append([next(dl)["x"][:, 0].tolist() for _ in range(5)])
    assert [a + b for a, b in zip(*halves)] == whole


def _jax_worker(port: str, nproc: str, pid: str, host: str, out: str, state_arg: str) -> None:
    """One process of a JAX run of ``nproc`` ranks over its own host folder:
    the rows it holds of each step, and its state after ``JAX_SAVE`` steps."""
    import json
    import pickle

    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import zring.jax as zjax

    ranks = int(nproc)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=ranks, process_id=int(pid),
                               initialization_timeout=90)
    rank = jax.process_index()
    ds = zring.Dataset(host, rank_parts=(rank, ranks))
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    state = json.loads(state_arg) if state_arg else None
    kw = {"state": state} if state else {"mode": 2, "seed": 13}
    rows, saved = [], None
    with zjax.global_loader({"x": ds}, JAX_BATCH, sharding, num_workers=1, **kw) as g:
        for t in range(JAX_STEPS):
            if state is None and t == JAX_SAVE:
                saved = g.state()
            batch = next(g)["x"]
            assert batch.shape[0] == JAX_BATCH and not batch.is_fully_addressable
            rows.append(sorted(int(i) for s in batch.addressable_shards for i in np.asarray(s.data)[:, 0]))
    report = {"rank": rank, "records": len(ds), "rows": rows, "state": saved}
    Path(out, f"jax-{'resumed' if state else 'first'}-{rank}.pkl").write_bytes(pickle.dumps(report))
    jax.distributed.shutdown()


JAX_RANKS, JAX_BATCH, JAX_STEPS, JAX_SAVE = 2, 16, 16, 5


def _jax_launch(tmp_path: Path, hosts: list[Path], states: list | None = None) -> list[dict]:
    import json
    import os
    import pickle
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen([sys.executable, __file__, "worker", str(port), str(JAX_RANKS), str(r), str(hosts[r]),
                               str(tmp_path), json.dumps(states[r]) if states else ""],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(JAX_RANKS)]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    which = "resumed" if states else "first"
    return [pickle.loads((tmp_path / f"jax-{which}-{r}.pkl").read_bytes()) for r in range(JAX_RANKS)]


def test_jax_processes_each_read_their_own_parts_and_resume(tmp_path, capsys):
    """Two JAX processes (jax.distributed, two CPU devices each), each a rank
    on a folder holding only its parts: each holds 8 rows of every global
    batch of 16, from its own records; over each rank's cycle the rows cover
    every record once; each resumes exactly from its own state."""
    pytest.importorskip("jax")
    root = tmp_path / "corpus"
    total = _write(root, [64, 32, 48, 16, 40, 24])  # ranks of 120 and 104 records: cycles of 15 and 13 steps
    hosts = []
    for r in range(JAX_RANKS):
        assert cli.main(["parts", str(root), "--ranks", str(JAX_RANKS), "--rank", str(r)]) == 0
        listed = capsys.readouterr().out.split()
        host = tmp_path / f"host{r}" / "corpus"
        host.mkdir(parents=True)
        shutil.copy(root / "manifest.json", host / "manifest.json")
        for d in listed[1:]:
            shutil.copytree(root / d, host / d)
        hosts.append(host)
    first = _jax_launch(tmp_path, hosts)
    seen = []
    for r, rep in enumerate(first):
        own = _own_ids(root, r, JAX_RANKS)
        assert rep["records"] == len(own) and rep["records"] // 8 <= JAX_STEPS
        assert all(len(rows) == 8 and set(rows) <= own for rows in rep["rows"])
        seen.extend(i for rows in rep["rows"][: rep["records"] // 8] for i in rows)
        assert rep["state"]["rank_parts"] == {"rank": r, "ranks": JAX_RANKS}
    assert sorted(seen) == list(range(total)), "the ranks' cycles cover every record once"
    resumed = _jax_launch(tmp_path, hosts, [rep["state"] for rep in first])
    for a, b in zip(first, resumed):
        assert b["rows"][: JAX_STEPS - JAX_SAVE] == a["rows"][JAX_SAVE:], "each rank resumes exactly"


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "worker":
    _jax_worker(*sys.argv[2:])


@pytest.mark.parametrize("split", ["969,30,1", "8,1,1", [(0, 100), (100, 300), (300, None)]])
def test_the_ranks_splits_together_are_the_whole_datasets_split_with_any_rank_count(tmp_path, split):
    """Megatron's split is global: each rank's validation part is exactly its
    share of the whole dataset's, so with 4 ranks and with 2 (and 1) the
    ranks' parts together are the whole dataset's parts."""
    from zring._split import assign, assign_at

    root = tmp_path / "corpus"
    total = _write(root, SIZES * 40)
    with zring.Dataset(root) as whole:
        want = [set(v[np.arange(len(v))][:, 0].tolist()) for v in zring.split(whole, split, seed=5)]
    assert sum(len(w) for w in want) == total and len(want[1]) > 0
    for ranks in (4, 2, 1):
        got: list[set[int]] = [set() for _ in want]
        for rank in range(ranks):
            with zring.Dataset(root, rank_parts=(rank, ranks)) as ds:
                for k, v in enumerate(zring.split(ds, split, seed=5)):
                    ids = v[np.arange(len(v))][:, 0].tolist() if len(v) else []
                    assert not got[k] & set(ids), (ranks, rank, k)
                    got[k] |= set(ids)
        assert got == want, ranks
    # At any indices, the same part as the whole dataset's assignment.
    n = 10_007
    at = np.sort(np.random.default_rng(1).choice(n, 3000, replace=False)).astype(np.uint64)
    np.testing.assert_array_equal(assign_at(at, [969, 30, 1], 3), assign(n, [969, 30, 1], 3)[at])
    with pytest.raises(ValueError, match="increasing"):
        assign_at(np.array([5, 3], np.uint64), [1, 1])


def test_info_and_verify_check_a_hosts_folder_and_name_the_rank_another_folder_holds(hosts, capsys):
    root, total, copies = hosts
    for rank in (1, 3):
        assert cli.main(["verify", str(copies[rank]), "--ranks", str(RANKS), "--rank", str(rank)]) == 0
        assert cli.main(["info", str(copies[rank]), "--ranks", str(RANKS), "--rank", str(rank)]) == 0
        out = capsys.readouterr().out
        mine = parts.rank_plan(root, RANKS)[rank]
        assert f"parts         {len(mine)} of {len(SIZES)}: rank {rank} of {RANKS}'s share" in out, out
        assert f"records       {len(_own_ids(root, rank))}" in out, out
    # Host 2's folder asked for rank 1: refused, naming the rank it holds.
    for cmd in ("verify", "info"):
        assert cli.main([cmd, str(copies[2]), "--ranks", str(RANKS), "--rank", "1"]) == 1
        err = capsys.readouterr().err
        assert f"holds rank 2 of {RANKS}'s parts" in err and f"--ranks {RANKS} --rank 2" in err, err
    # Without --rank, a host's folder is not "damaged": it says whose share it is.
    assert cli.main(["verify", str(copies[2])]) == 1
    assert f"holds rank 2 of {RANKS}'s parts" in capsys.readouterr().err
    # The whole dataset: every record, and no note.
    assert cli.main(["info", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"records       {total}" in out and "note" not in out, out
    assert cli.main(["info", str(root), "--rank", "1"]) == 1
    assert "give --ranks N and --rank K together" in capsys.readouterr().err


def test_ranks_of_a_token_store_hold_about_as_many_tokens_and_parts_lists_the_balance(tmp_path, capsys):
    """Parts of many short documents and parts of a few long ones: placed by
    documents, one rank held most tokens; by bytes (tokens) each rank is
    within one part of the others, stably under appends."""
    root = tmp_path / "tok"
    rng = np.random.default_rng(0)
    lengths = []
    for k in range(24):
        docs = [np.full(int(n), k, np.uint16) for n in (rng.integers(1, 20, 500) if k % 3 else
                                                        rng.integers(2000, 8000, 4))]
        lengths.append(sum(len(d) for d in docs))
        parts.commit(root, [parts.write_part(root, docs, codec="zstd")])
    biggest = max(lengths)
    for ranks in (2, 4):
        bal = parts.rank_balance(root, ranks)
        tokens = [b["bytes"] // 2 for b in bal]
        assert sum(tokens) == sum(lengths)
        assert max(tokens) - min(tokens) <= max(0.05 * max(tokens), biggest), (ranks, tokens)
        for rank in range(ranks):
            with zring.RaggedDataset(root, rank_parts=(rank, ranks)) as ds:
                values, _ = ds[np.arange(len(ds))]
                assert len(values) == tokens[rank]
    before = parts.rank_plan(root, 4)
    parts.commit(root, [parts.write_part(root, [np.zeros(5000, np.uint16)])])
    after = parts.rank_plan(root, 4)
    assert all(a[:len(b)] == b for a, b in zip(after, before)), "appends move no part"
    assert cli.main(["parts", str(root), "--ranks", "4"]) == 0
    err = capsys.readouterr().err
    assert err.count("rank ") == 4 and "decoded" in err, err
