"""zring.jax: device prefetch, exact resume, multi-process global batches, re-sharding.

The multi-process tests start real JAX processes on this machine, joined by
``jax.distributed.initialize`` over a loopback coordinator, each with two
CPU devices; this file doubles as their worker script (``python
test_jax.py worker ...``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Four host devices for the in-process sharding tests; only effective if no
# test imported jax before this module (then the 4-device tests skip).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

jax = pytest.importorskip("jax")

import zring  # noqa: E402
import zring.jax as zjax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N = 500  # records
B = 16  # global batch
MODE, SEED = 2, 5


def _write(root: Path, n: int = N) -> dict[str, zring.Dataset]:
    """x[i] = (i, i + 0.5, -i) as float32, y[i] = i: every value names its record."""
    i = np.arange(n)
    zring.write_dataset(root / "x", np.stack([i, i + 0.5, -i], axis=1).astype(np.float32))
    zring.write_dataset(root / "y", i.astype(np.int32))
    return {"x": zring.Dataset(root / "x"), "y": zring.Dataset(root / "y")}


MIX_LENGTHS, MIX_WEIGHTS = (300, 200, 120), (0.5, 0.3, 0.2)


def _write_mix(root: Path) -> "zring.Mixture":
    """Three sources whose y[i] = 100_000 * k + i names source k's record i."""
    sources = []
    for k, n in enumerate(MIX_LENGTHS):
        i = np.arange(n)
        zring.write_dataset(root / f"m{k}x", np.stack([i, i + 0.5], axis=1).astype(np.float32) + k)
        zring.write_dataset(root / f"m{k}y", (100_000 * k + i).astype(np.int32))
        sources.append({"x": zring.Dataset(root / f"m{k}x"), "y": zring.Dataset(root / f"m{k}y")})
    return zring.mix(sources, MIX_WEIGHTS)


def _mix_expected(mix: "zring.Mixture", steps: int) -> list[np.ndarray]:
    with zring.DataLoader(mix, batch_size=B, mode=MODE, seed=SEED, num_workers=1) as dl:
        return [np.asarray(next(dl)["y"]).astype(np.int64) for _ in range(steps)]


@pytest.fixture
def streams(tmp_path):
    s = _write(tmp_path)
    yield s
    for ds in s.values():
        ds.close()


def _expected(step: int, n: int = N) -> np.ndarray:
    return zring.Sampler(n, B, MODE, SEED).batch(step).astype(np.int64)


def _need_devices(k: int) -> None:
    if jax.device_count() < k:
        pytest.skip(f"needs {k} JAX devices (XLA_FLAGS was set before this module ran)")


# --------------------------------------------------------------------------
# Import hygiene
# --------------------------------------------------------------------------


