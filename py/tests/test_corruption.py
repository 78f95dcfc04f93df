"""Damaged stores raise the typed errors, never crash the interpreter.

The store layout (head.zr, table-*.zr, chunk-*.zr) is the engine's; these
tests only flip bytes and check which Python exception class comes back.
"""

import struct

import numpy as np
import pytest

import zring


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    zring.write_dataset(path, np.arange(4000, dtype=np.int32).reshape(100, 40), codec="raw")
    # The damage below is to format-1 entries; a store written once is
    # sealed in format 2 (whose damage the tests of format 2 cover).
    with zring.Zrecord(path) as z:
        assert z.compact(format=1)["format_after"] == 1
    return path


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_flipped_record_byte_is_a_checksum_error(store):
    chunk = sorted(store.glob("chunk-*.zr"))[0]
    _flip(chunk, 160 * 7 + 3)  # inside record 7 (160 bytes per record)
    with zring.Dataset(store) as ds:
        np.testing.assert_array_equal(ds[6], np.arange(240, 280, dtype=np.int32))
        with pytest.raises(zring.ChecksumError, match="record 7"):
            ds[7]
        with pytest.raises(zring.CorruptError):
            ds.verify()


def test_not_a_store_and_bad_version(store):
    head = store / "head.zr"
    original = head.read_bytes()
    head.write_bytes(b"NOPE" + original[4:])
    with pytest.raises(zring.NotAStoreError):
        zring.Dataset(store)
    # A newer format version: the crc is recomputed by the engine's rules only,
    # so accept either the version error or a corrupt-head error, but typed.
    head.write_bytes(original[:4] + struct.pack("<I", 99) + original[8:])
    with pytest.raises((zring.UnsupportedVersionError, zring.CorruptError)):
        zring.Dataset(store)


def test_truncated_chunk_is_corrupt(store):
    chunk = sorted(store.glob("chunk-*.zr"))[0]
    with open(chunk, "r+b") as f:
        f.truncate(100)
    with pytest.raises((zring.CorruptError, OSError)):
        with zring.Dataset(store) as ds:
            ds[[0, 99]]
            ds.verify()


def test_format2_damage_names_the_table_or_the_chunk(tmp_path):
    """A flipped bit in a sealed table page is a CorruptError naming the
    table file; in a checksummed block, a ChecksumError naming the chunk."""
    path = tmp_path / "labels"
    labels = np.arange(50_000, dtype=np.int64)
    zring.write_dataset(path, labels, codec="raw")
    with zring.Zrecord(path) as z:
        assert z.compact(format=2)["format_after"] == 2
    table = sorted(path.glob("table-*.zr"))[0]
    _flip(table, 4096 + 100)  # inside the first page of block checksums
    with zring.Dataset(path) as ds:
        with pytest.raises(zring.CorruptError, match=f"{table.name}.*table page 0"):
            ds[10]
    _flip(table, 4096 + 100)
    chunk = sorted(path.glob("chunk-*.zr"))[0]
    _flip(chunk, 8 * 600 + 1)  # record 600, in the block of records 512..1023
    with zring.Dataset(path) as ds:
        assert ds[10] == 10
        with pytest.raises(zring.ChecksumError, match=f"record 700 in {chunk.name}"):
            ds[700]
        with pytest.raises(zring.ChecksumError, match=chunk.name):
            ds.verify()


# ---- a store without its head ----


def _files(path):
    """Every file under ``path`` and its bytes (the lock and pins files hold none)."""
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in ("lock", "pins")}


def _folder(tmp_path, n):
    src = tmp_path / "files"
    src.mkdir()
    for i in range(n):
        (src / f"f{i}.bin").write_bytes(bytes([i % 256]) * (100 + i))
    return src


