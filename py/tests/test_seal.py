"""A store written once has a format-2 table when the writer returns.

``write_dataset`` of int64 labels used to leave a 32-byte table entry per
8-byte label (5x the data on disk) and ragged records 32 bytes of table each
until ``zring compact --format 2``. ``write_dataset``, ``write_ragged`` and
``zring convert`` now seal the table at the end, rewriting the table alone;
appends (``append=True``) and deletes afterwards keep their behaviour
(format-1 entries after the sealed section; a delete writes format 1) and
every record reads back exact.
"""

import numpy as np
import pytest

import zring


def _table(path):
    with zring.Zrecord(path, readonly=True) as z:
        s = z.stats()
    return s["table_format"], s["table_bytes"]


def _chunk_bytes(path):
    return sum(p.stat().st_size for p in path.glob("chunk-*.zr"))


def test_write_dataset_seals_labels_and_appends_and_deletes_still_work(tmp_path):
    labels = np.arange(50_000, dtype=np.int64) * 7 - 3
    p = tmp_path / "labels"
    zring.write_dataset(p, labels)  # zstd by default: 8-byte labels stay raw
    # A header page and one page of block checksums (98 blocks of 512).
    assert _table(p) == (2, 2 * 4096)
    assert _chunk_bytes(p) == labels.nbytes
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[:], labels)
    more = np.arange(1000, dtype=np.int64) + 10**12
    zring.write_dataset(p, more, append=True)
    assert _table(p) == (2, 2 * 4096 + 32 * 1000), "appended records get format-1 entries"
    want = np.concatenate([labels, more])
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[:], want)
    with zring.Zrecord(p) as z:
        z.delete(np.array([0, 49_999, 50_500], dtype=np.uint64))
        z.verify()
    for i in (50_500, 49_999, 0):  # swap-last, descending
        want[i] = want[-1]
        want = want[:-1]
    assert _table(p)[0] == 1, "a delete rewrites the table in format 1"
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[:], want)


def test_write_ragged_seals_12_bytes_a_record(tmp_path):
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 50_000, size=int(n), dtype=np.int32) for n in rng.integers(0, 300, size=5000)]
    p = tmp_path / "tokens"
    zring.write_ragged(p, rows, chunk_bytes=1 << 16)  # many appends
    assert _table(p) == (2, 4096 * (1 + -(-5000 // 340)))
    with zring.RaggedDataset(p) as ds:
        for i in (0, 1, 339, 340, 4999):
            np.testing.assert_array_equal(ds[i], rows[i])
    zring.write_ragged(p, rows[:7], append=True)
    assert _table(p)[0] == 2
    with zring.Zrecord(p) as z:
        z.delete(np.array([2], dtype=np.uint64))
    want = rows + rows[:7]
    want[2] = want.pop()
    assert _table(p)[0] == 1
    with zring.RaggedDataset(p) as ds:
        assert len(ds) == len(want)
        for i in range(len(want)):
            np.testing.assert_array_equal(ds[i], want[i])


def test_appending_to_a_new_path_keeps_format_1(tmp_path):
    """append=True writes into the path as loaderx does: no seal, so a later
    append to it costs what it always did."""
    p = tmp_path / "a"
    zring.write_dataset(p, np.arange(100, dtype=np.int64), append=True)
    assert _table(p) == (1, 64 + 32 * 100)


def test_a_copied_store_is_sealed_on_overwrite_too(tmp_path):
    p = tmp_path / "l"
    zring.write_dataset(p, np.arange(10, dtype=np.int64), append=True)
    zring.write_dataset(p, np.arange(3000, dtype=np.int16), overwrite=True)
    assert _table(p) == (2, 2 * 4096)
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[:], np.arange(3000, dtype=np.int16))


def test_convert_seals_every_store_it_writes(tmp_path):
    src = tmp_path / "files"
    for i in range(700):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * (i % 97))
    assert zring.convert(src, tmp_path / "folder") == {"": 700}
    assert _table(tmp_path / "folder") == (2, 4096 * (1 + 3))
    assert _table(tmp_path / "folder" / "names")[0] == 2, "the names store is written once too"
    with zring.RaggedDataset(tmp_path / "folder") as ds:
        names = list(ds.names)
        assert names == sorted(names)
        for i in (0, 339, 340, 699):
            assert bytes(ds[i]) == (src / names[i]).read_bytes()
    with zring.Zrecord(tmp_path / "folder") as z:  # the names follow the delete
        z.delete(np.array([5, 400], dtype=np.uint64))
    assert _table(tmp_path / "folder")[0] == 1
    with zring.RaggedDataset(tmp_path / "folder") as ds:
        assert len(ds) == 698 and len(ds.names) == 698
        for i in range(698):
            assert bytes(ds[i]) == (src / ds.names[i]).read_bytes()
    np.save(tmp_path / "x.npy", np.arange(20_000, dtype=np.float32))
    assert zring.convert(tmp_path / "x.npy", tmp_path / "npy") == {"": 20_000}
    assert _table(tmp_path / "npy") == (2, 2 * 4096)


def test_convert_seals_parquet_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 3000
    ids = np.arange(n)
    tokens = [np.full(int(i % 9), i, np.int32) for i in ids]
    pq.write_table(pa.table({
        "label": pa.array(ids % 10, type=pa.int64()),
        "tokens": pa.array([t.tolist() for t in tokens], type=pa.list_(pa.int32())),
    }), tmp_path / "t.parquet", row_group_size=700)
    zring.convert(tmp_path / "t.parquet", tmp_path / "pq")
    assert _table(tmp_path / "pq" / "label.zr") == (2, 2 * 4096)
    assert _table(tmp_path / "pq" / "tokens.zr") == (2, 4096 * (1 + -(-n // 340)))
    with zring.RaggedDataset(tmp_path / "pq" / "tokens.zr") as ds:
        for i in (0, 8, 1234, n - 1):
            np.testing.assert_array_equal(ds[i], tokens[i])
    with zring.Dataset(tmp_path / "pq" / "label.zr") as ds:
        np.testing.assert_array_equal(ds[:], ids % 10)
