"""zring.convert / ``zring convert``: Parquet columns, folders of files and
WebDataset tar shards round-trip into stores, with names and keys kept."""

import io
import tarfile

import numpy as np
import pytest

import zring
from zring import cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _table(n, start=0):
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n)
    tokens = [rng.integers(0, 50_000, size=int(i % 7), dtype=np.int32) for i in ids]  # includes empty lists
    return pa.table({
        "label": pa.array(ids % 10, type=pa.int64()),
        "score": pa.array(ids * 0.5, type=pa.float32()),
        "flag": pa.array(ids % 3 == 0, type=pa.bool_()),
        "tokens": pa.array(tokens, type=pa.list_(pa.int32())),
        "patch": pa.array([np.full(6, i, np.int16).tolist() for i in ids], type=pa.list_(pa.int16(), 6)),
        "grid": pa.array([[[int(i) % 256, 1], [2, 3], [4, 5]] for i in ids], type=pa.list_(pa.list_(pa.uint8(), 2), 3)),
        "text": pa.array(["" if i % 4 == 0 else f"sample {i} ü" for i in ids], type=pa.string()),
        "blob": pa.array([bytes([i % 256]) * int(i % 5) for i in ids], type=pa.large_binary()),
    }), tokens


def test_every_parquet_column_kind_round_trips_over_row_groups(tmp_path):
    table, tokens = _table(1000)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=128)  # 8 row groups
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 8
    counts = zring.convert(tmp_path / "t.parquet", tmp_path / "out")
    assert counts == {c: 1000 for c in table.column_names}
    out = tmp_path / "out"
    with zring.Dataset(out / "label.zr") as d:
        np.testing.assert_array_equal(d[:], np.arange(1000) % 10)
        assert d.dtype == np.int64
    with zring.Dataset(out / "score.zr") as d:
        np.testing.assert_array_equal(d[:], (np.arange(1000) * 0.5).astype(np.float32))
    with zring.Dataset(out / "flag.zr") as d:
        np.testing.assert_array_equal(d[:], np.arange(1000) % 3 == 0)
    with zring.RaggedDataset(out / "tokens.zr") as d:
        for i in (0, 1, 6, 7, 500, 999):
            np.testing.assert_array_equal(d[i], tokens[i])
        assert d[0].size == 0 and d[7].size == 0, "empty lists stay empty"
        assert d.dtype == np.int32
    with zring.Dataset(out / "patch.zr") as d:
        assert d.shape == (6,)
        np.testing.assert_array_equal(d[[3, 999]], np.array([[3] * 6, [999] * 6], np.int16))
    with zring.Dataset(out / "grid.zr") as d:
        assert d.shape == (3, 2)
        np.testing.assert_array_equal(d[42], np.array([[42, 1], [2, 3], [4, 5]], np.uint8))
    with zring.RaggedDataset(out / "text.zr") as d:
        assert bytes(d[0]) == b"" and bytes(d[5]).decode() == "sample 5 ü"
    with zring.RaggedDataset(out / "blob.zr") as d:
        assert bytes(d[9]) == bytes([9]) * 4 and bytes(d[10]) == b""


def test_a_directory_of_files_and_chosen_columns(tmp_path):
    (tmp_path / "src").mkdir()
    pq.write_table(_table(100, 0)[0], tmp_path / "src" / "part-0.parquet")
    pq.write_table(_table(50, 100)[0], tmp_path / "src" / "part-1.parquet")
    counts = zring.convert(tmp_path / "src", tmp_path / "out", columns=["label", "text"])
    assert counts == {"label": 150, "text": 150}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["label.zr", "text.zr"]
    with zring.Dataset(tmp_path / "out" / "label.zr") as d:
        np.testing.assert_array_equal(d[:], np.arange(150) % 10)


def test_nulls_are_an_error_naming_the_column_unless_filled(tmp_path):
    t = pa.table({"ok": pa.array([1, 2, 3]), "gappy": pa.array([1.0, None, 3.0]),
                  "lists": pa.array([[1], None, [2, None]], type=pa.list_(pa.int64()))})
    pq.write_table(t, tmp_path / "n.parquet")
    with pytest.raises(ValueError, match="column 'gappy' holds nulls"):
        zring.convert(tmp_path / "n.parquet", tmp_path / "out")
    assert not (tmp_path / "out").exists(), "a failed conversion leaves nothing"
    zring.convert(tmp_path / "n.parquet", tmp_path / "out", fill=-1)
    with zring.Dataset(tmp_path / "out" / "gappy.zr") as d:
        np.testing.assert_array_equal(d[:], [1.0, -1.0, 3.0])
    with zring.RaggedDataset(tmp_path / "out" / "lists.zr") as d:
        assert [d[i].tolist() for i in range(3)] == [[1], [], [2, -1]]