def test_import_zring_does_not_import_jax():
    code = "import sys, zring; assert 'jax' not in sys.modules, 'zring imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_jax_is_a_clear_import_error():
    code = (
        "import sys\n"
        "sys.modules['jax'] = None  # what an absent package looks like to import\n"
        "try:\n"
        "    import zring.jax\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert "'jax' package" in out.stdout and "pip install" in out.stdout


# --------------------------------------------------------------------------
# The example
# --------------------------------------------------------------------------


def test_example_loss_falls(tmp_path):
    spec = importlib.util.spec_from_file_location("jax_train", ROOT / "examples" / "jax_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # run() checks itself that the resumed loader continues with the next batch.
    result = mod.run(steps=60, batch_size=64, samples=4000, workdir=tmp_path, log=lambda *a: None)
    assert len(result["losses"]) == 60
    assert result["last_loss"] < result["first_loss"]


# --------------------------------------------------------------------------
# device_prefetch and checkpoints
# --------------------------------------------------------------------------


def test_device_prefetch_yields_device_arrays_in_order(streams):
    loader = zring.DataLoader(streams, batch_size=B, mode=MODE, seed=SEED, num_workers=1)
    with zjax.device_prefetch(loader, size=3) as batches:
        for step in range(5):
            batch = next(batches)
            assert isinstance(batch["y"], jax.Array)
            np.testing.assert_array_equal(np.asarray(batch["y"]), _expected(step))
            np.testing.assert_array_equal(np.asarray(batch["x"])[:, 0], _expected(step).astype(np.float32))
            # Three batches are held ahead, yet the state is the consumer's.
            assert batches.state()["step"] == step + 1


def test_device_prefetch_ends_with_a_finite_loader():
    batches = list(zjax.device_prefetch(iter([{"a": np.ones(2)}, {"a": np.zeros(2)}]), size=4))
    assert [float(b["a"][0]) for b in batches] == [1.0, 0.0]


def test_resume_reproduces_the_next_batches(streams):
    loader = zring.DataLoader(streams, batch_size=B, mode=MODE, seed=SEED, num_workers=2)
    batches = zjax.device_prefetch(loader, size=2)
    for _ in range(7):
        next(batches)
    state = json.loads(json.dumps(batches.state()))  # survives JSON
    assert state["step"] == 7 and state["global_batch_size"] == B and state["mode"] == MODE
    assert state["seed"] == SEED and state["length"] == N
    following = [np.asarray(next(batches)["y"]) for _ in range(4)]
    batches.close()

    resumed = zjax.device_prefetch(zjax.restore_loader(streams, state, num_workers=1), size=2)
    again = [np.asarray(next(resumed)["y"]) for _ in range(4)]
    resumed.close()
    for step, (a, b) in enumerate(zip(following, again), start=7):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, _expected(step))


def test_resume_on_a_shard_takes_its_slice_of_the_same_batches(streams):
    loader = zring.DataLoader(streams, batch_size=B, mode=MODE, seed=SEED, num_workers=1)
    batches = zjax.device_prefetch(loader)
    for _ in range(3):
        next(batches)
    state = batches.state()
    batches.close()
    parts = []
    for i in range(4):
        with zjax.restore_loader(streams, state, shard=(i, 4), num_workers=1) as dl:
            parts.append(next(dl)["y"])
    np.testing.assert_array_equal(np.concatenate(parts), _expected(3))


def test_changed_store_is_refused(streams, tmp_path):
    loader = zring.DataLoader(streams, batch_size=B, mode=MODE, seed=SEED, num_workers=1)
    batches = zjax.device_prefetch(loader)
    next(batches)
    state = batches.state()
    batches.close()
    other = _write(tmp_path / "other", N + 1)
    with pytest.raises(zjax.StateMismatchError, match="has 501 records, the checkpoint saw 500"):
        zjax.restore_loader(other, state)
    # Same length, other dtype: the schema hash differs.
    zring.write_dataset(tmp_path / "y64", np.arange(N, dtype=np.int64))
    with pytest.raises(zjax.StateMismatchError, match="another schema"):
        zjax.restore_loader({"x": streams["x"], "y": zring.Dataset(tmp_path / "y64")}, state)
    with pytest.raises(zjax.StateMismatchError, match="not in the checkpoint"):
        zjax.restore_loader({**streams, "z": other["y"]}, state)
    with pytest.raises(zjax.StateMismatchError, match="DataLoader.state"):
        zjax.restore_loader(streams, {"sampler": {}, "shard": {}})
    # The same records written again (another store, compacted) keep it.
    zring.write_dataset(tmp_path / "ysame", np.arange(N, dtype=np.int32))
    with zring.Zrecord(tmp_path / "ysame") as z:
        z.compact()
    with zjax.restore_loader({"x": streams["x"], "y": zring.Dataset(tmp_path / "ysame")}, state) as dl:
        np.testing.assert_array_equal(next(dl)["y"], _expected(1))
    # Same count and schema, other values: the content differs.
    zring.write_dataset(tmp_path / "yother", np.arange(N, dtype=np.int32)[::-1].copy())
    with pytest.raises(zjax.StateMismatchError, match="other records"):
        zjax.restore_loader({"x": streams["x"], "y": zring.Dataset(tmp_path / "yother")}, state)


# --------------------------------------------------------------------------
# Global batches in one process (several host devices)
# --------------------------------------------------------------------------


def test_process_rows_plans():
    _need_devices(4)
    devs = jax.devices()[:4]
    contiguous = NamedSharding(Mesh(np.array(devs), ("data",)), P("data"))
    plans = [zjax.process_rows(contiguous, (B, 3), [d]) for d in devs]
    assert [p.ranges for p in plans] == [[(0, 4)], [(4, 8)], [(8, 12)], [(12, 16)]]
    assert [p.shard for p in plans] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    # Two fake processes whose devices are interleaved in the mesh: not a shard.
    inter = zjax.process_rows(contiguous, (B, 3), [devs[0], devs[2]])
    assert inter.ranges == [(0, 4), (8, 12)] and inter.shard is None
    np.testing.assert_array_equal(inter.positions, np.r_[0:4, 8:12])
    # A batch replicated over a mesh axis: both devices hold the same rows.
    grid = NamedSharding(Mesh(np.array(devs).reshape(2, 2), ("data", "model")), P("data"))
    assert zjax.process_rows(grid, (B,), devs[:2]).ranges == [(0, 8)]
    assert zjax.process_rows(grid, (B,), devs[:2]).shard == (0, 2)


def test_global_loader_single_process(streams):
    _need_devices(4)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("data",)), P("data"))
    with zjax.global_loader(streams, B, sharding, mode=MODE, seed=SEED, num_workers=1) as g:
        assert g.plan.shard == (0, 1) and not g.full_batch
        for step in range(3):
            batch = next(g)
            assert batch["x"].shape == (B, 3) and batch["x"].sharding == sharding
            assert len(batch["y"].addressable_shards) == 4
            np.testing.assert_array_equal(np.asarray(batch["y"]), _expected(step))
        state = g.state()
    assert state["step"] == 3
    with pytest.raises(zjax.StateMismatchError, match="global batch 16"):
        zjax.global_loader(streams, 2 * B, sharding, state=state)
    with pytest.raises(zjax.StateMismatchError, match="seed=5"):
        zjax.global_loader(streams, B, sharding, seed=SEED + 1, state=state)
    with pytest.raises(ValueError, match="process 1 of 4"):
        zjax.global_loader(streams, B, sharding, process_index=1, process_count=4)


