"""zring.ray: a Ray Data dataset written as a dataset of parts, in Ray's local
mode. Every row lands exactly once, a write task that dies after writing its
files is retried by Ray and its first attempt's part is removed, appends grow
the dataset, and the rows committed equal the Ray dataset's count (Ray's sink
interface is a developer API: a silent change of it must fail here)."""

import os
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="zring.ray's tests need Ray Data: pip install 'ray[data]'")
pa = pytest.importorskip("pyarrow")

import zring  # noqa: E402
import zring.ray  # noqa: E402
from zring import parts  # noqa: E402

N = 3000
BLOCKS = 6


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # The sink subclass below is defined here, not in an importable module:
    # the workers get it by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def _batch(batch: dict) -> "pa.Table":
    """Rows of the test dataset: ``id``; ``tokens``, a list of ``id % 7 + 1``
    copies of ``id`` (int32); ``emb``, a fixed float32 (3,) row."""
    ids = np.asarray(batch["id"], dtype=np.int64)
    lens = ids % 7 + 1
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = np.repeat(ids, lens).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    emb = np.stack([ids, ids * 2, -ids], axis=1).astype(np.float32)
    emb_col = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 3)
    return pa.table({"id": ids, "tokens": tokens, "emb": emb_col})


def _dataset(lo: int = 0, hi: int = N, blocks: int = BLOCKS):
    ds = ray.data.range(hi - lo, override_num_blocks=blocks)
    return ds.map_batches(lambda b: _batch({"id": np.asarray(b["id"]) + lo}), batch_format="numpy")


def _doc_ids(path) -> list[int]:
    """The id each document of the ragged dataset at ``path`` holds, checking
    its length and that it holds nothing else."""
    docs = zring.RaggedDataset(str(path))
    values, splits = docs[np.arange(len(docs))]
    out = []
    for i in range(len(docs)):
        doc = values[splits[i]:splits[i + 1]]
        assert len(doc) == doc[0] % 7 + 1 and (doc == doc[0]).all()
        out.append(int(doc[0]))
    return out


def _staged(root) -> list[str]:
    staging = os.path.join(root, "staging")
    return os.listdir(staging) if os.path.isdir(staging) else []


def test_every_row_lands_once_and_the_committed_rows_equal_the_datasets_count(tmp_path):
    ds = _dataset()
    count = ds.count()
    out = tmp_path / "corpus"
    rows = zring.ray.write(ds, out)
    assert rows == count == N, "the rows committed are the Ray dataset's rows"
    assert sorted(os.listdir(out)) == ["emb.zr", "id.zr", "tokens.zr"]
    listed = parts.list_parts(out / "tokens.zr")
    assert sum(p["records"] for p in listed) == count
    assert len(listed) >= 2, "one part per write task"
    ids = _doc_ids(out / "tokens.zr")
    assert sorted(ids) == list(range(N)), "every document exactly once"
    # The columns' parts are committed in the same order: row i of each column is one row.
    id_col = zring.Dataset(str(out / "id.zr"))
    emb = zring.Dataset(str(out / "emb.zr"))
    assert len(id_col) == len(emb) == N
    got = id_col[np.arange(N)].reshape(-1)
    assert got.tolist() == ids
    e = emb[np.arange(N)]
    assert e.shape == (N, 3) and e.dtype == np.float32
    np.testing.assert_array_equal(e, np.stack([got, got * 2, -got], axis=1).astype(np.float32))
    for c in ("emb.zr", "id.zr", "tokens.zr"):
        assert _staged(out / c) == []


class _DiesAfterWriting(zring.ray.ZringDatasink):
    """A sink whose second write task's first attempt dies once its part's
    files are written (the worker process exits, as one killed would)."""

    def __init__(self, path, marker, **kw):
        super().__init__(path, **kw)
        self.marker = marker

    def write(self, blocks, ctx):
        result = super().write(blocks, ctx)
        if ctx.task_idx == 1 and not os.path.exists(self.marker):
            staged = os.listdir(os.path.join(self.path, "staging"))
            assert result.parts["tokens"].name in staged
            open(self.marker, "w").close()
            os._exit(1)
        return result


