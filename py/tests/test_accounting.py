"""Per-source accounting and the rows of the batch just returned.

Before, nothing said how much of each source a run had consumed
(``stats()`` and ``state()`` had no per-source counts), GlobalLoader's
``last_sources`` named the rows of the last step its prefetch had read
(ahead of the batch returned), a packed state's ``"length"`` of
13835058055282163712 went unexplained, and a packed mixture whose source
grew was refused naming it "2/tokens". These tests hold: ``state()`` and
``stats()`` list each source's rows, records (packed: documents begun and
tokens) and epochs up to the step, equal to what the batches held;
``last_sources`` is the returned batch's; the refusal names the path.
"""

import os

import numpy as np
import pytest

import zring

B = 20


@pytest.fixture
def sources(tmp_path):
    out = []
    for k, n in enumerate((100, 60)):
        zring.write_dataset(tmp_path / f"x{k}", np.arange(n, dtype=np.int64) * 10 + k)
        out.append({"x": zring.Dataset(tmp_path / f"x{k}")})
    return out


def test_a_mixture_counts_each_sources_records_and_epochs(sources):
    with zring.DataLoader(zring.mix(sources, [0.7, 0.3]), batch_size=B, mode=2, seed=1) as dl:
        seen = np.zeros(2, np.int64)
        for _ in range(9):
            next(dl)
            seen += np.bincount(dl.last_sources, minlength=2)
        consumed = dl.state()["consumed"]
        assert dl.stats()["consumed"] == consumed
    assert [c["rows"] for c in consumed] == list(seen)
    assert [c["records"] for c in consumed] == list(seen)
    assert consumed[0]["epochs"] == pytest.approx(seen[0] / 100)
    assert consumed[1]["epochs"] == pytest.approx(seen[1] / 60)
    # A shard's state counts the whole run's rows (every rank's), the same on each.
    with zring.DataLoader(zring.mix(sources, [0.7, 0.3]), batch_size=B, mode=2, seed=1, shard=(1, 4)) as dl:
        for _ in range(9):
            next(dl)
        assert dl.state()["consumed"] == consumed


def test_a_packed_mixture_counts_documents_and_tokens(tmp_path):
    # Documents of 1 to 7 tokens: each token names its document, 1000 * d + j.
    paths = []
    for k, n in enumerate((50, 30)):
        docs = [np.arange(d % 7 + 1, dtype=np.int32) + 1000 * d for d in range(n)]
        zring.write_ragged(tmp_path / f"d{k}", docs)
        paths.append(tmp_path / f"d{k}")
    m = zring.mix([zring.RaggedDataset(p) for p in paths], [0.5, 0.5])
    with zring.DataLoader(zring.pack(m, 8), batch_size=4, mode=1, seed=3) as dl:
        tokens = np.zeros(2, np.int64)
        starts = np.zeros(2, np.int64)
        for _ in range(12):
            batch = next(dl)
            tokens += 8 * np.bincount(dl.last_sources, minlength=2)
            # A document is begun where a row holds its position 0 (iid
            # draws may repeat a document: each draw counts).
            rows = np.nonzero(batch["positions"] == 0)[0]
            starts += np.bincount(np.asarray(dl.last_sources)[rows], minlength=2)
        state = dl.state()
    consumed = state["consumed"]
    assert [c["tokens"] for c in consumed] == list(tokens)
    assert [c["rows"] for c in consumed] == list(tokens // 8)
    assert [c["documents"] for c in consumed] == list(starts)
    assert consumed[1]["epochs"] == pytest.approx(starts[1] / 30)
    # The sampler's "length" counts packed rows, 2^62 a source (module docs).
    assert state["sampler"]["length"] == 2 * 2**62


def test_a_packed_source_that_grew_resumes_and_one_that_changed_is_named_by_its_path(tmp_path):
    docs = [np.arange(5, dtype=np.int32)] * 20
    for k in range(3):
        zring.write_ragged(tmp_path / f"d{k}", docs)
    m = lambda: zring.mix([zring.RaggedDataset(tmp_path / f"d{k}") for k in range(3)], [1, 1, 1])  # noqa: E731
    with zring.DataLoader(zring.pack(m(), 4), batch_size=6, mode=2, seed=0) as dl:
        next(dl)
        state = dl.state()
    zring.write_ragged(tmp_path / "d2", docs[:3], append=True)
    with zring.DataLoader(zring.pack(m(), 4), state=state) as dl:
        next(dl)
        assert [g[-1][1] for g in dl.state()["pack_growth"]] == [20, 20, 23]
    zring.write_ragged(tmp_path / "d2", [np.arange(7, dtype=np.int32)] * 20, overwrite=True)
    with pytest.raises(ValueError, match=f"{tmp_path / 'd2'} \\(source 2, 2/tokens\\)"):
        zring.DataLoader(zring.pack(m(), 4), state=state)


def test_global_loader_last_sources_are_the_batch_returned(tmp_path):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = pytest.importorskip("jax")
    import zring.jax as zjax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    sources = []
    for k, n in enumerate((300, 200, 120)):
        zring.write_dataset(tmp_path / f"y{k}", (100_000 * k + np.arange(n)).astype(np.int32))
        sources.append({"y": zring.Dataset(tmp_path / f"y{k}")})
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))
    with zjax.global_loader(zring.mix(sources, [0.5, 0.3, 0.2]), 16, sharding, mode=2, seed=5, prefetch=3,
                            num_workers=1) as g:
        for step in range(6):
            y = np.asarray(next(g)["y"])
            assert g.last_step == step
            np.testing.assert_array_equal(g.last_sources, y // 100_000)
            np.testing.assert_array_equal(g.last_indices, y % 100_000)
        # The loader underneath has read ahead: its rows are a later step's.
        assert g.loader.last_step > g.last_step
        assert sum(c["rows"] for c in g.state()["consumed"]) == 6 * 16