def test_global_loader_reads_a_mixture_and_resumes_it(tmp_path):
    """global_loader took only stream dicts (`'Mixture' object is not
    iterable`). Over a mixture its global batches are the DataLoader's, each
    device's rows hold each source's share of its 4 rows (16 rows, weights
    0.5/0.3/0.2: 2, 1.2 and 0.8 rows) within a row, and its checkpoint
    resumes exactly."""
    _need_devices(4)
    mix = _write_mix(tmp_path)
    want = _mix_expected(mix, 8)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("data",)), P("data"))
    with zjax.global_loader(mix, B, sharding, mode=MODE, seed=SEED, num_workers=1) as g:
        for step in range(4):
            batch = next(g)
            assert batch["x"].shape == (B, 2) and batch["y"].sharding == sharding
            y = np.asarray(batch["y"])
            np.testing.assert_array_equal(y, want[step])
            np.testing.assert_array_equal(np.asarray(batch["x"])[:, 0], (y % 100_000 + y // 100_000).astype(np.float32))
            for shard in batch["y"].addressable_shards:
                counts = np.bincount(np.asarray(shard.data) // 100_000, minlength=3)
                assert np.all(np.abs(counts - np.array(MIX_WEIGHTS) * 4) <= 1), counts
        state = json.loads(json.dumps(g.state()))
    assert state["step"] == 4 and state["mixture"]["order"] == "Interleaved"
    with zjax.global_loader(mix, B, sharding, state=state, num_workers=1) as g:
        for step in range(4, 8):
            np.testing.assert_array_equal(np.asarray(next(g)["y"]), want[step])
    with zjax.restore_loader(mix, state, shard=(1, 2), num_workers=1) as dl:
        np.testing.assert_array_equal(next(dl)["y"], want[4][8:])


def test_global_loader_reads_a_packed_mixture_and_resumes_it(tmp_path):
    """A zring.pack source: global tokens, segment_ids and positions of
    (B, seq_len), the rows a DataLoader over it delivers; its checkpoint
    carries the packed loader's state and resumes exactly."""
    _need_devices(4)
    docs = []
    for k, n in enumerate((300, 200, 120)):
        zring.write_ragged(tmp_path / f"d{k}", [np.full(int(i % 37) + 3, 1000 * k + i % 1000, np.int32)
                                                 for i in range(n)])
        docs.append(zring.RaggedDataset(tmp_path / f"d{k}"))
    packed = zring.pack(zring.mix(docs, MIX_WEIGHTS), 24)
    with zring.DataLoader(packed, batch_size=B, mode=MODE, seed=SEED, num_workers=1) as dl:
        want = [dict(next(dl)) for _ in range(6)]
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("data",)), P("data"))
    with zjax.global_loader(packed, B, sharding, mode=MODE, seed=SEED, num_workers=1) as g:
        for step in range(3):
            batch = next(g)
            assert sorted(batch) == ["positions", "segment_ids", "tokens"]
            for key in batch:
                assert batch[key].shape == (B, 24) and batch[key].sharding == sharding
                np.testing.assert_array_equal(np.asarray(batch[key]), want[step][key])
        state = json.loads(json.dumps(g.state()))
    assert state["step"] == 3 and "loader" in state
    with zjax.global_loader(packed, B, sharding, state=state, num_workers=1) as g:
        for step in range(3, 6):
            batch = next(g)
            for key in batch:
                np.testing.assert_array_equal(np.asarray(batch[key]), want[step][key])
    with pytest.raises(zjax.StateMismatchError, match="packed source"):
        zjax.global_loader(_write_mix(tmp_path / "m"), B, sharding, state=state)


def test_global_loader_says_how_to_feed_ragged_stores(tmp_path):
    zring.write_ragged(tmp_path / "r", [np.arange(i % 5, dtype=np.int32) for i in range(40)])
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))
    with pytest.raises(TypeError, match=r"zring.pack\(ds, seq_len\)"):
        zjax.global_loader({"r": zring.RaggedDataset(tmp_path / "r")}, 4, sharding)
    with pytest.raises(TypeError, match="a zring.mix"):
        zjax.global_loader([1, 2], 4, sharding)