def test_a_task_dying_after_writing_is_retried_and_its_first_part_removed(tmp_path):
    ds = _dataset()
    out = str(tmp_path / "tokens")
    # Another writer's part, staged and not yet committed: the Ray job must
    # remove its own leftovers only.
    other = parts.write_part(out, [np.full(3, N + 1, np.int32)])
    marker = str(tmp_path / "died")
    sink = _DiesAfterWriting(out, marker, column="tokens", mode="append")
    ds.write_datasink(sink)
    assert os.path.exists(marker), "the task died once"
    assert sink.rows == ds.count() == N
    assert sorted(_doc_ids(out)) == list(range(N)), "every document exactly once"
    assert _staged(out) == [other.name], "no orphan of the job left, the other writer's part kept"
    listed = parts.list_parts(out)
    assert sorted(os.listdir(os.path.join(out, "parts"))) == sorted(p["dir"].split("/")[1] for p in listed)
    parts.commit(out, [other])
    assert len(zring.RaggedDataset(out)) == N + 1, "the other writer's part still commits"


def test_append_adds_parts_after_the_dataset_and_error_mode_refuses_one(tmp_path):
    out = str(tmp_path / "tokens")
    assert zring.ray.write(_dataset(0, 1000, 3), out, column="tokens") == 1000
    first = parts.list_parts(out)
    with pytest.raises(FileExistsError, match="mode='append'"):
        zring.ray.write(_dataset(1000, 1500, 2), out, column="tokens")
    assert parts.list_parts(out) == first
    assert zring.ray.write(_dataset(1000, 1500, 2), out, column="tokens", mode="append") == 500
    grown = parts.list_parts(out)
    assert grown[:len(first)] == first, "the old parts first, unchanged"
    ids = _doc_ids(out)
    assert sorted(ids[:1000]) == list(range(1000)) and sorted(ids[1000:]) == list(range(1000, 1500))
    assert zring.ray.write(_dataset(5000, 5100, 1), out, column="tokens", mode="overwrite") == 100
    assert sorted(_doc_ids(out)) == list(range(5000, 5100))
    # The replaced parts stay for readers of the old version, each marked
    # dropped (a later commit removes them after parts.KEEP_DROPPED).
    listed = {p["dir"].split("/")[1] for p in parts.list_parts(out)}
    dropped = set(os.listdir(os.path.join(out, "dropped")))
    assert set(os.listdir(os.path.join(out, "parts"))) == listed | dropped and not listed & dropped
    assert len(dropped) == len(grown)


def test_numpy_arrays_of_differing_lengths_are_ragged_and_of_one_shape_fixed(tmp_path):
    items = [{"doc": np.full(i % 5 + 1, i, dtype=np.int64), "img": np.full((2, 2), i, dtype=np.uint8)}
             for i in range(200)]
    ds = ray.data.from_items(items, override_num_blocks=4)
    out = tmp_path / "t"
    assert zring.ray.write(ds, out) == 200
    docs = zring.RaggedDataset(str(out / "doc.zr"))
    img = zring.Dataset(str(out / "img.zr"))
    assert len(docs) == len(img) == 200
    for i in range(200):
        d = docs[i]
        k = int(d[0])
        assert len(d) == k % 5 + 1 and (d == k).all()
        np.testing.assert_array_equal(img[i], np.full((2, 2), k, np.uint8))


def _raise(batch):
    if int(np.asarray(batch["id"])[0]) >= 1000:
        raise ValueError("a failing write job")
    return batch


def test_a_failed_job_commits_nothing_and_removes_what_it_staged(tmp_path):
    out = str(tmp_path / "tokens")
    zring.ray.write(_dataset(0, 500, 2), out, column="tokens")
    before = parts.list_parts(out)
    bad = _dataset(500, 3000, 5).map_batches(_raise, batch_format="pyarrow")
    with pytest.raises(Exception, match="a failing write job"):
        zring.ray.write(bad, out, column="tokens", mode="append")
    assert parts.list_parts(out) == before
    assert _staged(out) == []


