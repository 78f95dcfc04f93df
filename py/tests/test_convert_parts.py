"""``zring convert --workers N``: a folder of many input files (Parquet
shards, Megatron-LM partitions) becomes one part per file, written by worker
processes and committed in the files' order, read as one dataset."""

import os

import numpy as np
import pytest

import zring
from zring import cli, parts

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from test_token_import import write_megatron  # noqa: E402


def _shard(path, lo, hi):
    ids = np.arange(lo, hi)
    tokens = [np.full(int(i % 5), i, dtype=np.int32) for i in ids]  # empty documents too
    pq.write_table(pa.table({
        "id": pa.array(ids, type=pa.int64()),
        "tokens": pa.array(tokens, type=pa.list_(pa.int32())),
        "patch": pa.array([[int(i), -int(i)] for i in ids], type=pa.list_(pa.int16(), 2)),
    }), path, row_group_size=16)


def _shards(folder, n=6, per=40):
    folder.mkdir()
    for k in range(n):
        _shard(folder / f"train-{k:05d}-of-{n:05d}.parquet", k * per, (k + 1) * per)
    return n * per


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_shards_become_one_part_each_in_file_order(tmp_path, workers):
    total = _shards(tmp_path / "src")
    counts = zring.convert(tmp_path / "src", tmp_path / "out", workers=workers)
    assert counts == {"id": total, "tokens": total, "patch": total}
    for c in ("id", "tokens", "patch"):
        listed = parts.list_parts(tmp_path / "out" / f"{c}.zr")
        assert [p["records"] for p in listed] == [40] * 6, "one part per file, in the files' order"
        assert not os.listdir(tmp_path / "out" / f"{c}.zr" / "staging")
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".convert")]
    ids = zring.Dataset(str(tmp_path / "out" / "id.zr"))
    assert ids[np.arange(total)].reshape(-1).tolist() == list(range(total))
    docs = zring.RaggedDataset(str(tmp_path / "out" / "tokens.zr"))
    for i in (0, 1, 4, 39, 40, 123, total - 1):
        np.testing.assert_array_equal(docs[i], np.full(i % 5, i, np.int32))
    patch = zring.Dataset(str(tmp_path / "out" / "patch.zr"))
    np.testing.assert_array_equal(patch[np.array([0, 77, total - 1])],
                                  np.array([[0, 0], [77, -77], [total - 1, 1 - total]], np.int16))


def test_megatron_partitions_become_one_part_each(tmp_path):
    src = tmp_path / "partitions"
    src.mkdir()
    expect = []
    for k in range(3):
        docs = [[k * 100 + d] * (d + 1) for d in range(5 + k)]
        write_megatron(src / f"corpus_partition_{k}_text_document", [[d] for d in docs], np.uint16)
        expect += docs
    with pytest.raises(ValueError, match="holds 3 Megatron-LM datasets.*workers=N"):
        zring.convert(src, tmp_path / "one")
    assert zring.convert(src, tmp_path / "out", workers=2) == {"": len(expect)}
    docs = zring.RaggedDataset(str(tmp_path / "out"))
    assert [p["records"] for p in parts.list_parts(tmp_path / "out")] == [5, 6, 7]
    assert [docs[i].tolist() for i in range(len(docs))] == expect


def test_the_command_line_and_its_errors_speak_flags(tmp_path, capsys):
    total = _shards(tmp_path / "src", n=4)
    assert cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "2",
                     "--columns", "tokens"]) == 0
    assert f"{tmp_path / 'out' / 'tokens.zr'}: {total} records" in capsys.readouterr().out
    assert len(parts.list_parts(tmp_path / "out" / "tokens.zr")) == 4
    # An existing destination.
    assert cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and "overwrite=" not in err
    # A source that is one store's worth.
    np.save(tmp_path / "a.npy", np.arange(10))
    assert cli.main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "n"), "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "leave --workers out" in err and "workers=" not in err
    # A file of another schema is named.
    pq.write_table(pa.table({"id": pa.array([1.5]), "tokens": pa.array([[1]], type=pa.list_(pa.int32())),
                             "patch": pa.array([[1, 2]], type=pa.list_(pa.int16(), 2))}),
                   tmp_path / "src" / "train-00099-of-00004.parquet")
    assert cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "bad"), "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "train-00099-of-00004.parquet has another schema" in err
    assert not os.path.exists(tmp_path / "bad"), "nothing left at DST"
    with pytest.raises(SystemExit):
        cli.main(["convert", str(tmp_path / "src"), str(tmp_path / "x"), "--workers", "0"])
    assert "--workers takes a positive number" in capsys.readouterr().err