def test_unmappable_columns_are_named(tmp_path):
    t = pa.table({"x": pa.array([1, 2]), "meta": pa.array([{"a": 1}, {"a": 2}])})
    pq.write_table(t, tmp_path / "s.parquet")
    with pytest.raises(ValueError, match="column 'meta' of type struct"):
        zring.convert(tmp_path / "s.parquet", tmp_path / "out")
    assert zring.convert(tmp_path / "s.parquet", tmp_path / "out", columns=["x"]) == {"x": 2}


def test_a_folder_of_files_keeps_paths_in_sorted_order(tmp_path):
    src = tmp_path / "imgs"
    files = {"b/2.jpg": b"\xff\xd8two", "a.png": b"\x89PNGone", "b/1.jpg": b"", "c/readme.txt": b"skip me"}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    assert zring.convert(src, tmp_path / "all") == {"": 4}
    with zring.RaggedDataset(tmp_path / "all") as d:
        assert d.names == ["a.png", "b/1.jpg", "b/2.jpg", "c/readme.txt"]
        assert [bytes(d[i]) for i in range(4)] == [files[n] for n in d.names]
    assert zring.convert(src, tmp_path / "pics", extensions=["jpg", ".PNG"]) == {"": 3}
    with zring.RaggedDataset(tmp_path / "pics") as d:
        assert d.names == ["a.png", "b/1.jpg", "b/2.jpg"]
        assert bytes(d[2]) == b"\xff\xd8two"


def _shard(path, samples):
    with tarfile.open(path, "w") as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_two_webdataset_shards_round_trip_with_keys(tmp_path):
    (tmp_path / "shards").mkdir()
    a = [(f"train/s{i:03d}", {"jpg": bytes([i]) * (i + 1), "cls": str(i % 3).encode(), "meta.json": b"{}"})
         for i in range(5)]
    b = [(f"train/s{i:03d}", {"jpg": bytes([i]) * 2, "cls": b"", "meta.json": b"[1]"}) for i in range(5, 8)]
    _shard(tmp_path / "shards" / "shard-000.tar", a)
    _shard(tmp_path / "shards" / "shard-001.tar", b)
    counts = zring.convert(tmp_path / "shards", tmp_path / "wds")
    assert counts == {"cls": 8, "jpg": 8, "meta.json": 8}
    keys = [k for k, _ in a + b]
    for ext in ("jpg", "cls", "meta.json"):
        with zring.RaggedDataset(tmp_path / "wds" / f"{ext}.zr") as d:
            assert d.names == keys
            assert [bytes(d[i]) for i in range(8)] == [m[ext] for _, m in a + b]


def test_a_sample_missing_an_extension_is_an_error(tmp_path):
    _shard(tmp_path / "x.tar", [("k1", {"jpg": b"1", "cls": b"0"}), ("k2", {"jpg": b"2"})])
    with pytest.raises(ValueError, match="sample 'k2' has members"):
        zring.convert(tmp_path / "x.tar", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line(tmp_path, capsys):
    pq.write_table(_table(20)[0], tmp_path / "t.parquet")
    assert cli.main(["convert", str(tmp_path / "t.parquet"), str(tmp_path / "o"), "--columns", "label,tokens"]) == 0
    assert "label.zr: 20 records" in capsys.readouterr().out
    assert cli.main(["convert", str(tmp_path / "t.parquet"), str(tmp_path / "o")]) == 1
    assert "overwrite" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "t.parquet"), str(tmp_path / "o"), "--overwrite"]) == 0
    assert len(list((tmp_path / "o").iterdir())) == 8


