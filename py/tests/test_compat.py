"""The same scenarios run against loaderx and against ``zring as loaderx``.

Each scenario takes the module as ``lx`` and returns what a user would see;
the test asserts both modules give identical arrays (values, dtypes and
shapes). Batches of random DataLoader modes depend on each library's sampler,
so for those the zring run is checked against its own dataset at the
delivered indices instead.
"""

import numpy as np
import pytest


def _same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} != {b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_both(loaderx, zring, tmp_path, scenario):
    ref = scenario(loaderx, tmp_path / "loaderx")
    got = scenario(zring, tmp_path / "zring")
    _same(ref, got)
    return got


def s_dataset_indexing(lx, root, images):
    root.mkdir()
    n = lx.write_dataset(root / "img", images)
    labels = np.arange(len(images), dtype=np.int64) * 3
    lx.write_dataset(root / "lab", labels, codec="raw")
    out = {"n": n}
    with lx.Dataset(root / "img") as ds, lx.Dataset(root / "lab") as lab:
        out["len"] = len(ds)
        out["dtype"] = str(ds.dtype)
        out["shape"] = tuple(ds.shape)
        out["int"] = ds[5]
        out["neg"] = ds[-1]
        out["slice"] = ds[3:20:4]
        out["list"] = ds[[0, 63, 7, 7]]
        out["array"] = ds[np.array([9, 1, 2], dtype=np.int64)]
        mask = np.zeros(len(ds), dtype=bool)
        mask[[2, 30, 40]] = True
        out["mask"] = ds[mask]
        out["getitems"] = ds.__getitems__([4, 2])
        out["scalar_label"] = lab[10]
        out["labels"] = lab[:]
    return out


def s_zstd_dict(lx, root, images):
    root.mkdir()
    lx.write_dataset(root / "d", images, codec="zstd_dict")
    with lx.Dataset(root / "d") as ds:
        return {"all": ds[:], "some": ds[[5, 1]]}


def s_small_chunks(lx, root, images):
    # chunk_bytes smaller than one sample still writes one record per call.
    root.mkdir()
    lx.write_dataset(root / "c", images, chunk_bytes=100)
    # loaderx appends to an existing store; zring does when asked to.
    more = {"append": True} if lx.__name__.startswith("zring") else {}
    lx.write_dataset(root / "c", images[:3], chunk_bytes=1000, **more)
    with lx.Dataset(root / "c") as ds:
        return {"len": len(ds), "all": ds[:]}


def s_ragged(lx, root, seqs):
    root.mkdir()
    n = lx.write_ragged(root / "r", seqs)
    vecs = [np.arange(3 * k, dtype=np.float32).reshape(k, 3) for k in (2, 3, 5, 1)]
    lx.write_ragged(root / "v", vecs, item_shape=(3,), codec="raw")
    out = {"n": n}
    with lx.RaggedDataset(root / "r") as rds, lx.RaggedDataset(root / "v") as vds:
        out["len"] = len(rds)
        out["one"] = rds[3]
        out["neg"] = rds[-2]
        out["batch"] = rds[[0, 2, 4, 39]]
        out["slice"] = rds[5:9]
        values, splits = rds[[1, 3, 5]]
        out["pad"] = lx.pad(values, splits)
        out["pad_fixed"] = lx.pad(values, splits, max_len=12, pad_value=-1)
        out["padded"] = rds.getitems_padded([1, 3, 5])
        out["padded_fixed"] = rds.getitems_padded([1, 3, 5], max_len=10, pad_value=7)
        out["vecs"] = vds[[0, 1, 2, 3]]
        out["vec_pad"] = vds.getitems_padded([2, 0])
    return out


def s_zrecord(lx, root):
    out = {}
    with lx.Zrecord(root, codec="raw") as z:
        fixed = np.arange(40, dtype=np.uint8)
        out["first"] = z.append(fixed, 10, 4)
        src = np.frombuffer(b"helloworld!zring", dtype=np.uint8).copy()
        out["first_var"] = z.append_var(src, [0, 5, 10], [5, 6, 6], codec="zstd")
        out["len"] = len(z)
        out["lengths"] = z.lengths([0, 10, 11, 12])
        dst = np.zeros(12, dtype=np.uint8)
        z.gather(np.array([3, 0, 9], dtype=np.uint64), dst, 4)
        out["gather"] = dst
        var = np.zeros(16, dtype=np.uint8)
        z.gather_var(np.array([11, 10], dtype=np.uint64), var, np.array([0, 8], dtype=np.uint64))
        out["gather_var"] = var
        out["has_dict"] = z.has_dict()
        z.sync()
        z.delete([0, 4])
        out["len_after_delete"] = len(z)
        out["after_delete"] = [bytes(_read(z, i)) for i in range(len(z))]
        z.compact()
        out["after_compact"] = [bytes(_read(z, i)) for i in range(len(z))]
        out["records"] = z.stats()["records"]
    with lx.Zrecord(root) as z:  # reopen: everything persisted
        out["reopened"] = [bytes(_read(z, i)) for i in range(len(z))]
    return out


def _read(z, i):
    n = int(z.lengths([i])[0])
    dst = np.zeros(max(n, 1), dtype=np.uint8)
    z.gather_var(np.array([i], dtype=np.uint64), dst, np.zeros(1, dtype=np.uint64))
    return dst[:n]


def s_dict_training(lx, root):
    rng = np.random.default_rng(3)
    recs = [(np.tile(np.arange(64, dtype=np.uint8), 4) + rng.integers(0, 3, 256).astype(np.uint8))
            for _ in range(300)]
    buf = np.concatenate(recs)
    with lx.Zrecord(root, codec="zstd_dict") as z:
        z.train_dict(buf, np.full(len(recs), 256), 4096)
        has = z.has_dict()
        z.append(buf, len(recs), 256)
        dst = np.zeros(256 * 3, dtype=np.uint8)
        z.gather(np.array([0, 150, 299], dtype=np.uint64), dst, 256)
    return {"has": has, "data": dst}


def s_sequential_loader(lx, root, images):
    root.mkdir()
    lx.write_dataset(root / "img", images)
    lx.write_dataset(root / "lab", np.arange(len(images), dtype=np.int32))
    img, lab = lx.Dataset(root / "img"), lx.Dataset(root / "lab")
    loader = lx.DataLoader({"img": img, "lab": lab}, num_workers=1, batch_size=24,
                           prefetch_size=2, mode=0, seed=1)
    try:
        batches = [next(loader) for _ in range(5)]
    finally:
        loader.close()
    return {"batches": batches}


def test_dataset_indexing(loaderx, zring, tmp_path, images):
    run_both(loaderx, zring, tmp_path, lambda lx, r: s_dataset_indexing(lx, r, images))


def test_zstd_dict_dataset(loaderx, zring, tmp_path, images):
    run_both(loaderx, zring, tmp_path, lambda lx, r: s_zstd_dict(lx, r, images))


def test_small_chunks_and_append(loaderx, zring, tmp_path, images):
    got = run_both(loaderx, zring, tmp_path, lambda lx, r: s_small_chunks(lx, r, images))
    assert got["len"] == len(images) + 3


def test_ragged_and_pad(loaderx, zring, tmp_path, sequences):
    run_both(loaderx, zring, tmp_path, lambda lx, r: s_ragged(lx, r, sequences))


def test_zrecord_ops_delete_compact(loaderx, zring, tmp_path):
    got = run_both(loaderx, zring, tmp_path, s_zrecord)
    assert got["len_after_delete"] == 11


def test_zrecord_dictionary(loaderx, zring, tmp_path):
    run_both(loaderx, zring, tmp_path, s_dict_training)


def test_sequential_dataloader(loaderx, zring, tmp_path, images):
    got = run_both(loaderx, zring, tmp_path, lambda lx, r: s_sequential_loader(lx, r, images))
    # Sequential wraps around the end: step 2 holds records 48..63 then 0..7.
    np.testing.assert_array_equal(got["batches"][2]["lab"], np.r_[48:64, 0:8].astype(np.int32))


@pytest.mark.parametrize("mode", [1, 2])
def test_random_mode_batches_match_dataset(zring, tmp_path, images, mode):
    zring.write_dataset(tmp_path / "img", images)
    zring.write_dataset(tmp_path / "lab", np.arange(len(images), dtype=np.int32))
    img, lab = zring.Dataset(tmp_path / "img"), zring.Dataset(tmp_path / "lab")
    with zring.DataLoader({"img": img, "lab": lab}, num_workers=2, batch_size=16,
                          mode=mode, seed=5) as loader:
        sampler = zring.Sampler(len(img), 16, mode, seed=5)
        for _ in range(6):
            batch = next(loader)
            idx = sampler.next()
            np.testing.assert_array_equal(loader.last_indices, idx)
            np.testing.assert_array_equal(batch["img"], img[idx])
            np.testing.assert_array_equal(batch["lab"], idx.astype(np.int32))
            if mode == 2:
                assert len(set(idx.tolist())) == 16


def test_loaderx_store_opened_by_zring(loaderx, zring, tmp_path, images, sequences):
    """A store written by loaderx reads the same through zring, in place and imported."""
    loaderx.write_dataset(tmp_path / "img", images)
    loaderx.write_ragged(tmp_path / "seq", sequences)
    ref = loaderx.Dataset(tmp_path / "img")[:]
    with zring.Dataset(tmp_path / "img") as ds:
        np.testing.assert_array_equal(ds[:], ref)
        assert ds.dtype == ref.dtype and ds.shape == ref.shape[1:]
    with zring.RaggedDataset(tmp_path / "seq") as rds:
        v, s = rds[:]
        rv, rs = loaderx.RaggedDataset(tmp_path / "seq")[:]
        np.testing.assert_array_equal(v, rv)
        np.testing.assert_array_equal(s, rs)
    zring.import_loaderx(tmp_path / "img", tmp_path / "img_native")
    with zring.Dataset(tmp_path / "img_native") as ds:
        np.testing.assert_array_equal(ds[:], ref)


def test_a_damaged_loaderx_record_is_not_imported(loaderx, zring, tmp_path):
    """loaderx keeps no checksums: the import decodes each record before it
    gives it one, so damaged bytes are an error naming the record."""
    tiles = np.random.default_rng(0).integers(0, 4, (64, 3, 16, 16), dtype=np.uint8)
    loaderx.write_dataset(tmp_path / "img", tiles)  # zstd, and compressible
    chunk = tmp_path / "img" / "0.zr"
    with open(chunk, "r+b") as f:
        head = f.read(4)
        assert head == b"\x28\xb5\x2f\xfd", "record 0 starts with a zstd frame"
        f.seek(0)
        f.write(b"\x00\x00\x00\x00")
    with pytest.raises(zring.CorruptError, match="record 0 of loaderx store"):
        zring.import_loaderx(tmp_path / "img", tmp_path / "native")


def test_zring_and_loaderx_stores_give_identical_arrays(loaderx, zring, tmp_path, images):
    loaderx.write_dataset(tmp_path / "a", images)
    zring.write_dataset(tmp_path / "b", images)
    with zring.Dataset(tmp_path / "a") as a, zring.Dataset(tmp_path / "b") as b:
        idx = [5, 0, 63, 5]
        np.testing.assert_array_equal(a[idx], b[idx])
        np.testing.assert_array_equal(a[:], b[:])


def test_schema_fields_match_loaderx(loaderx, zring, tmp_path, images):
    import json
    loaderx.write_dataset(tmp_path / "a", images)
    loaderx.write_ragged(tmp_path / "r", [np.zeros((2, 3), np.float32)])
    zring.write_dataset(tmp_path / "b", images)
    zring.write_ragged(tmp_path / "s", [np.zeros((2, 3), np.float32)])
    ref = json.loads((tmp_path / "a" / "schema.json").read_text())
    ref_r = json.loads((tmp_path / "r" / "schema.json").read_text())
    with zring.Store(tmp_path / "b") as st:
        assert json.loads(st.schema()) == ref
    with zring.Store(tmp_path / "s") as st:
        assert json.loads(st.schema()) == ref_r