# --------------------------------------------------------------------------
# Real multi-process runs
# --------------------------------------------------------------------------

STEPS_BEFORE, STEPS_AFTER = 2, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, data: Path, out: Path, state: dict | None = None) -> list[dict]:
    """Runs ``nproc`` worker processes of one JAX job; returns each one's report."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    state_arg = json.dumps(state) if state is not None else ""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(port), str(nproc), str(i), str(data), str(out), state_arg],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(nproc)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(i, p.returncode, log) for i, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    assert not failed, "worker failed:\n" + "\n".join(f"--- process {i} (rc {rc})\n{log[-3000:]}" for i, rc, log in failed)
    return [pickle.loads((out / f"report-{nproc}-{i}.pkl").read_bytes()) for i in range(nproc)]


def _worker(port: str, nproc: str, pid: str, data: str, out: str, state_arg: str) -> None:
    nproc_, pid_ = int(nproc), int(pid)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc_, process_id=pid_,
                               initialization_timeout=90)
    streams = {"x": zring.Dataset(Path(data) / "x"), "y": zring.Dataset(Path(data) / "y")}
    devs = np.array(jax.devices())  # process p holds devices 2p, 2p + 1
    layouts = {
        # The batch axis over all devices in order: each process reads one shard.
        "contiguous": NamedSharding(Mesh(devs, ("data",)), P("data")),
    }
    if nproc_ == 4:
        # Each process's two devices sit four apart in the mesh: its rows are two
        # separate blocks, so it reads the whole global batch and keeps them.
        layouts["interleaved"] = NamedSharding(Mesh(devs.reshape(4, 2).T.reshape(-1), ("data",)), P("data"))
        # The batch split in two over 'data'; processes 0, 1 hold one half, 2, 3 the other.
        layouts["replicated"] = NamedSharding(Mesh(devs.reshape(2, 4), ("data", "model")), P("data"))
    # The same contiguous layout over a mixture of three sources.
    layouts["mixture"] = layouts["contiguous"]
    sources = [{"x": zring.Dataset(Path(data) / f"m{k}x"), "y": zring.Dataset(Path(data) / f"m{k}y")}
               for k in range(len(MIX_LENGTHS))]
    mix = zring.mix(sources, MIX_WEIGHTS)
    states = json.loads(state_arg) if state_arg else None
    steps = STEPS_AFTER if states is not None else STEPS_BEFORE + STEPS_AFTER
    report: dict = {"process_index": jax.process_index(), "layouts": {}}
    for name, sharding in layouts.items():
        state = states.get(name) if states else None
        g = zjax.global_loader(mix if name == "mixture" else streams, B, sharding, mode=None if states else MODE,
                               seed=None if states else SEED, state=state, num_workers=1)
        rec = {"ranges": g.plan.ranges, "full_batch": g.full_batch, "steps": []}
        for k in range(steps):
            if name in ("contiguous", "mixture") and states is None and k == STEPS_BEFORE:
                rec["state"] = g.state()
            batch = next(g)
            assert batch["x"].shape[0] == B and not batch["x"].is_fully_addressable
            rec["steps"].append([
                (s.index[0].indices(B)[:2], np.asarray(s.data), np.asarray(batch["y"].addressable_shards[j].data))
                for j, s in enumerate(batch["x"].addressable_shards)
            ])
        g.close()
        report["layouts"][name] = rec
    (Path(out) / f"report-{nproc_}-{pid_}.pkl").write_bytes(pickle.dumps(report))
    jax.distributed.shutdown()


def _check_step(reports: list[dict], layout: str, k: int, step: int, *, exclusive: bool) -> np.ndarray:
    """Assembles step ``k`` of ``layout`` from all processes and checks it against the sampler."""
    want = _expected(step)
    seen = np.zeros(B, dtype=np.int64)
    got_y = np.full(B, -1, dtype=np.int64)
    rows_by_process = []
    for r in reports:
        rows = set()
        for (a, b), x, y in r["layouts"][layout]["steps"][k]:
            # A replica must agree with what another device already holds.
            filled = got_y[a:b] >= 0
            assert np.array_equal(got_y[a:b][filled], y[filled])
            got_y[a:b] = y
            np.testing.assert_array_equal(x[:, 0], want[a:b].astype(np.float32))
            np.testing.assert_array_equal(x[:, 2], -want[a:b].astype(np.float32))
            rows.update(range(a, b))
        for row in rows:
            seen[row] += 1
        rows_by_process.append(rows)
    np.testing.assert_array_equal(got_y, want)
    if exclusive:
        assert (seen == 1).all(), f"rows not covered exactly once: {seen}"
    return got_y


@pytest.fixture(scope="module")
def multiprocess(tmp_path_factory):
    """One 4-process run (saving a state after STEPS_BEFORE steps) and a 2-process run resuming it."""
    root = tmp_path_factory.mktemp("multiprocess")
    for ds in _write(root / "data").values():
        ds.close()
    _write_mix(root / "data")
    four = _launch(4, root / "data", root)
    return root, four


def test_four_processes_cover_each_global_batch_once(multiprocess):
    _, four = multiprocess
    assert [r["process_index"] for r in four] == [0, 1, 2, 3]
    plans = [r["layouts"]["contiguous"] for r in four]
    assert [p["ranges"] for p in plans] == [[(0, 4)], [(4, 8)], [(8, 12)], [(12, 16)]]
    assert not any(p["full_batch"] for p in plans)
    for k in range(STEPS_BEFORE + STEPS_AFTER):
        _check_step(four, "contiguous", k, k, exclusive=True)


def test_four_processes_interleaved_rows_read_the_full_batch(multiprocess):
    _, four = multiprocess
    plans = [r["layouts"]["interleaved"] for r in four]
    assert [p["ranges"] for p in plans] == [[(2 * p, 2 * p + 2), (2 * p + 8, 2 * p + 10)] for p in range(4)]
    assert all(p["full_batch"] for p in plans)
    for k in range(STEPS_BEFORE + STEPS_AFTER):
        _check_step(four, "interleaved", k, k, exclusive=True)


def test_four_processes_replicated_halves_are_identical(multiprocess):
    _, four = multiprocess
    assert [r["layouts"]["replicated"]["ranges"] for r in four] == [[(0, 8)], [(0, 8)], [(8, 16)], [(8, 16)]]
    for k in range(STEPS_BEFORE + STEPS_AFTER):
        _check_step(four, "replicated", k, k, exclusive=False)
        for a, b in ((0, 1), (2, 3)):
            ya = np.concatenate([y for _, _, y in four[a]["layouts"]["replicated"]["steps"][k]])
            yb = np.concatenate([y for _, _, y in four[b]["layouts"]["replicated"]["steps"][k]])
            np.testing.assert_array_equal(ya, yb)


def test_state_saved_on_four_processes_resumes_on_two(multiprocess):
    root, four = multiprocess
    states = [r["layouts"]["contiguous"]["state"] for r in four]
    assert all(s == states[0] for s in states), "every process must save the same state"
    assert states[0]["step"] == STEPS_BEFORE
    two = _launch(2, root / "data", root, state={"contiguous": states[0]})
    assert [r["layouts"]["contiguous"]["ranges"] for r in two] == [[(0, 8)], [(8, 16)]]
    for k in range(STEPS_AFTER):
        after = _check_step(two, "contiguous", k, STEPS_BEFORE + k, exclusive=True)
        before = _check_step(four, "contiguous", STEPS_BEFORE + k, STEPS_BEFORE + k, exclusive=True)
        np.testing.assert_array_equal(after, before)


def _mix_step(reports: list[dict], k: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step ``k`` of the mixture layout: the global y, and each process's rows."""
    got = np.full(B, -1, dtype=np.int64)
    per_process = []
    for r in reports:
        mine = []
        for (a, b), _, y in r["layouts"]["mixture"]["steps"][k]:
            got[a:b] = y
            mine.append(y)
        per_process.append(np.concatenate(mine))
    return got, per_process