def test_a_fill_the_column_cannot_hold_is_an_error_naming_it(tmp_path):
    # 1.5 in an int64 column was written as 1, silently.
    t = pa.table({"n": pa.array([1, None, 3], type=pa.int64()), "b": pa.array([1, None], type=pa.uint8()).take([0, 1, 1]),
                  "f": pa.array([1.0, None, 2.0], type=pa.float32())})
    pq.write_table(t, tmp_path / "n.parquet")
    for fill, col, typ in [(1.5, "n", "int64"), (-1, "b", "uint8"), (300, "b", "uint8")]:
        cols = [col]
        with pytest.raises(ValueError, match=f"fill value {fill!r} does not fit column '{col}' of type {typ}"):
            zring.convert(tmp_path / "n.parquet", tmp_path / "out", fill=fill, columns=cols)
        assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="does not fit column 'f' of type float"):
        zring.convert(tmp_path / "n.parquet", tmp_path / "out", fill=1e300, columns=["f"])
    zring.convert(tmp_path / "n.parquet", tmp_path / "out", fill=7.0, columns=["n", "f"])
    with zring.Dataset(tmp_path / "out" / "n.zr") as d:
        np.testing.assert_array_equal(d[:], [1, 7, 3])


def test_a_truncated_shard_is_named_without_a_traceback(tmp_path, capsys):
    (tmp_path / "shards").mkdir()
    _shard(tmp_path / "shards" / "shard-000.tar", [(f"s{i}", {"jpg": bytes([i]) * 3000}) for i in range(4)])
    _shard(tmp_path / "shards" / "shard-001.tar", [(f"t{i}", {"jpg": bytes([i]) * 3000}) for i in range(4)])
    cut = tmp_path / "shards" / "shard-001.tar"
    cut.write_bytes(cut.read_bytes()[:5000])  # cut mid-member
    with pytest.raises(ValueError, match="shard-001.tar: not a complete tar shard"):
        zring.convert(tmp_path / "shards", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert cli.main(["convert", str(tmp_path / "shards"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "shard-001.tar: not a complete tar shard" in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_command_line_errors_name_flags_not_keyword_arguments(tmp_path, capsys):
    t = pa.table({"gappy": pa.array([1.0, None]), "meta": pa.array([{"a": 1}, {"a": 2}])})
    pq.write_table(t, tmp_path / "n.parquet")
    assert cli.main(["convert", str(tmp_path / "n.parquet"), str(tmp_path / "o"), "--columns", "gappy"]) == 1
    err = capsys.readouterr().err
    assert "--fill" in err and "fill=" not in err
    assert cli.main(["convert", str(tmp_path / "n.parquet"), str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "--columns" in err and "columns=" not in err
    assert cli.main(["convert", str(tmp_path / "n.parquet"), str(tmp_path / "o"), "--columns", "gappy", "--fill", "0"]) == 0
    capsys.readouterr()
    assert cli.main(["convert", str(tmp_path / "n.parquet"), str(tmp_path / "o"), "--columns", "gappy", "--fill", "0"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and "=True" not in err and "append" not in err
    with pytest.raises(SystemExit):
        cli.main(["convert", "--help"])
    out = capsys.readouterr().out
    assert "Parquet" in out or "parquet" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "WebDataset tar shards" in " ".join(capsys.readouterr().out.split())


def test_names_are_a_store_read_on_demand_and_follow_deletes(tmp_path):
    # names were one JSON list of every name (O(records) in memory) and a
    # delete silently misaligned them.
    (tmp_path / "shards").mkdir()
    samples = [(f"k{i:04d}", {"bin": bytes([i % 256]) * (i % 7 + 1)}) for i in range(300)]
    _shard(tmp_path / "shards" / "a.tar", samples)
    zring.convert(tmp_path / "shards", tmp_path / "w")
    store = tmp_path / "w" / "bin.zr"
    assert (store / "names" / "head.zr").is_file() and not (store / "names.json").exists()
    with zring.RaggedDataset(store) as d:
        names = d.names
        assert not isinstance(names, list) and len(names) == 300
        assert names[0] == "k0000" and names[-1] == "k0299" and names[10:13] == ["k0010", "k0011", "k0012"]
        assert list(names) == [k for k, _ in samples]
        with pytest.raises(IndexError):
            names[300]
    z = zring.Zrecord(store)
    z.delete(np.array([0, 5, 299], dtype=np.uint64))
    z.compact()
    z.close()
    with zring.RaggedDataset(store) as d:
        assert len(d.names) == len(d) == 297
        # Every record still carries its own name: the tail moved into the holes.
        by_name = dict(samples)
        for i in range(len(d)):
            assert bytes(d[i]) == by_name[d.names[i]]["bin"], i


def test_timestamps_dictionaries_and_image_structs_convert(tmp_path):
    import json
    import datetime as dt

    ts = [dt.datetime(2024, 1, 1, 0, 0, 0, 5), None, dt.datetime(1969, 12, 31, 23, 59, 59)]
    t = pa.table({
        "when": pa.array(ts, type=pa.timestamp("us")),
        "day": pa.array([dt.date(1970, 1, 2), dt.date(2000, 1, 1), dt.date(1970, 1, 1)], type=pa.date32()),
        "cat": pa.array(["cat", "dog", "cat"]).dictionary_encode(),
        "label": pa.array([3, 1, 3], type=pa.int64()).dictionary_encode(),
        "image": pa.array([{"bytes": b"\x89PNG1", "path": "a/1.png"}, {"bytes": b"\xff\xd8jpg2", "path": "b/2.jpg"},
                           {"bytes": b"", "path": None}],
                          type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    })
    pq.write_table(t, tmp_path / "t.parquet")
    zring.convert(tmp_path / "t.parquet", tmp_path / "o", fill=-1)
    with zring.Dataset(tmp_path / "o" / "when.zr") as d:
        want = [1704067200000005, -1, -1000000]
        np.testing.assert_array_equal(d[:], want)
    schema = json.loads((tmp_path / "o" / "when.zr" / "schema.json").read_text())
    assert (schema["unit"], schema["arrow_type"]) == ("us", "timestamp[us]")
    with zring.Dataset(tmp_path / "o" / "day.zr") as d:
        np.testing.assert_array_equal(d[:], [1, 10957, 0])
    with zring.RaggedDataset(tmp_path / "o" / "cat.zr") as d:
        assert [bytes(d[i]).decode() for i in range(3)] == ["cat", "dog", "cat"]
    with zring.Dataset(tmp_path / "o" / "label.zr") as d:
        np.testing.assert_array_equal(d[:], [3, 1, 3])
    with zring.RaggedDataset(tmp_path / "o" / "image.zr") as d:
        assert [bytes(d[i]) for i in range(3)] == [b"\x89PNG1", b"\xff\xd8jpg2", b""]
        assert list(d.names) == ["a/1.png", "b/2.jpg", ""]


def test_every_unmappable_column_is_named_in_one_message(tmp_path):
    t = pa.table({"ok": pa.array([1, 2]), "meta": pa.array([{"a": 1}, {"a": 2}]),
                  "tags": pa.array([["x"], ["y", "z"]]), "m": pa.array([{"k": 1.0}, {"k": 2.0}],
                                                                       type=pa.map_(pa.string(), pa.float64()))})
    pq.write_table(t, tmp_path / "s.parquet")
    with pytest.raises(ValueError) as e:
        zring.convert(tmp_path / "s.parquet", tmp_path / "out")
    msg = str(e.value)
    assert "'meta'" in msg and "'tags'" in msg and "'m'" in msg and "'ok'" not in msg, msg
    assert not (tmp_path / "out").exists()


def _named_store(tmp_path, n=6):
    src = tmp_path / "files"
    src.mkdir()
    for i in range(n):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * (i + 1))
    zring.convert(src, tmp_path / "s")
    return tmp_path / "s"


def _aligned(store):
    with zring.RaggedDataset(store) as d:
        names = list(d.names)
        assert len(names) == len(d)
        for i, name in enumerate(names):
            assert bytes(d[i]) == (store.parent / "files" / name).read_bytes(), (i, name)
        return names


def test_delete_with_names_held_by_another_handle_keeps_them_aligned(tmp_path):
    """Regression: Zrecord.delete committed the records, then the names as a
    second commit: with names/ held by another writer, delete([1]) raised
    LockedError after the records were committed, leaving 6 names for 5
    records (names[1] still f1.bin over file 5's bytes). Now the names'
    lock is taken first: the delete fails whole, and succeeds whole once
    the other handle is gone."""
    store = _named_store(tmp_path)
    z = zring.Zrecord(store)
    other = zring.Zrecord(store / "names")
    with pytest.raises(zring.LockedError):
        z.delete([1])
    assert len(z) == len(other) == 6
    with pytest.raises(zring.LockedError):
        z.compact()
    other.close()
    assert _aligned(store) == [f"f{i}.bin" for i in range(6)]
    z.delete([1])
    assert len(z) == 5
    z.close()
    assert _aligned(store) == ["f0.bin", "f5.bin", "f2.bin", "f3.bin", "f4.bin"]
    assert not (store / "names.intent").exists()


def test_a_delete_interrupted_between_records_and_names_is_finished_on_open(tmp_path):
    """A crash after the records' commit and before the names': the intent
    written before the records' commit is replayed by the next writable
    open. Until then a reader (which may not write the store) reads the
    names as the finished delete leaves them, writing nothing; a count
    mismatch no intent explains is a CorruptError naming both counts."""
    import json

    store = _named_store(tmp_path)
    with zring.Zrecord(store) as z:
        # What the crashed delete had made durable: its intent, then the
        # records, not the names.
        (store / "names.intent").write_text(json.dumps(
            {"op": "delete", "records_before": 6, "records_after": 4, "indices": [4, 0]}))
        z._s.delete(np.array([4, 0], dtype=np.uint64))
    finished = ["f5.bin", "f1.bin", "f2.bin", "f3.bin"]
    assert _aligned(store) == finished
    with zring.RaggedDataset(store) as d:
        assert d.names[0] == "f5.bin" and d.names[-1] == "f3.bin" and d.names[1:3] == ["f1.bin", "f2.bin"]
    zring.Zrecord(store, readonly=True).close()
    assert (store / "names.intent").exists(), "a reader writes nothing"
    with zring.Zrecord(store / "names", readonly=True) as names:
        assert len(names) == 6
    # An intent that does not explain the counts is no excuse.
    (store / "names.intent").write_text(json.dumps(
        {"op": "delete", "records_before": 7, "records_after": 4, "indices": [4, 0, 1]}))
    with zring.RaggedDataset(store) as d:
        with pytest.raises(zring.CorruptError, match="6 names for 4 records.*interrupted"):
            d.names
    with pytest.raises(zring.CorruptError, match="6 names for 4 records"):
        zring.Zrecord(store, readonly=True)
    (store / "names.intent").write_text(json.dumps(
        {"op": "delete", "records_before": 6, "records_after": 4, "indices": [4, 0]}))
    zring.Zrecord(store).close()  # finishes the delete
    assert not (store / "names.intent").exists()
    assert _aligned(store) == finished
    # A mismatch without an intent (names damaged or written apart).
    with zring.Zrecord(store / "names") as names:
        names.delete([0])
    with pytest.raises(zring.CorruptError, match=f"{store / 'names'}: 3 names for 4 records"):
        zring.Zrecord(store)


def test_appending_to_a_named_store_without_names_is_refused(tmp_path):
    store = _named_store(tmp_path)
    with zring.Zrecord(store) as z:
        with pytest.raises(ValueError, match="misalign"):
            z.append_var(np.zeros(3, np.uint8), [0], [3])
        assert len(z) == 6

def _hf_save_to_disk(folder, tables):
    """A folder laid out as HuggingFace's ``Dataset.save_to_disk`` writes it,
    made with pyarrow alone: one Arrow IPC *stream* file per shard, written a
    record batch of (at most) 1,000 rows at a time as HuggingFace does, plus
    ``dataset_info.json`` and ``state.json`` listing the shards in order."""
    import json

    folder.mkdir(parents=True)
    names = [f"data-{i:05d}-of-{len(tables):05d}.arrow" for i in range(len(tables))]
    for name, table in zip(names, tables):
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=1000):
                w.write_batch(batch)
    (folder / "dataset_info.json").write_text(json.dumps(
        {"citation": "", "description": "", "features": {}, "homepage": "", "license": ""}))
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0123456789abcdef",
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": "train"}))


def _hf_table(start, n):
    ids = np.arange(start, start + n)
    return pa.table({
        "text": pa.array([f"row {i}" for i in ids], type=pa.string()),
        "label": pa.array(ids % 5, type=pa.int64()),
        "input_ids": pa.array([list(range(int(i % 4))) for i in ids], type=pa.list_(pa.int32())),
        "image": pa.array([{"bytes": bytes([i % 256]) * 3, "path": f"img/{i}.png"} for i in ids],
                          type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    })


def test_a_huggingface_save_to_disk_folder_converts_column_by_column(tmp_path):
    # Such a folder was taken for a folder of files: `zring convert` stored the
    # .arrow file and the two .json files as 3 byte records and reported
    # success. Its Arrow IPC stream files are read column by column, as
    # Parquet is, shards in the order state.json lists them.
    src = tmp_path / "hf"
    _hf_save_to_disk(src, [_hf_table(0, 2500), _hf_table(2500, 700)])
    counts = zring.convert(src, tmp_path / "out", block_bytes=4096)
    assert counts == {"text": 3200, "label": 3200, "input_ids": 3200, "image": 3200}
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["image.zr", "input_ids.zr", "label.zr", "text.zr"]
    with zring.Dataset(out / "label.zr") as d:
        np.testing.assert_array_equal(d[:], np.arange(3200) % 5)
    with zring.RaggedDataset(out / "text.zr") as d:
        assert [bytes(d[i]).decode() for i in (0, 2499, 2500, 3199)] == ["row 0", "row 2499", "row 2500", "row 3199"]
    with zring.RaggedDataset(out / "input_ids.zr") as d:
        assert d.dtype == np.int32
        np.testing.assert_array_equal(d[3199], [0, 1, 2])
        assert d[2500].size == 0
    with zring.RaggedDataset(out / "image.zr") as d:
        assert bytes(d[2501]) == bytes([2501 % 256]) * 3 and d.names[2501] == "img/2501.png"
    # The command line says what it made; a chosen column only.
    assert cli.main(["convert", str(src), str(tmp_path / "cli"), "--columns", "label"]) == 0
    with zring.Dataset(tmp_path / "cli" / "label.zr") as d:
        assert len(d) == 3200


def test_arrow_files_in_the_file_format_and_damage_named(tmp_path):
    t = _hf_table(0, 30)
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    assert zring.convert(tmp_path / "t.arrow", tmp_path / "o", columns=["label"]) == {"label": 30}
    src = tmp_path / "hf"
    _hf_save_to_disk(src, [_hf_table(0, 3000)])
    data = src / "data-00000-of-00001.arrow"
    data.write_bytes(data.read_bytes()[:40_000])  # a copy cut short
    with pytest.raises(ValueError, match="data-00000-of-00001.arrow: not a complete Arrow IPC file"):
        zring.convert(src, tmp_path / "cut")
    assert not (tmp_path / "cut").exists()
    (src / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="junk.arrow is not an Arrow IPC stream or file"):
        zring.convert(src / "junk.arrow", tmp_path / "junk")


def test_a_dataset_dict_or_a_folder_of_save_to_disk_folders_is_refused_by_name(tmp_path, capsys):
    import json

    dd = tmp_path / "dd"
    _hf_save_to_disk(dd / "train", [_hf_table(0, 10)])
    _hf_save_to_disk(dd / "test", [_hf_table(10, 5)])
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ValueError, match=r"HuggingFace DatasetDict .*\['test', 'train'\].*convert one split"):
        zring.convert(dd, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert zring.convert(dd / "train", tmp_path / "train")["label"] == 10
    # A folder that holds one somewhere is not stored as opaque files either...
    (tmp_path / "work").mkdir()
    _hf_save_to_disk(tmp_path / "work" / "corpus", [_hf_table(0, 10)])
    (tmp_path / "work" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"holds HuggingFace save_to_disk folders \(.*corpus\)"):
        zring.convert(tmp_path / "work", tmp_path / "out")
    assert cli.main(["convert", str(tmp_path / "work"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "--kind folder" in err and "kind=" not in err
    # ...unless asked for.
    assert zring.convert(tmp_path / "work", tmp_path / "out", kind="folder") == {"": 4}


def test_an_existing_destination_names_only_converts_own_arguments(tmp_path):
    # convert's FileExistsError suggested append=True, which convert does not take.
    np.save(tmp_path / "a.npy", np.arange(6))
    pq.write_table(_table(5)[0], tmp_path / "t.parquet")
    for src in ("a.npy", "t.parquet"):
        zring.convert(tmp_path / src, tmp_path / f"{src}.out")
        with pytest.raises(FileExistsError) as e:
            zring.convert(tmp_path / src, tmp_path / f"{src}.out")
        assert "overwrite=True" in str(e.value) and "append" not in str(e.value), e.value
        assert zring.convert(tmp_path / src, tmp_path / f"{src}.out", overwrite=True)