def test_rows_reported_by_ray_and_parts_that_differ_commit_nothing(tmp_path):
    """The check that catches a sink interface changed under zring.ray."""
    from ray.data.datasource.datasink import WriteResult

    out = str(tmp_path / "tokens")
    info = parts.write_part(out, [np.arange(3)] * 10)
    sink = zring.ray.ZringDatasink(out, column="tokens")
    result = zring.ray._TaskResult(0, 10, {"tokens": info})
    with pytest.raises(RuntimeError, match="12 rows but their parts hold 10"):
        sink.on_write_complete(WriteResult(num_rows=12, size_bytes=0, write_returns=[result]))
    with pytest.raises(RuntimeError, match="not one zring.ray knows"):
        sink.on_write_complete(WriteResult(num_rows=10, size_bytes=0, write_returns=[{"rows": 10}]))
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    # The list of returns older Rays pass works too.
    sink.on_write_complete([result])
    assert len(zring.RaggedDataset(out)) == 10


def _truncated_or_not(batch):
    """Blocks of even number: every document truncated to 16 tokens (Ray
    hands such a block over as a fixed-shape tensor); odd: ``id % 7 + 1``
    tokens each (a variable-shaped tensor)."""
    ids = np.asarray(batch["id"])
    if ids[0] // 10_000 % 2 == 0:
        return {"tokens": np.repeat(ids[:, None], 16, axis=1).astype(np.int32)}
    return {"tokens": np.array([np.full(i % 7 + 1, i, np.int32) for i in ids] + [np.zeros(0, np.int32)],
                               dtype=object)[:-1]}


def test_blocks_of_one_length_and_of_mixed_lengths_make_one_ragged_dataset(tmp_path):
    out = str(tmp_path / "tokens")
    ds = ray.data.range(100_000, override_num_blocks=10).map_batches(
        _truncated_or_not, batch_format="numpy", batch_size=10_000)
    assert zring.ray.write(ds, out, column="tokens") == 100_000
    docs = zring.RaggedDataset(out)
    values, splits = docs[np.arange(len(docs))]
    seen, truncated = [], 0
    for i in range(len(docs)):
        doc = values[splits[i]:splits[i + 1]]
        d = int(doc[0])
        assert len(doc) in (16, d % 7 + 1) and (doc == d).all(), f"document {d}"
        truncated += len(doc) == 16
        seen.append(d)
    assert sorted(seen) == list(range(100_000)), "every document exactly once"
    assert 0 < truncated < 100_000, "blocks of one length and of mixed lengths both"
    # Appending a block of one length to the ragged dataset keeps it ragged.
    more = ray.data.range(10_000, override_num_blocks=1).map_batches(
        lambda b: {"tokens": np.repeat(np.asarray(b["id"])[:, None] + 200_000, 16, axis=1).astype(np.int32)},
        batch_format="numpy")
    zring.ray.write(more, out, column="tokens", mode="append")
    assert len(zring.RaggedDataset(out)) == 110_000


def test_a_column_refused_in_an_append_commits_no_column(tmp_path):
    out = str(tmp_path / "table")
    first = ray.data.range(200, override_num_blocks=2).map_batches(
        lambda b: {"a": np.asarray(b["id"]), "b": np.asarray(b["id"])}, batch_format="numpy")
    zring.ray.write(first, out, column=["a", "b"])
    other = ray.data.range(100, override_num_blocks=2).map_batches(
        lambda b: {"a": np.asarray(b["id"]), "b": np.asarray(b["id"]).astype(np.float32)}, batch_format="numpy")
    with pytest.raises(Exception, match="dtype or shape differs"):
        zring.ray.write(other, out, column=["a", "b"], mode="append")
    assert len(zring.Dataset(os.path.join(out, "a.zr"))) == 200, "column a as before"
    assert len(zring.Dataset(os.path.join(out, "b.zr"))) == 200, "column b as before"
    assert _staged(os.path.join(out, "a.zr")) == [] and _staged(os.path.join(out, "b.zr")) == []