def test_processes_of_a_mixture_each_hold_every_share_and_resume_on_two(multiprocess):
    """Four processes over a 0.5/0.3/0.2 mixture: together the global batch a
    single DataLoader delivers, each process's 4 rows within a row of each
    share (grouped rows gave process 0 only source 0); the state saved on
    four resumes on two with the same batches."""
    root, four = multiprocess
    mix = _write_mix(root / "check")
    want = _mix_expected(mix, STEPS_BEFORE + STEPS_AFTER)
    for k in range(STEPS_BEFORE + STEPS_AFTER):
        got, per_process = _mix_step(four, k)
        np.testing.assert_array_equal(got, want[k])
        for rows in per_process:
            counts = np.bincount(rows // 100_000, minlength=3)
            assert np.all(np.abs(counts - np.array(MIX_WEIGHTS) * 4) <= 1), (k, counts)
    states = [r["layouts"]["mixture"]["state"] for r in four]
    assert all(s == states[0] for s in states) and states[0]["mixture"]["order"] == "Interleaved"
    two = _launch(2, root / "data", root, state={"mixture": states[0]})
    for k in range(STEPS_AFTER):
        got, _ = _mix_step(two, k)
        np.testing.assert_array_equal(got, want[STEPS_BEFORE + k])


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "worker":
    _worker(*sys.argv[2:])
