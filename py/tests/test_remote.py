"""Datasets in object storage, against a real S3 server on 127.0.0.1
(moto's), with a proxy that throttles, cuts bodies, stops answering and
replaces objects (s3_server.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import zring
from zring import parts, remote

from s3_server import Faults, Moto

pytestmark = pytest.mark.skipif(not hasattr(zring._zring, "stage"), reason="built without the remote feature")


@pytest.fixture(scope="module")
def s3():
    server = Moto()
    yield server
    server.stop()


@pytest.fixture
def bucket(s3, request):
    name = "t-" + request.node.name.replace("_", "-")[:40].lower().strip("-")
    s3.bucket(name)
    return name


@pytest.fixture(scope="module")
def local_ray():
    """Ray in local mode for the module's Ray tests, shut down after them
    (unless another module's tests had started it)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def faults(s3):
    proxy = Faults(s3)
    yield proxy
    proxy.stop()


def _parts(root: Path, n: int = 6, rows: int = 500, start: int = 0) -> Path:
    for k in range(start, start + n):
        info = parts.write_part(root, np.arange(k * rows, (k + 1) * rows, dtype=np.int64).reshape(-1, 1) * 3)
        parts.commit(root, [info])
    return root


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_a_ranks_share_is_staged_alone_and_reads_as_the_local_copy_does(s3, bucket, tmp_path):
    local = _parts(tmp_path / "local")
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    for rank in range(3):
        with zring.Dataset(url, cache=tmp_path / "cache", rank_parts=(rank, 3), storage_options=s3.options()) as ds, \
             zring.Dataset(local, rank_parts=(rank, 3)) as mine:
            assert ds.url == url
            idx = np.arange(len(mine))
            np.testing.assert_array_equal(ds[idx], mine[idx])
    # A fourth rank count's share lands beside; the folder of rank 0 of 2
    # holds only that rank's parts.
    done = remote.stage(url, tmp_path / "only0", rank=0, ranks=2, storage_options=s3.options())
    plan = {d: r for d, _, r, _ in zring._zring.rank_plan(str(local), 2)}
    held = {f.split("/")[1] for f in _files(Path(done["path"])) if f.startswith("parts/")}
    assert held == {d.split("/")[1] for d, r in plan.items() if r == 0}


def test_a_second_stage_fetches_nothing_and_an_append_fetches_only_the_new_parts(s3, bucket, tmp_path):
    local = _parts(tmp_path / "local", n=4)
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    first = remote.stage(url, tmp_path / "cache", storage_options=s3.options())
    again = remote.stage(url, tmp_path / "cache", storage_options=s3.options())
    assert first["fetched_objects"] > 0 and again["fetched_objects"] == 0
    assert again["reused_objects"] == first["fetched_objects"]
    _parts(local, n=1, start=4)
    remote.upload(local, url, storage_options=s3.options())
    grown = remote.stage(url, tmp_path / "cache", storage_options=s3.options())
    assert 0 < grown["fetched_objects"] < first["fetched_objects"], grown
    with zring.Dataset(url, cache=tmp_path / "cache", storage_options=s3.options()) as ds:
        assert len(ds) == 5 * 500
        np.testing.assert_array_equal(ds[np.array([0, 2499])][:, 0], [0, 2499 * 3])


def test_a_share_larger_than_the_cap_is_refused_naming_the_bytes_it_needs(s3, bucket, tmp_path):
    local = _parts(tmp_path / "local", n=2)
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    # A dataset of parts over the cap is read line by line, in a cache that
    # holds its tables and a round of lines at least.
    with pytest.raises(ValueError, match=r"s3://.*/ds needs \d+ B of the cache at least \(\d+ B of tables and heads, "
                                         r"and room for 16 lines of 262144 B\), more than cache_disk_bytes=1000: "
                                         r"raise cache_disk_bytes to at least"):
        zring.Dataset(url, cache=tmp_path / "cache", cache_disk_bytes=1000, storage_options=s3.options())
    assert not list((tmp_path / "cache").rglob("*.zr")), "nothing fetched"
    # A single store is staged whole or not at all.
    zring.write_dataset(tmp_path / "one", np.zeros((100, 8), np.float32))
    remote.upload(tmp_path / "one", f"s3://{bucket}/one", storage_options=s3.options())
    with pytest.raises(ValueError, match=r"s3://.*/one is \d+ B, more than cache_disk_bytes=1000: raise "
                                         r"cache_disk_bytes to at least \d+"):
        zring.Dataset(f"s3://{bucket}/one", cache=tmp_path / "cache", cache_disk_bytes=1000,
                      storage_options=s3.options())


def test_a_dataset_no_process_reads_is_evicted_for_room_and_one_open_is_not(s3, bucket, tmp_path):
    opts = s3.options()
    for name in ("a", "b", "c"):
        remote.upload(_parts(tmp_path / name, n=2), f"s3://{bucket}/{name}", storage_options=opts)
    share = remote.stage(f"s3://{bucket}/a", tmp_path / "probe", storage_options=opts)["share_bytes"]
    cap = int(share * 2.5)
    cache = tmp_path / "cache"
    with zring.Dataset(f"s3://{bucket}/a", cache=cache, cache_disk_bytes=cap, storage_options=opts) as a:
        remote.stage(f"s3://{bucket}/b", cache, cache_bytes=cap, storage_options=opts)
        # c needs room: b (not open) goes, a (open) stays.
        done = remote.stage(f"s3://{bucket}/c", cache, cache_bytes=cap, storage_options=opts)
        assert done["removed_bytes"] > 0
        assert len(a[np.arange(len(a))]) == 1000
        names = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
        assert [n.split("-")[-2] for n in names] == ["a", "c"], names
        used = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
        assert used <= cap + 4096


def test_the_processes_of_a_host_fetch_each_object_once(s3, bucket, tmp_path):
    url = f"s3://{bucket}/ds"
    remote.upload(_parts(tmp_path / "local", n=4), url, storage_options=s3.options())
    child = textwrap.dedent("""
        import json, sys
        from zring import remote
        print(json.dumps(remote.stage(sys.argv[1], sys.argv[2], storage_options=json.loads(sys.argv[3]))))
    """)
    import json
    procs = [subprocess.Popen([sys.executable, "-c", child, url, str(tmp_path / "cache"), json.dumps(s3.options())],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    objects = len(zring._zring.list_objects(url, list(s3.options().items()), "parts/"))
    assert sum(o["fetched_objects"] for o in outs) == objects, outs
    assert sorted(o["reused_objects"] for o in outs) == [0, objects, objects]


def test_concurrent_committers_lose_none_of_each_others_parts(s3, bucket, tmp_path):
    url = f"s3://{bucket}/ds"
    child = textwrap.dedent("""
        import json, sys
        import numpy as np
        from zring import _zring, parts
        url, root, opts, k = sys.argv[1], sys.argv[2], list(json.loads(sys.argv[3]).items()), int(sys.argv[4])
        for i in range(8):
            w = _zring.PartWriter(root, None)
            info = parts.write_part(root, np.full((10, 1), 100 * k + i, np.int64))
            _zring.upload_part(url, opts, f"{root}/staging/{info.name}", info.name)
            schema = _zring.manifest_schema(root) if False else None
            print(_zring.commit(url, opts, [(info.name, info.records, info.content, sys.argv[5], 80)], False)[1])
    """)
    import json
    probe = tmp_path / "probe"
    parts.commit(probe, [parts.write_part(probe, np.zeros((1, 1), np.int64))])
    schema = zring._zring.manifest_schema(str(probe))
    procs = [subprocess.Popen([sys.executable, "-c", child, url, str(tmp_path / f"w{k}"), json.dumps(s3.options()),
                               str(k), schema], stdout=subprocess.PIPE, text=True) for k in range(3)]
    retries = [sum(int(x) for x in p.communicate(timeout=300)[0].split()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    with zring.Dataset(url, cache=tmp_path / "cache", storage_options=s3.options()) as ds:
        got = sorted(set(ds[np.arange(len(ds))][:, 0].tolist()))
    assert got == sorted(100 * k + i for k in range(3) for i in range(8)), f"retries {retries}"


def test_throttling_and_bodies_cut_mid_stream_are_retried_and_the_data_is_exact(s3, bucket, faults, tmp_path):
    local = _parts(tmp_path / "local", n=3, rows=20_000)
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    faults.throttle_every, faults.cut_every = 3, 4
    st = remote.stage(url, tmp_path / "cache", storage_options=s3.options(faults.endpoint))
    with zring.Dataset(url, cache=tmp_path / "cache", storage_options=s3.options(faults.endpoint)) as ds, \
         zring.Dataset(local) as mine:
        np.testing.assert_array_equal(ds[np.arange(len(ds))], mine[np.arange(len(mine))])
    assert faults.throttled > 0 and faults.cut > 0, (faults.throttled, faults.cut)
    # The stage's counters saw what the proxy did: every throttle, and an
    # attempt more than the requests asked for per throttle and per cut.
    assert st["throttles"] > 0 and st["request_errors"] == 0, st
    assert st["http_attempts"] >= st["requests"] + st["throttles"], st


def test_a_server_that_stops_answering_is_an_error_naming_the_object_within_the_deadline(s3, bucket, faults,
                                                                                         tmp_path):
    url = f"s3://{bucket}/ds"
    remote.upload(_parts(tmp_path / "local", n=1), url, storage_options=s3.options())
    faults.hang = True
    opts = s3.options(faults.endpoint, timeout=1, retry_timeout=2, max_retries=1)
    t = time.time()
    with pytest.raises((TimeoutError, OSError), match=rf"s3://{bucket}/ds/manifest.json"):
        remote.stage(url, tmp_path / "cache", storage_options=opts)
    assert time.time() - t < 60


def test_an_object_replaced_while_it_is_fetched_is_a_stale_error(s3, bucket, faults, tmp_path):
    local = _parts(tmp_path / "local", n=1)
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    table = next(k for k, _, _ in zring._zring.list_objects(url, list(s3.options().items()), "parts/")
                 if k.endswith("head.zr"))
    faults.replace = (f"/{bucket}/ds/{table}", b"another version")
    with pytest.raises(zring.StaleError, match=rf"s3://{bucket}/ds/{table} was replaced"):
        remote.stage(url, tmp_path / "cache", storage_options=s3.options(faults.endpoint))
    assert not (Path(tmp_path / "cache") / zring._zring.cache_name(url, None) / "manifest.json").exists()


def test_bad_arguments_are_named(s3, bucket, tmp_path):
    url = f"s3://{bucket}/ds"
    with pytest.raises(ValueError, match="needs cache="):
        zring.Dataset(url, storage_options=s3.options())
    with pytest.raises(ValueError, match="cache= is for datasets in object storage"):
        zring.Dataset(tmp_path, cache=tmp_path / "c")
    with pytest.raises(ValueError, match=r'storage option "no_such_key" is not one s3:// knows.*the tier\'s own are timeout, connect_timeout'):
        remote.stage(url, tmp_path / "c", storage_options={"no_such_key": "1"})
    with pytest.raises(ValueError, match=r'storage option timeout="soon": a positive number of seconds'):
        remote.stage(url, tmp_path / "c", storage_options={"timeout": "soon"})
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/ds \(neither manifest.json nor head.zr\)"):
        remote.stage(url, tmp_path / "c", storage_options=s3.options())
    with pytest.raises(ValueError, match=r"rank=2 of ranks=2"):
        remote.stage(url, tmp_path / "c", rank=2, ranks=2, storage_options=s3.options())


def test_a_single_store_is_staged_whole_and_opens(s3, bucket, tmp_path):
    data = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    zring.write_dataset(tmp_path / "one", data)
    url = f"s3://{bucket}/one"
    remote.upload(tmp_path / "one", url, storage_options=s3.options())
    with zring.Dataset(url, cache=tmp_path / "cache", storage_options=s3.options()) as ds:
        np.testing.assert_array_equal(ds[np.arange(1000)], data)


def test_the_cli_stages_a_ranks_share(s3, bucket, tmp_path):
    url = f"s3://{bucket}/ds"
    local = _parts(tmp_path / "local", n=4)
    remote.upload(local, url, storage_options=s3.options())
    env = dict(os.environ, AWS_ENDPOINT_URL=s3.endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
    out = subprocess.run([sys.executable, "-m", "zring.cli", "stage", url, "--ranks", "2", "--rank", "1", "--cache",
                          str(tmp_path / "cache")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fetched" in out.stdout
    with zring.Dataset(url, cache=tmp_path / "cache", rank_parts=(1, 2), storage_options=s3.options()) as ds, \
         zring.Dataset(local, rank_parts=(1, 2)) as mine:
        np.testing.assert_array_equal(ds[np.arange(len(ds))], mine[np.arange(len(mine))])
    bad = subprocess.run([sys.executable, "-m", "zring.cli", "stage", url, "--cache", str(tmp_path / "c2"),
                          "--cache-bytes", "100"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0 and "raise --cache-bytes to at least" in bad.stderr, bad.stderr


def test_ray_writes_a_dataset_to_a_bucket_and_a_host_reads_its_share(s3, bucket, local_ray, tmp_path):
    import ray

    import zring.ray
    url = f"s3://{bucket}/corpus"
    opts = s3.options()
    ds = ray.data.range(10_000, override_num_blocks=8).map_batches(
        lambda b: {"x": np.asarray(b["id"]) * 2, "y": np.asarray(b["id"]).astype(np.float32)}, batch_format="numpy")
    assert zring.ray.write(ds, url, column=["x", "y"], storage_options=opts) == 10_000
    with pytest.raises(FileExistsError, match=rf"{url}/x.zr holds a dataset of parts already"):
        zring.ray.write(ds, url, column=["x", "y"], storage_options=opts)
    more = ray.data.range(1_000, override_num_blocks=2).map_batches(
        lambda b: {"x": np.asarray(b["id"]) * 2 + 20_000, "y": np.asarray(b["id"]).astype(np.float32)},
        batch_format="numpy")
    zring.ray.write(more, url, column=["x", "y"], mode="append", storage_options=opts)
    seen = []
    for rank in range(2):
        with zring.Dataset(f"{url}/x.zr", cache=tmp_path / f"host{rank}", rank_parts=(rank, 2),
                           storage_options=opts) as x:
            seen += x[np.arange(len(x))].tolist()
    assert sorted(seen) == sorted(list(range(0, 20_000, 2)) + list(range(20_000, 22_000, 2)))
    # Nothing but listed parts is left in the bucket.
    listed = {p.split("/")[1] for p in _manifest_dirs(url + "/x.zr", opts)}
    uploaded = {k.split("/")[1] for k, _, _ in zring._zring.list_objects(url + "/x.zr", list(opts.items()), "parts/")}
    assert uploaded == listed


def _manifest_dirs(url: str, opts: dict[str, str]) -> list[str]:
    import tempfile

    d = tempfile.mkdtemp()
    done = remote.stage(url, d, storage_options=opts)
    return [p["dir"] for p in parts.list_parts(done["path"])]


def _big_parts(root: Path, parts_n: int = 8, per: int = 256, rec: int = 4096) -> int:
    """Parts of raw records of ``rec`` bytes whose first 8 bytes are the
    record's index; returns the chunk bytes."""
    for k in range(parts_n):
        a = np.zeros((per, rec), np.uint8)
        a[:, :8] = np.arange(k * per, (k + 1) * per, dtype=np.uint64).view(np.uint8).reshape(per, 8)
        parts.commit(root, [parts.write_part(root, a, codec="raw")])
    return parts_n * per * rec


def _allocated(d: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())


def _cycles(ds, cycles: int, seed: int = 1) -> list[int]:
    """Bytes fetched in each of ``cycles`` mode-3 cycles; every record read
    once a cycle."""
    n = len(ds)
    out = []
    with zring.DataLoader({"x": ds}, batch_size=64, mode=3, seed=seed, block_records=16, window_blocks=4) as dl:
        for _ in range(cycles):
            before = ds.remote_stats()["bytes_fetched"]
            ids = []
            for _ in range(n // 64):
                ids += next(dl)["x"][:, :8].copy().view(np.uint64)[:, 0].tolist()
            assert sorted(ids) == list(range(n)), "every record once a cycle"
            out.append(ds.remote_stats()["bytes_fetched"] - before)
    return out


def test_a_share_twice_the_cap_in_mode_3_fetches_half_a_cycle_and_never_holds_more_than_the_cap(s3, bucket,
                                                                                                  tmp_path):
    import threading

    url = f"s3://{bucket}/ds"
    chunk_bytes = _big_parts(tmp_path / "local")
    remote.upload(tmp_path / "local", url, storage_options=s3.options())
    opts = s3.options(cache_line_bytes=65536)
    share = remote.stage(url, tmp_path / "probe", storage_options=opts)["share_bytes"]
    cap = share // 2
    fetched = {}
    for policy in ("next_use", "lru"):
        cache = tmp_path / f"cache-{policy}"
        with zring.Dataset(url, cache=cache, cache_disk_bytes=cap, storage_options={**opts, "cache_eviction": policy}) \
                as ds:
            assert ds.remote_stats() is not None, "staged lazily"
            with pytest.raises(ValueError, match=r"mode 2 draws any record at any step.*use mode=3"):
                zring.DataLoader({"x": ds}, batch_size=64, mode=2)
            worst, stop = [0], threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    worst[0] = max(worst[0], _allocated(cache))
                    time.sleep(0.1)
            t = threading.Thread(target=sample)
            t.start()
            try:
                fetched[policy] = _cycles(ds, 3)
            finally:
                stop.set()
                t.join()
            assert worst[0] <= cap, f"{worst[0]} B allocated in the cache, cap {cap}"
            assert ds.remote_stats()["cache_used_bytes"] <= cap
    first, *later = fetched["next_use"]
    assert first == chunk_bytes
    for f in later:
        assert f <= 1.05 * 0.5 * chunk_bytes, (fetched, chunk_bytes)
    assert sum(fetched["lru"][1:]) > sum(later), fetched


def test_two_processes_on_one_line_cache_read_every_row_right_under_eviction(s3, bucket, tmp_path):
    import json

    url = f"s3://{bucket}/ds"
    _big_parts(tmp_path / "local")
    remote.upload(tmp_path / "local", url, storage_options=s3.options())
    opts = s3.options(cache_line_bytes=65536)
    share = remote.stage(url, tmp_path / "probe", storage_options=opts)["share_bytes"]
    child = textwrap.dedent("""
        import json, sys
        import numpy as np
        import zring
        url, cache, cap, opts, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
        with zring.Dataset(url, cache=cache, cache_disk_bytes=cap, storage_options=opts) as ds:
            n = len(ds)
            with zring.DataLoader({"x": ds}, batch_size=64, mode=3, seed=seed, block_records=16,
                                  window_blocks=4) as dl:
                for c in range(2):
                    ids = []
                    for _ in range(n // 64):
                        ids += next(dl)["x"][:, :8].copy().view(np.uint64)[:, 0].tolist()
                    assert sorted(ids) == list(range(n)), f"cycle {c}"
            print(json.dumps(ds.remote_stats()))
    """)
    cap = int(share * 0.6)
    procs = [subprocess.Popen([sys.executable, "-c", child, url, str(tmp_path / "cache"), str(cap), json.dumps(opts),
                               str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    assert _allocated(tmp_path / "cache") <= cap


class _FailOnce:
    """Where the failing write task marks that it failed (a marker file
    tells the retry from the first attempt)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker


def test_ray_writes_200000_documents_to_a_bucket_exactly_once_though_a_task_fails_after_its_upload(s3, bucket,
                                                                                                  local_ray, tmp_path):
    import ray

    import zring.ray
    url = f"s3://{bucket}/docs"
    opts = s3.options()
    ds = ray.data.range(200_000, override_num_blocks=8).map_batches(
        lambda b: {"tokens": np.array([np.full(i % 7 + 1, i, np.int32) for i in b["id"]] + [np.zeros(0, np.int32)],
                                      dtype=object)[:-1]}, batch_format="numpy", batch_size=25_000)
    fail = _FailOnce(str(tmp_path / "failed-once"))
    # Ray's workers do not import this test module: its sink goes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class Sink(zring.ray.ZringDatasink):
        def write(self, blocks, ctx):
            return _fail_write(self, fail, blocks, ctx)

    sink = Sink(url, column="tokens", storage_options=opts)
    ds.write_datasink(sink, ray_remote_args={"retry_exceptions": True, "max_retries": 2})
    assert os.path.exists(fail.marker), "the failure was injected"
    assert sink.rows == 200_000
    with zring.RaggedDataset(url, cache=tmp_path / "cache", storage_options=opts) as docs:
        values, splits = docs[np.arange(len(docs))]
        firsts = values[splits[:-1]]
        assert sorted(firsts.tolist()) == list(range(200_000)), "every document exactly once"
        lens = np.diff(splits)
        assert np.array_equal(lens, firsts % 7 + 1)
    listed = {p.split("/")[1] for p in _manifest_dirs(url, opts)}
    uploaded = {k.split("/")[1] for k, _, _ in zring._zring.list_objects(url, list(opts.items()), "parts/")}
    assert uploaded == listed, f"left in the bucket: {uploaded - listed}"


def _fail_write(sink, fail, blocks, ctx):
    result = zring.ray.ZringDatasink.write(sink, blocks, ctx)
    if result.task == 3 and not os.path.exists(fail.marker):
        open(fail.marker, "w").close()
        raise RuntimeError("injected: task 3 fails after its upload")
    return result


def test_a_run_killed_mid_fetch_resumes_with_the_same_batches_and_keeps_what_was_cached(s3, bucket, tmp_path):
    import json
    import signal

    url = f"s3://{bucket}/ds"
    _big_parts(tmp_path / "local")
    remote.upload(tmp_path / "local", url, storage_options=s3.options())
    opts = s3.options(cache_line_bytes=65536)
    share = remote.stage(url, tmp_path / "probe", storage_options=opts)["share_bytes"]
    cap = share // 2
    run = textwrap.dedent("""
        import json, sys, time
        import numpy as np
        import zring
        url, cache, cap, opts, start, steps, out = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                                    json.loads(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7])
        state = None if start == "-" else json.load(open(start))
        with zring.Dataset(url, cache=cache, cache_disk_bytes=cap, storage_options=opts) as ds:
            kw = dict(batch_size=64, mode=3, seed=5, block_records=16, window_blocks=4) if state is None else {}
            with zring.DataLoader({"x": ds}, state=state, **kw) as dl:
                with open(out, "w") as f:
                    for s in range(steps):
                        ids = next(dl)["x"][:, :8].copy().view(np.uint64)[:, 0].tolist()
                        f.write(json.dumps({"ids": ids, "state": dl.state(), "stats": ds.remote_stats()}) + "\\n")
                        f.flush()
    """)
    args = lambda cache, start, steps, out: [sys.executable, "-c", run, url, str(cache), str(cap), json.dumps(opts),
                                             start, str(steps), str(out)]
    steps = 3 * (len(zring.Dataset(tmp_path / "local")) // 64)
    ref = tmp_path / "ref.jsonl"
    subprocess.run(args(tmp_path / "ref-cache", "-", steps, ref), check=True, timeout=300)
    reference = [json.loads(x)["ids"] for x in open(ref)]
    # The same run killed (SIGKILL) once it has made 40 steps, mid-fetch or not.
    killed = tmp_path / "killed.jsonl"
    p = subprocess.Popen(args(tmp_path / "cache", "-", steps, killed))
    while not killed.exists() or sum(1 for _ in open(killed)) < 40:
        assert p.poll() is None, "the run ended before it was killed"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    lines = [json.loads(x) for x in open(killed) if x.endswith("\n")]
    done = len(lines)
    assert [x["ids"] for x in lines] == reference[:done]
    (tmp_path / "state.json").write_text(json.dumps(lines[-1]["state"]))
    resumed = tmp_path / "resumed.jsonl"
    subprocess.run(args(tmp_path / "cache", str(tmp_path / "state.json"), steps - done, resumed), check=True,
                   timeout=300)
    after = [json.loads(x) for x in open(resumed)]
    assert [x["ids"] for x in after] == reference[done:], "the batches of a run that never stopped"
    first = after[0]["stats"]
    assert first["fills_hit"] > 0, f"what was cached was fetched again: {first}"


def test_four_ranks_fetch_only_their_parts_and_together_the_dataset_once(s3, bucket, faults, tmp_path):
    local = _parts(tmp_path / "local", n=8, rows=2000)
    url = f"s3://{bucket}/ds"
    remote.upload(local, url, storage_options=s3.options())
    objects = zring._zring.list_objects(url, list(s3.options().items()), "")
    total = sum(size for _, size, _ in objects)
    plan = {d.split("/")[1]: r for d, _, r, _ in zring._zring.rank_plan(str(local), 4)}
    fetched = 0
    for rank in range(4):
        faults.log.clear()
        remote.stage(url, tmp_path / f"host{rank}", rank=rank, ranks=4, storage_options=s3.options(faults.endpoint))
        for method, path, n in faults.log:
            if method == "GET" and "/parts/" in path:
                assert plan[path.split("/parts/")[1].split("/")[0]] == rank, f"rank {rank} fetched {path}"
            fetched += n if method == "GET" and "list-type" not in path else 0
    # Each rank reads the manifest too: the dataset once, and 4 manifests.
    manifest = next(size for k, size, _ in objects if k == "manifest.json")
    assert fetched <= total + 3 * manifest, (fetched, total)
    assert fetched <= 1.05 * total


def test_credentials_from_a_callable_are_asked_for_again_before_they_expire(s3, bucket, tmp_path):
    url = f"s3://{bucket}/ds"
    _big_parts(tmp_path / "local")
    remote.upload(tmp_path / "local", url, storage_options=s3.options())
    calls = []

    def credentials():
        calls.append(time.time())
        return {"key_id": "test", "secret_key": "test", "token": f"session-{len(calls)}", "expires_in": 0.5}

    opts = {k: v for k, v in s3.options(cache_line_bytes=65536).items() if k not in ("aws_access_key_id",
                                                                                      "aws_secret_access_key")}
    opts["credentials"] = credentials
    share = remote.stage(url, tmp_path / "probe", storage_options=s3.options())["share_bytes"]
    with zring.Dataset(url, cache=tmp_path / "cache", cache_disk_bytes=share // 2, storage_options=opts) as ds:
        before = len(calls)
        t = time.time()
        with zring.DataLoader({"x": ds}, batch_size=64, mode=3, seed=1, block_records=16, window_blocks=4) as dl:
            while time.time() - t < 2.5:
                next(dl)
    # One dataset's line cache lives 2.5 s: credentials valid 0.5 s were
    # fetched again as they ran out, not once.
    assert len(calls) - before >= 3, calls

    with pytest.raises(TypeError, match=r"storage_options\['credentials'\] must be a callable"):
        remote.stage(url, tmp_path / "c", storage_options={"credentials": "key"})
    with pytest.raises(OSError, match=r"the credentials callable returned no \"secret_key\""):
        remote.stage(url, tmp_path / "c", storage_options={**s3.options(), "credentials": lambda: {"key_id": "k"}})


def test_credentials_that_expire_every_second_are_refreshed_and_no_read_fails(s3, bucket, faults, tmp_path):
    """The proxy refuses a session token after its expiry (ExpiredToken, as
    AWS does): a run whose callable says when its tokens expire is never
    refused; one whose callable claims an hour, while its tokens last a
    second, is refused, so the refusal is real."""
    url = f"s3://{bucket}/ds"
    _big_parts(tmp_path / "local")
    remote.upload(tmp_path / "local", url, storage_options=s3.options())
    share = remote.stage(url, tmp_path / "probe", storage_options=s3.options())["share_bytes"]
    base = {k: v for k, v in s3.options(faults.endpoint, cache_line_bytes=65536).items()
            if k not in ("aws_access_key_id", "aws_secret_access_key")}

    def fresh():
        token = f"session-{len(faults.tokens)}"
        faults.tokens[token] = time.time() + 1.0
        return {"key_id": "test", "secret_key": "test", "token": token, "expires_in": 1.0}

    def stale():
        # One token, issued once, said to last an hour: it lasts a second.
        if "stale" not in faults.tokens:
            faults.tokens["stale"] = time.time() + 1.0
        return {"key_id": "test", "secret_key": "test", "token": "stale", "expires_in": 3600.0}

    with zring.Dataset(url, cache=tmp_path / "cache", cache_disk_bytes=share // 2,
                       storage_options={**base, "credentials": fresh}) as ds, \
         zring.Dataset(tmp_path / "local") as mine:
        t = time.time()
        with zring.DataLoader({"x": ds}, batch_size=64, mode=3, seed=1, block_records=16, window_blocks=4) as dl, \
             zring.DataLoader({"x": mine}, batch_size=64, mode=3, seed=1, block_records=16, window_blocks=4) as ml:
            while time.time() - t < 3.5:
                np.testing.assert_array_equal(next(dl)["x"], next(ml)["x"])
    assert faults.expired == 0 and len(faults.tokens) >= 3, (faults.expired, len(faults.tokens))

    with zring.Dataset(url, cache=tmp_path / "cache2", cache_disk_bytes=share // 2,
                       storage_options={**base, "credentials": stale}) as ds:
        time.sleep(1.2)
        with pytest.raises(OSError, match="ExpiredToken"):
            ds[np.arange(64)]
    assert faults.expired > 0