def _layout(tmp_path, kind):
    """A store as the package writes it, and how to append more of the same."""
    p = tmp_path / kind
    fixed = np.arange(400 * 16, dtype=np.float32).reshape(400, 16)
    rows = [np.arange(i % 9 + 1, dtype=np.int64) for i in range(400)]
    if kind == "fixed":
        zring.write_dataset(p, fixed, codec="zstd")
        return p, lambda: zring.write_dataset(p, fixed[:3], codec="zstd", append=True)
    if kind == "dict":
        zring.write_dataset(p, fixed, codec="zstd_dict")
        return p, lambda: zring.write_dataset(p, fixed[:3], codec="zstd_dict", append=True)
    if kind == "format2":
        zring.write_dataset(p, fixed, codec="raw")
        with zring.Zrecord(p) as z:
            assert z.compact(format=2)["format_after"] == 2
        return p, lambda: zring.write_dataset(p, fixed[:3], codec="raw", append=True)
    if kind == "ragged":
        zring.write_ragged(p, rows)
        return p, lambda: zring.write_ragged(p, rows[:3], append=True)
    assert kind == "names"
    zring.convert(_folder(tmp_path, 400), p)
    assert (p / "names" / "head.zr").is_file()
    return p, lambda: zring.write_ragged(p, [np.zeros(3, np.uint8)], append=True)


@pytest.mark.parametrize("kind", ["fixed", "ragged", "names", "dict", "format2"])
def test_writer_open_without_head_changes_no_byte(tmp_path, kind):
    """Regression: Zrecord(p) and write_*(append=True) on a store whose
    head.zr was removed took the directory for empty and truncated chunk 0
    and the table (a 400-record store lost every record). Now each is a
    CorruptError naming the directory and the missing head, and every byte
    of every file is unchanged."""
    p, append = _layout(tmp_path, kind)
    (p / "head.zr").unlink()
    before = _files(p)
    assert any(str(f).startswith("chunk-") and b for f, b in before.items())
    for how, open_ in [("Zrecord", lambda: zring.Zrecord(p)), ("append=True", append),
                       ("Dataset", lambda: zring.Zrecord(p, readonly=True))]:
        with pytest.raises(zring.CorruptError) as exc:
            open_()
        msg = str(exc.value)
        assert str(p) in msg and "no head.zr but" in msg and "restore head.zr" in msg, (how, msg)
        assert _files(p) == before, f"{how} changed the files of a store without its head"


# ---- schema.json ----


def test_flipped_bit_in_schema_json_is_a_corrupt_error_naming_it(tmp_path):
    """Regression: schema.json had no checksum: flipping bit 0x02 of the '<'
    in "<f4" made it ">f4", and Dataset returned byte-swapped floats while
    verify() passed. Now every single flipped bit of the file is a
    CorruptError naming schema.json."""
    p = tmp_path / "s"
    data = np.linspace(0, 1, 40, dtype=np.float32).reshape(10, 4)
    zring.write_dataset(p, data, codec="raw")
    schema = p / "schema.json"
    original = schema.read_bytes()
    at = original.index(b'"<f4"') + 1
    schema.write_bytes(original[:at] + bytes([original[at] ^ 0x02]) + original[at + 1:])
    assert b'">f4"' in schema.read_bytes()
    with pytest.raises(zring.CorruptError, match=f"{schema}.*checksum"):
        zring.Dataset(p)
    for bit in range(len(original) * 8):
        b = bytearray(original)
        b[bit // 8] ^= 1 << (bit % 8)
        schema.write_bytes(bytes(b))
        with pytest.raises(zring.CorruptError, match="schema.json"):
            zring.Dataset(p).close()
    schema.write_bytes(original)
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[np.arange(10)], data)


@pytest.mark.parametrize("text", [
    "{not json", "[1, 2]", '{"format": "other"}',
    '{"format": "loaderx-zrecord", "version": 1, "shape": [4], "codec": "raw"}',
    '{"format": "loaderx-zrecord", "version": 1, "dtype": "<f4", "codec": "raw"}',
    '{"format": "loaderx-zrecord", "version": 1, "dtype": "<f4", "shape": "4", "codec": "raw"}',
    '{"format": "loaderx-zrecord", "version": 1, "dtype": 4, "shape": [4], "codec": "raw"}',
    '{"format": "loaderx-zrecord", "version": 1, "dtype": "<q9", "shape": [4], "codec": "raw"}',
    '{"format": "loaderx-zrecord", "version": 1, "dtype": "<f4", "shape": [4], "codec": "lz4"}',
])
def test_damaged_schema_fields_are_corrupt_errors_naming_the_file(tmp_path, text):
    """A schema.json written before the checksum (none to check) with bad
    JSON, a missing key or a field of the wrong type was a ValueError,
    KeyError or TypeError; it is a CorruptError naming the file."""
    p = tmp_path / "s"
    zring.write_dataset(p, np.zeros((3, 4), np.float32), codec="raw")
    (p / "schema.json").write_text(text)
    with pytest.raises(zring.CorruptError, match=str(p / "schema.json")):
        zring.Dataset(p)


