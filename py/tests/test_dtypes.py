"""Every fixed-size dtype and sample shape round-trips through a dataset."""

import json
import re

import numpy as np
import pytest

import zring

DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
    ">i4", ">f8", "S5", "<U3", "datetime64[s]", "timedelta64[ms]",
    [("x", "<i2"), ("y", "<f4", (2,))],
]


def _sample(dtype, shape, n=10):
    dt = np.dtype(dtype)
    raw = np.random.default_rng(0).integers(0, 256, size=(n, *shape, dt.itemsize), dtype=np.uint8)
    arr = raw.view(dt).reshape(n, *shape)
    if dt.kind == "b":
        arr = raw[..., 0].reshape(n, *shape) % 2 == 1
    if dt.kind == "f" or dt.kind == "c":
        arr = np.arange(n * int(np.prod(shape, dtype=np.int64)), dtype=dt).reshape(n, *shape) / 3
        arr = arr.astype(dt)
    return arr


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 2)], ids=str)
def test_roundtrip(tmp_path, dtype, shape):
    arr = _sample(dtype, shape)
    zring.write_dataset(tmp_path / "d", arr)
    with zring.Dataset(tmp_path / "d") as ds:
        assert ds.dtype == arr.dtype
        assert ds.shape == shape
        out = ds[:]
        assert out.dtype == arr.dtype
        assert out.tobytes() == arr.tobytes()
        assert ds[[3, 1]].tobytes() == arr[[3, 1]].tobytes()


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4"])
def test_ml_dtypes_roundtrip(tmp_path, name):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    dt = np.dtype(getattr(ml_dtypes, name))
    arr = np.arange(24).reshape(4, 6).astype(dt)
    zring.write_dataset(tmp_path / "m", arr)
    with zring.Dataset(tmp_path / "m") as ds:
        assert ds.dtype == dt
        out = ds[:]
        assert out.dtype == dt
        assert out.tobytes() == arr.tobytes()
    with zring.Store(tmp_path / "m") as st:
        schema = json.loads(st.schema())
    assert schema["dtype_name"] == name
    assert schema["dtype"] == dt.str


def test_ml_dtypes_ragged_and_loader(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    bf = np.dtype(ml_dtypes.bfloat16)
    rows = [np.full((k, 2), k, dtype=bf) for k in (1, 3, 2)]
    zring.write_ragged(tmp_path / "r", rows)
    zring.write_dataset(tmp_path / "f", np.arange(3).astype(bf))
    with zring.RaggedDataset(tmp_path / "r") as rds, zring.Dataset(tmp_path / "f") as fds:
        values, splits = rds[[2, 0]]
        assert values.dtype == bf
        np.testing.assert_array_equal(splits, [0, 2, 3])
        with zring.DataLoader({"r": rds, "f": fds}, batch_size=3, mode=0, num_workers=1) as dl:
            batch = next(dl)
        v, s = batch["r"]
        assert v.dtype == bf and batch["f"].dtype == bf
        np.testing.assert_array_equal(s, [0, 1, 4, 6])
        np.testing.assert_array_equal(v.astype(np.float32)[:, 0], [1, 3, 3, 3, 2, 2])


def test_empty_dataset_and_zero_rows(tmp_path):
    zring.write_dataset(tmp_path / "e", np.zeros((0, 4), dtype=np.float32))
    with zring.Dataset(tmp_path / "e") as ds:
        assert len(ds) == 0
        assert ds[:].shape == (0, 4)
        assert ds[[]].shape == (0, 4)


def test_memmap_source_is_streamed(tmp_path):
    arr = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.int16, shape=(1000, 7))
    arr[:] = np.arange(7000, dtype=np.int16).reshape(1000, 7)
    arr.flush()
    src = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert zring.write_dataset(tmp_path / "d", src, chunk_bytes=1000) == 1000
    with zring.Dataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], src)


@pytest.mark.parametrize("values, dtype, shown", [
    (np.array([5, 70000, 9]), np.uint16, "70000"),
    (np.array([1, 2**40]), np.int32, str(2**40)),
    ([3, -1], np.uint8, "-1"),
    (np.array([1.0, 1.5]), np.int64, "1.5"),
    (np.array([1.0, np.nan]), np.int16, "nan"),
    (np.array([1e300]), np.float32, "1e+300"),
    (np.array([2]), np.bool_, "2"),
])
def test_a_value_the_dtype_cannot_hold_is_an_error_naming_value_and_dtype(tmp_path, values, dtype, shown):
    # write_ragged(..., dtype=np.uint16) stored token 70000 as 4464, and int32
    # stored 2**40 as 0: NumPy's cast wraps silently.
    arrays = [np.array([0, 1]), values]
    with pytest.raises(ValueError, match=re.escape(f"array 1 holds {shown}, which {np.dtype(dtype)} cannot hold")):
        zring.write_ragged(tmp_path / "r", arrays, dtype=dtype)
    assert not (tmp_path / "r").exists(), "nothing is written"
    # Values the dtype holds are stored, whatever dtype they came in.
    zring.write_ragged(tmp_path / "ok", [np.array([0, 65535], np.int64), [7.0, 8.0]], dtype=np.uint16)
    with zring.RaggedDataset(tmp_path / "ok") as d:
        assert d.dtype == np.uint16 and d[0].tolist() == [0, 65535] and d[1].tolist() == [7, 8]


def test_write_dataset_never_narrows_a_dtype(tmp_path):
    # write_dataset stores the array's own dtype; appending wider values to a
    # narrower store is refused rather than cast.
    zring.write_dataset(tmp_path / "d", np.array([1, 2], np.uint16))
    with pytest.raises(ValueError, match="cannot append int64"):
        zring.write_dataset(tmp_path / "d", np.array([70000], np.int64), append=True)
    with zring.Dataset(tmp_path / "d") as d:
        assert d[:].tolist() == [1, 2]
