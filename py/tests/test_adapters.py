"""zring.adapters: the Grain source and the torch Dataset read what Dataset reads, and pickle by path."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import zring
from zring.adapters import GrainSource, TorchDataset

N = 120


@pytest.fixture
def stores(tmp_path, sequences):
    x = (np.arange(N * 6, dtype=np.float32).reshape(N, 2, 3) * 0.5)
    y = np.arange(N, dtype=np.int32) * 3
    zring.write_dataset(tmp_path / "x", x)
    zring.write_dataset(tmp_path / "y", y)
    zring.write_ragged(tmp_path / "seq", sequences)
    return tmp_path, x, y, sequences


@pytest.mark.parametrize("cls", [GrainSource, TorchDataset])
def test_single_store_matches_dataset(cls, stores):
    root, x, _, _ = stores
    ds = zring.Dataset(root / "x")
    src = cls(root / "x")
    assert len(src) == len(ds) == N
    for i in (0, 7, N - 1, -1):
        np.testing.assert_array_equal(src[i], ds[i])
    np.testing.assert_array_equal(src[np.int64(5)], x[5])
    idx = [3, 99, 3, 0, N - 1]
    items = src.__getitems__(idx)
    assert isinstance(items, list) and len(items) == len(idx)
    np.testing.assert_array_equal(np.stack(items), ds[idx])
    assert src.__getitems__([]) == []
    with pytest.raises(IndexError):
        src[N]
    with pytest.raises(TypeError):
        src[1.5]


@pytest.mark.parametrize("cls", [GrainSource, TorchDataset])
def test_named_stores_give_dict_samples(cls, stores):
    root, x, y, _ = stores
    src = cls({"x": root / "x", "y": zring.Dataset(root / "y")})
    assert len(src) == N
    sample = src[10]
    assert set(sample) == {"x", "y"}
    np.testing.assert_array_equal(sample["x"], x[10])
    assert sample["y"] == y[10]
    items = src.__getitems__(np.array([4, 2]))
    np.testing.assert_array_equal([s["y"] for s in items], y[[4, 2]])
    np.testing.assert_array_equal(np.stack([s["x"] for s in items]), x[[4, 2]])


def test_ragged_store(stores):
    root, _, _, seqs = stores
    src = GrainSource(root / "seq")
    assert len(src) == len(seqs)
    np.testing.assert_array_equal(src[3], seqs[3])
    for got, i in zip(src.__getitems__([5, 0, 5]), [5, 0, 5]):
        np.testing.assert_array_equal(got, seqs[i])


def test_mismatched_lengths_and_bad_sources(stores, tmp_path):
    root, _, _, _ = stores
    with pytest.raises(ValueError, match="same length"):
        GrainSource({"x": root / "x", "seq": root / "seq"})
    with pytest.raises(FileNotFoundError):
        GrainSource(tmp_path / "missing")
    with pytest.raises(TypeError):
        GrainSource(42)
    with pytest.raises(ValueError, match="at least one"):
        TorchDataset({})


@pytest.mark.parametrize("cls", [GrainSource, TorchDataset])
def test_pickle_round_trip_reopens_by_path(cls, stores):
    root, x, y, _ = stores
    src = cls({"x": root / "x", "y": root / "y"})
    blob = pickle.dumps(src)
    assert len(blob) < 1000, "the pickle must carry paths, not data"
    back = pickle.loads(blob)
    assert type(back) is cls and len(back) == N and repr(back) == repr(src)
    idx = [0, 50, 119]
    for a, b in zip(src.__getitems__(idx), back.__getitems__(idx)):
        np.testing.assert_array_equal(a["x"], b["x"])
        assert a["y"] == b["y"]
    src.close()
    # The copy owns its own stores.
    np.testing.assert_array_equal(back[1]["x"], x[1])


def test_grain_pipeline_reads_the_source(stores):
    grain = pytest.importorskip("grain")
    root, x, y, _ = stores
    src = GrainSource({"x": root / "x", "y": root / "y"})
    ds = grain.MapDataset.source(src).batch(8)
    first = ds[0]
    np.testing.assert_array_equal(first["y"], y[:8])
    np.testing.assert_array_equal(first["x"], x[:8])
    shuffled = [int(v) for b in grain.MapDataset.source(src).shuffle(seed=1).batch(40) for v in b["y"]]
    assert sorted(shuffled) == sorted(y.tolist())


def test_torch_dataloader_with_two_workers(stores):
    torch = pytest.importorskip("torch")
    root, x, y, _ = stores
    ds = TorchDataset({"x": root / "x", "y": root / "y"})
    assert isinstance(ds, torch.utils.data.Dataset)
    calls = []
    # Batched reads: torch's fetcher passes each batch's indices to __getitems__.
    orig = TorchDataset.__getitems__
    probe = type("Probe", (TorchDataset,), {"__getitems__": lambda self, i: calls.append(len(i)) or orig(self, i)})
    loader = torch.utils.data.DataLoader(probe({"x": root / "x"}), batch_size=10, num_workers=0)
    next(iter(loader))
    assert calls == [10]

    # Forking a process that has JAX's threads running risks a deadlock (JAX
    # warns); fork is only tried while no test has imported jax yet.
    contexts = ["spawn"] if "jax" in sys.modules else ["fork", "spawn"]
    for ctx in contexts:
        loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2,
                                             multiprocessing_context=ctx,
                                             generator=torch.Generator().manual_seed(0))
        seen = []
        for batch in loader:
            assert batch["x"].dtype == torch.float32 and batch["y"].dtype == torch.int32
            ys = batch["y"].numpy()
            np.testing.assert_array_equal(batch["x"].numpy(), x[ys // 3])
            seen.extend(ys.tolist())
        assert sorted(seen) == y.tolist(), ctx