def test_a_schema_written_before_the_checksum_still_reads(tmp_path):
    p = tmp_path / "s"
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    zring.write_dataset(p, data, codec="raw")
    old = '{\n  "format": "loaderx-zrecord",\n  "version": 1,\n  "dtype": "<f4",\n  "shape": [\n    4\n  ],\n' \
          '  "codec": "raw"\n}\n'
    (p / "schema.json").write_text(old)
    with zring.Dataset(p) as ds:
        np.testing.assert_array_equal(ds[np.arange(3)], data)


@pytest.mark.parametrize("ragged, fields, why", [
    (False, '"shape": [1099511627776]', "more than a record holds"),
    (False, '"shape": [1099511627776, 1099511627776, 1099511627776]', "more than a record holds"),
    (False, '"shape": [5]', "records are 16 bytes"),
    (True, '"item_shape": [1099511627776]', "more than a record holds"),
    (True, '"item_shape": [3]', "does not divide"),
])
def test_a_schema_without_its_checksum_is_checked_against_the_records(tmp_path, ragged, fields, why):
    """Issue 36: a schema.json without its checksum member (as zring 0.1.0
    and loaderx write them, still read) was trusted: ``shape [2**40]``
    opened, then tried to allocate 4 TiB (and a product past 2**63 wrapped).
    Every schema is checked against the store's records first: a
    CorruptError naming the file, before anything is sized."""
    p = tmp_path / "s"
    if ragged:
        zring.write_ragged(p, [np.zeros((4, 2), np.float32), np.zeros((2, 2), np.float32)], codec="raw")
        text = '{"format": "loaderx-zrecord", "version": 1, "ragged": true, "dtype": "<f4", %s, "codec": "raw"}'
    else:
        zring.write_dataset(p, np.zeros((3, 4), np.float32), codec="raw")
        text = '{"format": "loaderx-zrecord", "version": 1, "dtype": "<f4", %s, "codec": "raw"}'
    (p / "schema.json").write_text(text % fields)
    opener = zring.RaggedDataset if ragged else zring.Dataset
    with pytest.raises(zring.CorruptError, match=why) as e:
        opener(p)
    assert str(p / "schema.json") in str(e.value)


# ---- errors name the file ----


def test_damage_and_missing_files_name_the_file(store):
    """Damaged-head errors named no file (`corrupted store: head: checksum
    0x... != stored 0x...`), nor some table errors, and a missing chunk or
    table was a bare FileNotFoundError."""
    head = store / "head.zr"
    _flip(head, 20)
    with pytest.raises(zring.CorruptError, match=f"{head}: bytes 0..60 have checksum"):
        zring.Dataset(store)
    with pytest.raises(zring.CorruptError, match=str(head)):
        zring.Zrecord(store)
    _flip(head, 20)
    table = sorted(store.glob("table-*.zr"))[0]
    _flip(table, 64 + 32 * 5 + 3)  # entry of record 5
    with zring.Dataset(store) as ds:
        with pytest.raises(zring.CorruptError, match=f"{table}, table entry 5.*bytes 224..256"):
            ds[5]
    _flip(table, 64 + 32 * 5 + 3)
    chunk = sorted(store.glob("chunk-*.zr"))[0]
    for missing in (chunk, table):
        kept = missing.read_bytes()
        missing.unlink()
        for open_ in (zring.Dataset, zring.Zrecord):
            with pytest.raises(zring.CorruptError, match=f"{missing}: missing"):
                open_(store)
        missing.write_bytes(kept)
    with zring.Dataset(store) as ds:
        assert ds.verify()["records"] == 100
