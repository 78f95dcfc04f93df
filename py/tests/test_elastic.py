"""Elastic host counts: a run saved by 4 ranks goes on with 2 and with 8.
The new ranks' first pass holds exactly the documents (records) no saved
rank had delivered in its cycle under way, each once across the new ranks;
then each new rank reads its parts under the new placement, every record
once per cycle; a new rank's state resumes in either phase."""

from __future__ import annotations

import numpy as np
import pytest

import zring
from zring import elastic, parts

L, B = 16, 4


def _corpus(root, n_parts=12, per=40, seed=0):
    """Documents whose tokens are all their index in the whole dataset."""
    rng = np.random.default_rng(seed)
    lengths, d = [], 0
    for _ in range(n_parts):
        docs = []
        for _ in range(per):
            n = int(rng.integers(3, 50))
            docs.append(np.full(n, d, np.int32))
            lengths.append(n)
            d += 1
        parts.commit(root, [parts.write_part(root, docs, codec="zstd")])
    return np.array(lengths)


def _open_packed(root):
    def open_rank(rank, ranks):
        return zring.pack(zring.RaggedDataset(root, rank_parts=(rank, ranks)), L)
    return open_rank


def _old_run(root, steps):
    """4 ranks, each `steps` steps; their states and the documents begun."""
    states, begun = [], set()
    for k in range(4):
        src = _open_packed(root)(k, 4)
        with zring.DataLoader(src, batch_size=B, mode=2, seed=9) as dl:
            for _ in range(steps):
                begun |= set(np.unique(next(dl)["tokens"]).tolist())
            states.append(dl.state())
        src.datasets[0].close()
    return states, begun


@pytest.mark.parametrize("new_ranks", [2, 8])
def test_a_four_rank_packed_run_goes_on_with_another_rank_count(tmp_path, new_ranks):
    root = tmp_path / "corpus"
    lengths = _corpus(root)
    states, begun = _old_run(root, 25)
    rest = elastic.remaining(states, _open_packed(root))
    assert set(rest.tolist()) == set(range(len(lengths))) - begun
    seen: dict[int, int] = {}
    for j in range(new_ranks):
        with elastic.ElasticLoader(states, _open_packed(root), rank=j, ranks=new_ranks, seed=3,
                                   batch_size=B) as el:
            toks, first = [], None
            while el.phase == 1:
                b = next(el)
                if el.phase == 1:
                    # Tokens past the pass's end are cut: segment 0.
                    v = el.last_valid
                    toks.append(b["tokens"][:v][b["segment_ids"][:v] > 0])
                else:
                    first = b  # the new placement's first batch
            mine = np.concatenate(toks) if toks else np.zeros(0, np.int32)
            ids, counts = np.unique(mine, return_counts=True)
            for i, c in zip(ids.tolist(), counts.tolist()):
                assert i not in seen, f"document {i} delivered by two new ranks"
                seen[i] = c
            # Then its own parts, every document once per cycle.
            with zring.RaggedDataset(root, rank_parts=(j, new_ranks)) as own:
                from zring._split import whole_positions
                own_ids = whole_positions(own).astype(np.int64)
            cyc = sum(int(lengths[i]) for i in own_ids)
            batches = [first] + [next(el) for _ in range(cyc // (B * L) + 2)]
            stream = np.concatenate([b["tokens"].reshape(-1) for b in batches])
            # The first cycle of the new run: the rank's documents, each whole.
            np.testing.assert_array_equal(np.sort(np.unique(stream[:cyc])), np.sort(own_ids))
            np.testing.assert_array_equal(np.bincount(stream[:cyc], minlength=len(lengths))[own_ids], lengths[own_ids])
    # Every document not begun by the saved run: once, whole; none begun twice.
    assert set(seen) == set(range(len(lengths))) - begun
    for i, c in seen.items():
        assert c == lengths[i], (i, c, lengths[i])


def test_a_new_ranks_state_resumes_in_either_phase_and_records_are_taken_too(tmp_path):
    root = tmp_path / "corpus"
    lengths = _corpus(root, n_parts=8)
    states, _ = _old_run(root, 10)
    kw = dict(rank=1, ranks=2, seed=5, batch_size=B)
    with elastic.ElasticLoader(states, _open_packed(root), **kw) as el:
        a = [next(el)["tokens"] for _ in range(3)]
        st1 = el.state()
        b = [next(el)["tokens"] for _ in range(400)]
        assert el.phase == 2
        st2 = el.state()
        c = [next(el)["tokens"] for _ in range(5)]
    assert st1["phase"] == 1
    with elastic.ElasticLoader(None, _open_packed(root), state=st1, **kw) as el:
        np.testing.assert_array_equal(np.concatenate([next(el)["tokens"] for _ in range(400)]), np.concatenate(b))
    with elastic.ElasticLoader(None, _open_packed(root), state=st2, **kw) as el:
        np.testing.assert_array_equal(np.concatenate([next(el)["tokens"] for _ in range(5)]), np.concatenate(c))
    del a
    with pytest.raises(ValueError, match="not rank 0 of 2"):
        elastic.ElasticLoader(None, _open_packed(root), state=st1, rank=0, ranks=2, seed=5)

    # Records of fixed size (mode 2): the same rule.
    recs = tmp_path / "recs"
    for k in range(8):
        parts.commit(recs, [parts.write_part(recs, np.arange(k * 30, k * 30 + 30, dtype=np.int64).reshape(-1, 1))])

    def open_rank(rank, ranks):
        return {"x": zring.Dataset(recs, rank_parts=(rank, ranks))}

    old, delivered = [], set()
    for k in range(4):
        src = open_rank(k, 4)
        with zring.DataLoader(src, batch_size=5, mode=2, seed=1) as dl:
            for _ in range(4):
                delivered |= set(next(dl)["x"][:, 0].tolist())
            old.append(dl.state())
        src["x"].close()
    got = []
    for j in range(2):
        with elastic.ElasticLoader(old, open_rank, rank=j, ranks=2, seed=2, batch_size=5, mode=2) as el:
            while el.phase == 1:
                x = next(el)["x"]
                if el.phase == 1:
                    got += x[:el.last_valid, 0].tolist()
    assert sorted(got) == sorted(set(range(240)) - delivered)
