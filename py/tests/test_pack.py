"""zring.pack: a RaggedDataset of token documents (or a mixture of them) read
as rows of seq_len tokens with segment ids and positions, packed in the Rust
loader; rows are a pure function of the step, so resume and shards hold."""

from __future__ import annotations

import numpy as np
import pytest

import zring


def _lengths(n: int, lo: int, hi: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi + 1, size=n)


def _write(path, lengths, base: int = 0, dtype=np.int32) -> zring.RaggedDataset:
    """Token j of document d is base + d * 10_000 + j."""
    docs = [(base + d * 10_000 + np.arange(n)).astype(dtype) for d, n in enumerate(lengths)]
    zring.write_ragged(str(path), docs, codec="raw")
    return zring.RaggedDataset(str(path))


def _segments(batch: dict, base: int = 0) -> list[list[tuple[int, int, int]]]:
    """Per row, its segments as (document, first position, tokens), checking
    that each is consecutive tokens of one document and padding is pad."""
    tok, seg, pos = batch["tokens"], batch["segment_ids"], batch["positions"]
    assert seg.dtype == np.int32 and pos.dtype == np.int32 and tok.shape == seg.shape == pos.shape
    rows = []
    for t, s, p in zip(tok, seg, pos):
        real = s > 0
        assert np.all(t[~real] == -1) and np.all(p[~real] == 0)
        assert np.array_equal(t[real], base + (t[real] - base) // 10_000 * 10_000 + p[real])
        out = []
        ids = s[real]
        assert ids[0] == 1 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)
        for i in range(1, int(ids.max()) + 1):
            where = np.flatnonzero(s == i)
            assert np.all(np.diff(where) == 1) and np.all(np.diff(p[where]) == 1)
            d = int((t[where[0]] - base) // 10_000)
            assert np.all((t[where] - base) // 10_000 == d)
            out.append((d, int(p[where[0]]), where.size))
        rows.append(out)
    return rows


def test_concat_cycle_rebuilds_every_document_once(tmp_path):
    lengths = _lengths(400, 1, 120, 0)
    ds = _write(tmp_path / "d", lengths)
    L, B = 64, 8
    total = int(lengths.sum())
    with zring.DataLoader(zring.pack(ds, L), batch_size=B, mode=2, seed=5) as dl:
        batches = [next(dl) for _ in range(total // (L * B) + 2)]
    assert batches[0]["tokens"].shape == (B, L) and batches[0]["tokens"].dtype == np.int32
    seg = np.concatenate([b["segment_ids"] for b in batches])
    assert np.all(seg > 0), "nothing padded"
    tok = np.concatenate([b["tokens"].reshape(-1) for b in batches])[:total]
    pos = np.concatenate([b["positions"].reshape(-1) for b in batches])[:total]
    doc = tok // 10_000
    assert np.array_equal(tok, doc * 10_000 + pos)
    counts = np.bincount(doc, minlength=len(lengths))
    assert np.array_equal(counts, lengths), "every document exactly once, whole"
    starts = np.flatnonzero(pos == 0)
    assert len(starts) == len(lengths) and len(set(doc[starts])) == len(lengths)


def test_first_fit_rows_hold_whole_documents(tmp_path):
    lengths = _lengths(2000, 50, 4000, 1)
    ds = _write(tmp_path / "d", lengths)
    L = 1024
    real = allt = 0
    with zring.DataLoader(zring.pack(ds, L, mode="first_fit", pad_id=-1), batch_size=32, mode=2) as dl:
        for _ in range(60):
            b = next(dl)
            real += int((b["segment_ids"] > 0).sum())
            allt += b["segment_ids"].size
            for row in _segments(b):
                for d, first, n in row:
                    if lengths[d] <= L:
                        assert (first, n) == (0, lengths[d]), "a document that fits is whole"
                    else:
                        assert first % L == 0 and n == min(L, lengths[d] - first)
    assert real / allt >= 0.9, real / allt


@pytest.mark.parametrize("how", ["concat", "first_fit"])
def test_resume_after_seven_steps(tmp_path, how):
    ds = _write(tmp_path / "d", _lengths(800, 5, 600, 2))
    packed = zring.pack(ds, 128, mode=how, pad_id=-1)
    with zring.DataLoader(packed, batch_size=8, mode=2, seed=9) as dl:
        want = [next(dl) for _ in range(10)]
    with zring.DataLoader(packed, batch_size=8, mode=2, seed=9) as dl:
        for _ in range(7):
            next(dl)
        state = dl.state()
    assert state["pack"]["seq_len"] == 128 and state["pack"]["mode"] == how
    with zring.DataLoader(packed, state=state) as dl:
        for w in want[7:]:
            got = next(dl)
            for k in ("tokens", "segment_ids", "positions"):
                assert np.array_equal(got[k], w[k])
    with pytest.raises(ValueError, match="packing"):
        zring.DataLoader(zring.pack(ds, 64, mode=how, pad_id=-1), state=state)


def test_two_shards_concatenate_to_the_global_batch(tmp_path):
    ds = _write(tmp_path / "d", _lengths(500, 5, 400, 3))
    packed = zring.pack(ds, 96, mode="first_fit", pad_id=-1)
    with zring.DataLoader(packed, batch_size=8, mode=2) as dl:
        want = [next(dl) for _ in range(4)]
    halves = []
    for k in range(2):
        with zring.DataLoader(packed, batch_size=8, mode=2, shard=(k, 2)) as dl:
            halves.append([next(dl) for _ in range(4)])
    for s in range(4):
        for key in ("tokens", "segment_ids", "positions"):
            assert np.array_equal(np.concatenate([halves[0][s][key], halves[1][s][key]]), want[s][key])


def test_packed_mixture_token_shares(tmp_path):
    a = _write(tmp_path / "a", _lengths(300, 20, 900, 4))
    b = _write(tmp_path / "b", _lengths(900, 5, 200, 5), base=1 << 29)
    L = 128
    tokens = np.zeros(2)
    with zring.DataLoader(zring.pack(zring.mix([a, b], [0.7, 0.3]), L), batch_size=20, mode=2) as dl:
        for _ in range(50):
            batch = next(dl)
            src = dl.last_sources
            assert src is not None and src.shape == (20,)
            for k in (0, 1):
                rows = batch["tokens"][src == k]
                assert np.all((rows >= (1 << 29)) == (k == 1)), "each row from its own source"
                tokens[k] += (batch["segment_ids"][src == k] > 0).sum()
    assert abs(tokens[0] / tokens.sum() - 0.7) <= 0.02


def test_bad_arguments(tmp_path):
    ds = _write(tmp_path / "d", [3, 4, 5])
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        zring.pack(ds, 0)
    with pytest.raises(ValueError, match="concat"):
        zring.pack(ds, 8, mode="best_fit")
    with pytest.raises(ValueError, match="pad_id"):
        zring.pack(ds, 8, pad_id=2**40)
    zring.write_dataset(str(tmp_path / "f"), np.zeros((4, 3), np.int32))
    with pytest.raises(TypeError, match="fixed-size records"):
        zring.pack(zring.Dataset(str(tmp_path / "f")), 8)
    zring.write_ragged(str(tmp_path / "r2"), [np.zeros((2, 3), np.int32)])
    with pytest.raises(ValueError, match="1-D records"):
        zring.pack(zring.RaggedDataset(str(tmp_path / "r2")), 8)
    zring.write_ragged(str(tmp_path / "fl"), [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="integer tokens"):
        zring.pack(zring.RaggedDataset(str(tmp_path / "fl")), 8)
    with pytest.raises(TypeError, match="RaggedDataset"):
        zring.pack({"tokens": ds}, 8)
    # Tokens of another dtype on the same records: the Rust loader says so.
    u8 = _write(tmp_path / "u8", [3, 4], dtype=np.uint8)
    with zring.DataLoader(zring.pack(u8, 2), batch_size=2, mode=0) as dl:
        assert next(dl)["tokens"].dtype == np.uint8


def test_long_documents_are_read_by_the_piece(tmp_path):
    """Regression: a document cut at a row's edge was read whole on every
    step (8 M-token documents: 16 MiB read for 32 KiB delivered). Over a raw
    store a step now reads at most twice the token bytes it delivers,
    counted by the store's read counters, and the rows are the documents'
    tokens in order."""
    lengths = [200_000, 150_000, 250_000]
    ds = _write(tmp_path / "long", lengths)
    L, B, steps = 256, 4, 400
    with zring.DataLoader(zring.pack(ds, L), batch_size=B, mode=0, num_workers=2) as dl:
        before = dl.stats()["reads"]["tokens"]
        tok = np.concatenate([next(dl)["tokens"].reshape(-1) for _ in range(steps)])
        stats = dl.stats()
    after = stats["reads"]["tokens"]
    read = sum(after[k] - before[k] for k in ("bytes_read", "bytes_from_page_cache", "bytes_from_cache"))
    delivered = stats["steps_gathered"] * B * L * 4
    assert 0 < read <= 2 * delivered, (read, delivered)
    # Mode 0: the documents in order, back to back.
    want = np.concatenate([d * 10_000 + np.arange(n) for d, n in enumerate(lengths)])[:tok.size]
    np.testing.assert_array_equal(tok, want.astype(np.int32))


def _labelled(batches: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = lambda k: np.concatenate([b[k].reshape(-1) for b in batches])  # noqa: E731
    return flat("tokens"), flat("labels"), flat("loss_mask")


@pytest.mark.parametrize("masked", [False, True])
def test_labels_pair_every_adjacent_token_exactly_once_per_cycle(tmp_path, masked):
    lengths = _lengths(300, 1, 90, 11)
    ds = _write(tmp_path / "d", lengths)
    L, B = 32, 8
    total = int(lengths.sum())
    packed = zring.pack(ds, L, labels=True, mask_boundaries=masked)
    with zring.DataLoader(packed, batch_size=B, mode=2, seed=1) as dl:
        batches = [next(dl) for _ in range(total // (L * B) + 2)]
    b = batches[0]
    assert list(b) == ["tokens", "segment_ids", "positions", "labels", "loss_mask"]
    assert b["labels"].shape == (B, L) and b["labels"].dtype == np.int32 and b["loss_mask"].dtype == np.uint8
    tok, lab, mask = _labelled(batches)
    # Rows overlap by one: every label is the stream's next token.
    assert np.array_equal(lab[:-1], tok[1:])
    tok, lab, mask = tok[:total], lab[:total], mask[:total]
    inside = (lab == tok + 1) & (lab // 10_000 == tok // 10_000)
    assert np.all(mask[inside] == 1)
    assert np.all(mask[~inside] == (0 if masked else 1))
    pairs = set(zip(tok[inside].tolist(), lab[inside].tolist()))
    assert len(pairs) == inside.sum() == int((lengths - 1).sum()), "each pair inside a document, once"


def test_labelled_resume_and_shards_are_exact(tmp_path):
    ds = _write(tmp_path / "d", _lengths(2000, 5, 500, 12))
    packed = zring.pack(ds, 64, labels=True, mask_boundaries=True, eod_id=-2, bos_id=-3)
    with zring.DataLoader(packed, batch_size=16, mode=2, seed=3) as dl:
        want = [next(dl) for _ in range(12)]
    with zring.DataLoader(packed, batch_size=16, mode=2, seed=3) as dl:
        for _ in range(7):
            next(dl)
        state = dl.state()
    with zring.DataLoader(packed, state=state) as dl:
        for w in want[7:]:
            got = next(dl)
            assert all(np.array_equal(got[k], w[k]) for k in w)
    halves = []
    for k in range(2):
        with zring.DataLoader(packed, batch_size=16, mode=2, seed=3, shard=(k, 2)) as dl:
            halves.append([next(dl) for _ in range(12)])
    for s, w in enumerate(want):
        for key in w:
            assert np.array_equal(np.concatenate([halves[0][s][key], halves[1][s][key]]), w[key])


def test_eod_and_bos_are_added_around_every_document(tmp_path):
    lengths = [3, 0, 5, 2]
    ds = _write(tmp_path / "d", lengths)
    with zring.DataLoader(zring.pack(ds, 4, eod_id=-2, bos_id=-3), batch_size=5, mode=0) as dl:
        b = next(dl)
    want = []
    for d, n in enumerate(lengths):
        want += [-3] + [d * 10_000 + j for j in range(n)] + [-2]
    assert b["tokens"].reshape(-1)[: len(want)].tolist() == want
    assert b["positions"].reshape(-1)[:6].tolist() == [0, 1, 2, 3, 4, 0]


def test_pad_id_is_required_where_rows_are_padded(tmp_path):
    ds = _write(tmp_path / "d", [3, 4, 5])
    with pytest.raises(ValueError, match="pass pad_id="):
        zring.pack(ds, 8, mode="first_fit")
    assert zring.pack(ds, 8).pad_id is None, "concat never pads"
    with pytest.raises(ValueError, match="labels=True"):
        zring.pack(ds, 8, mask_boundaries=True)
    with pytest.raises(ValueError, match="eod_id"):
        zring.pack(ds, 8, eod_id=2**40)
    # A state saved by a first-fit run of pad 0 (the old default) resumes
    # with pad_id=0 given.
    with zring.DataLoader(zring.pack(ds, 8, mode="first_fit", pad_id=0), batch_size=2, mode=2) as dl:
        next(dl)
        state = dl.state()
    assert "labels" not in state["pack"] and "eod_id" not in state["pack"], "old states look the same"
    with zring.DataLoader(zring.pack(ds, 8, mode="first_fit", pad_id=0), state=state) as dl:
        next(dl)


def test_a_uint16_source_mixes_with_int32_sources_and_a_value_too_wide_is_an_error(tmp_path):
    # A Megatron import holds uint16 tokens; two other stores int32.
    mega = _write(tmp_path / "mega", _lengths(300, 5, 200, 13), dtype=np.uint16, base=0)
    a = _write(tmp_path / "a", _lengths(300, 5, 200, 14), base=1 << 22)
    b = _write(tmp_path / "b", _lengths(300, 5, 200, 15), base=1 << 23)
    mix = zring.mix([mega, a, b], [0.6, 0.3, 0.1])
    packed = zring.pack(mix, 64, labels=True)
    assert packed.dtype == np.int32
    tokens = np.zeros(3)
    with zring.DataLoader(packed, batch_size=20, mode=2) as dl:
        for _ in range(40):
            batch = next(dl)
            src = dl.last_sources
            assert batch["tokens"].dtype == np.int32
            for k, base in enumerate((0, 1 << 22, 1 << 23)):
                rows = batch["tokens"][src == k]
                assert np.all((rows >= base) & (rows < base + (1 << 22) if k else rows < 65_536))
                tokens[k] += rows.size
    assert np.allclose(tokens / tokens.sum(), [0.6, 0.3, 0.1], atol=0.01)
    # Records of a mixture like this one are refused by a loader of records.
    with pytest.raises(ValueError, match="one dtype per stream"):
        zring.DataLoader(mix, batch_size=4)
    # Delivered as uint16, source 1's tokens do not fit: the step says which.
    with zring.DataLoader(zring.pack(mix, 64, dtype=np.uint16), batch_size=20, mode=2) as dl:
        with pytest.raises(zring.ZringError, match=r"source 1 \(.*/a\): document \d+ holds the token \d+, which the delivered uint16"):
            for _ in range(5):
                next(dl)


def test_a_long_compressed_document_is_decoded_once_per_worker_inside_a_mixture(tmp_path):
    """Regression: each worker kept one whole-read document in all, so in a
    mixture the other source's cut documents evicted a long zstd document
    between its pieces, and it was decoded again almost every step. Each
    source now keeps its own: the long document is read whole at most once
    per worker over 200 steps."""
    long_docs = [(np.arange(300_000) % 30_000).astype(np.int32)]
    zring.write_ragged(str(tmp_path / "long"), long_docs, codec="zstd")
    short = [(7 + np.arange(n)).astype(np.int32) for n in np.random.default_rng(0).integers(100, 400, 2000)]
    zring.write_ragged(str(tmp_path / "short"), short, codec="zstd")
    a, b = zring.RaggedDataset(str(tmp_path / "long")), zring.RaggedDataset(str(tmp_path / "short"))
    workers = 2
    with zring.DataLoader(zring.pack(zring.mix([a, b], [0.5, 0.5]), 128), batch_size=8, mode=0,
                          num_workers=workers) as dl:
        for _ in range(200):
            batch = next(dl)
        reads = dl.stats()["reads"]
    whole = reads["0/tokens"]["records"]
    assert 1 <= whole <= workers, reads["0/tokens"]
    assert batch["tokens"].shape == (8, 128)
