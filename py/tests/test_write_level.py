"""write_dataset / write_ragged ``level=``: the zstd level of the records,
the same format at every level."""

from __future__ import annotations

import numpy as np
import pytest
import zring


def records(n: int = 64, size: int = 8192) -> np.ndarray:
    """Compressible records: words of a small vocabulary, so zstd's levels
    find different matches and give different sizes."""
    rng = np.random.default_rng(3)
    words = [bytes(rng.integers(97, 123, size=rng.integers(3, 9), dtype=np.uint8)) + b" " for _ in range(400)]
    out = np.empty((n, size), dtype=np.uint8)
    for i in range(n):
        text = b"".join(words[k] for k in rng.zipf(1.3, size=size) % len(words))
        out[i] = np.frombuffer(text[:size], dtype=np.uint8)
    return out


def stored_bytes(path) -> int:
    with zring.Store(path) as st:
        return int(st.stats()["live_bytes"])


def test_every_level_reads_back_and_a_higher_level_stores_fewer_bytes(tmp_path):
    a = records()
    for level in (1, 19):
        zring.write_dataset(tmp_path / f"l{level}", a, level=level)
        with zring.Dataset(tmp_path / f"l{level}") as ds:
            np.testing.assert_array_equal(ds[:], a)
    zring.write_dataset(tmp_path / "default", a)
    zring.write_dataset(tmp_path / "l3", a, level=3)
    sizes = {k: stored_bytes(tmp_path / k) for k in ("l1", "l3", "default", "l19")}
    assert sizes["l19"] < sizes["l3"] < sizes["l1"], sizes
    assert sizes["default"] == sizes["l3"], "the default level is 3"


def test_write_ragged_takes_a_level(tmp_path):
    a = records(16)
    docs = [a[i, : 1000 + 400 * i] for i in range(16)]
    zring.write_ragged(tmp_path / "r1", docs, level=1)
    zring.write_ragged(tmp_path / "r19", docs, level=19)
    with zring.RaggedDataset(tmp_path / "r19") as ds:
        for i, d in enumerate(docs):
            np.testing.assert_array_equal(ds[i], d)
    assert stored_bytes(tmp_path / "r19") < stored_bytes(tmp_path / "r1")


@pytest.mark.parametrize("level, codec, says", [
    (23, "zstd", "an int from -131072 to 22"),
    (2.5, "zstd", "an int from -131072 to 22"),
    (True, "zstd", "an int from -131072 to 22"),
    (1, "raw", "codec \"zstd\" only"),
    (1, "zstd_dict", "codec \"zstd\" only"),
])
def test_a_bad_level_is_a_value_error_and_writes_nothing(tmp_path, level, codec, says):
    with pytest.raises(ValueError, match=says):
        zring.write_dataset(tmp_path / "x", records(4), codec=codec, level=level)
    with pytest.raises(ValueError, match=says):
        zring.write_ragged(tmp_path / "y", [records(1)[0]], codec=codec, level=level)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
