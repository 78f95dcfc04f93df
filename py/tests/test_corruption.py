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
