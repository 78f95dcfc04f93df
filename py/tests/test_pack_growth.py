"""Packed runs over sources that grew (``zring.ray.write(..., mode="append")``,
``zring.parts.commit`` of more parts): a state saved before the append
resumes; the cycle under way ends over the documents it began with, exactly
as a run that never stopped; the appended documents join from the next
cycle, every document once per cycle; a state saved after the growth resumes
exactly again. One packed source in modes 0, 2 and 3, and a scheduled
mixture of three packed sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zring
from zring import parts

S, B = 16, 4


def _add(root: Path, first: int, n: int, rng, base: int = 0) -> list[int]:
    """A part of ``n`` documents, document ``d``'s tokens all ``base + d``."""
    docs = [np.full(int(rng.integers(5, 60)), base + first + i, np.int32) for i in range(n)]
    parts.commit(root, [parts.write_part(root, docs, codec="zstd")])
    return [len(x) for x in docs]


def _cycles(stream: np.ndarray, lengths: list[list[int]], base: int = 0) -> None:
    """``stream`` holds whole cycles of the given documents in turn (and
    then a partial one): cycle ``c`` every document of ``lengths[c]`` once."""
    at = 0
    for lens in lengths:
        t = sum(lens)
        assert at + t <= stream.size, (at, t, stream.size)
        c = stream[at:at + t] - base
        assert c.min() >= 0 and c.max() < len(lens), (c.min(), c.max(), len(lens))
        np.testing.assert_array_equal(np.bincount(c, minlength=len(lens)), np.array(lens))
        at += t


@pytest.mark.parametrize("mode", [0, 2, 3])
def test_a_packed_run_resumes_after_an_append_and_the_new_documents_join_at_the_next_cycle(tmp_path, mode):
    rng = np.random.default_rng(mode)
    root = tmp_path / "c"
    old = _add(root, 0, 300, rng)
    kw = dict(batch_size=B, mode=mode, seed=3)
    with zring.RaggedDataset(root) as ds:
        with zring.DataLoader(zring.pack(ds, S), **kw) as dl:
            got = [next(dl)["tokens"].reshape(-1) for _ in range(20)]
            state = dl.state()
        # The run that never stopped (and never saw the append).
        with zring.DataLoader(zring.pack(ds, S), **kw) as dl:
            alone = np.concatenate([next(dl)["tokens"].reshape(-1) for _ in range(400)])
    new = old + _add(root, 300, 200, rng)
    with zring.RaggedDataset(root) as ds:
        with zring.DataLoader(zring.pack(ds, S), state=state, **kw) as dl:
            got += [next(dl)["tokens"].reshape(-1) for _ in range(500)]
            again = dl.state()
            more = [next(dl)["tokens"].reshape(-1) for _ in range(30)]
        assert [g[-1] for g in again["pack_growth"][0]] == [300, 500], again["pack_growth"]
        # A state saved after the growth resumes exactly.
        with zring.DataLoader(zring.pack(ds, S), state=again, **kw) as dl:
            np.testing.assert_array_equal(np.concatenate([next(dl)["tokens"].reshape(-1) for _ in range(30)]),
                                          np.concatenate(more))
    stream = np.concatenate(got)
    if mode == 0:
        # Sequential: the documents in order, the old ones, then all.
        t0 = sum(old)
        np.testing.assert_array_equal(stream[:t0], np.repeat(np.arange(300), old))
    else:
        _cycles(stream, [old, new])
    # The cycle under way is the one the run that never stopped made.
    np.testing.assert_array_equal(stream[:sum(old)], alone[:sum(old)])


def test_a_scheduled_mixture_of_three_packed_sources_resumes_after_appends_to_two(tmp_path):
    rng = np.random.default_rng(7)
    roots = [tmp_path / f"s{k}" for k in range(3)]
    bases = [0, 10_000, 20_000]
    old = [_add(r, 0, n, rng, base) for r, n, base in zip(roots, (200, 120, 80), bases)]
    schedule = {0: [0.6, 0.3, 0.1], 300: [0.3, 0.3, 0.4]}
    kw = dict(batch_size=8, mode=2, seed=5)

    def loader(state=None):
        srcs = [zring.RaggedDataset(r) for r in roots]
        m = zring.mix(srcs, zring.schedule(schedule))
        return srcs, zring.DataLoader(zring.pack(m, S), state=state, **kw)

    srcs, dl = loader()
    with dl:
        rows = [next(dl)["tokens"] for _ in range(25)]
        state = dl.state()
    for s in srcs:
        s.close()
    new = [old[0] + _add(roots[0], 200, 100, rng, bases[0]), old[1], old[2] + _add(roots[2], 80, 40, rng, bases[2])]
    srcs, dl = loader(state)
    with dl:
        rows += [next(dl)["tokens"] for _ in range(700)]
    for s in srcs:
        s.close()
    allrows = np.concatenate(rows)
    for k, base in enumerate(bases):
        mine = allrows[(allrows[:, 0] >= base) & (allrows[:, 0] < base + 10_000)].reshape(-1)
        _cycles(mine, [old[k], new[k]], base)


def test_first_fit_rows_resume_after_an_append(tmp_path):
    rng = np.random.default_rng(11)
    root = tmp_path / "c"
    old = _add(root, 0, 300, rng)
    kw = dict(batch_size=B, mode=2, seed=1)
    with zring.RaggedDataset(root) as ds, \
         zring.DataLoader(zring.pack(ds, S, mode="first_fit", pad_id=-1), **kw) as dl:
        got = [next(dl)["tokens"].reshape(-1) for _ in range(15)]
        state = dl.state()
    new = old + _add(root, 300, 150, rng)
    with zring.RaggedDataset(root) as ds, \
         zring.DataLoader(zring.pack(ds, S, mode="first_fit", pad_id=-1), state=state, **kw) as dl:
        got += [next(dl)["tokens"].reshape(-1) for _ in range(900)]
    stream = np.concatenate(got)
    _cycles(stream[stream >= 0], [old, new])


@pytest.mark.parametrize("mode", [2, 3])
def test_a_mixture_of_record_sources_resumes_after_one_grew(tmp_path, mode):
    """A mixture of plain (unpacked) sources: the grown source finishes its
    cycle under way over its saved records, then every record once per
    cycle; the other source is untouched; a state saved after resumes."""
    rng = np.random.default_rng(mode)
    roots = [tmp_path / "a", tmp_path / "b"]
    for k, r in enumerate(roots):
        parts.commit(r, [parts.write_part(r, (k * 10_000 + np.arange(300)).reshape(-1, 1).astype(np.int64))])
    kw = dict(batch_size=10, mode=mode, seed=2)

    def run(state=None, steps=0):
        srcs = [zring.Dataset(r) for r in roots]
        with zring.DataLoader(zring.mix([{"x": s} for s in srcs], [0.5, 0.5]), state=state, **kw) as dl:
            out = [next(dl)["x"][:, 0] for _ in range(steps)]
            st = dl.state()
        for s in srcs:
            s.close()
        return out, st

    got, state = run(steps=7)
    alone, _ = run(steps=60)
    parts.commit(roots[0], [parts.write_part(roots[0], (300 + np.arange(200)).reshape(-1, 1).astype(np.int64))])
    more, again = run(state, steps=400)
    assert again["mixture"]["growth"][0][-1][1] == 500 and again["mixture"]["lengths"] == [500, 300]
    got += more
    ids = np.concatenate(got)
    a = ids[ids < 10_000]
    np.testing.assert_array_equal(np.sort(a[:300]), np.arange(300))       # the cycle under way: saved records
    np.testing.assert_array_equal(a[:300], np.concatenate(alone)[np.concatenate(alone) < 10_000][:300])
    np.testing.assert_array_equal(np.sort(a[300:800]), np.arange(500))    # then all of them, once
    b = ids[ids >= 10_000] - 10_000
    for c in range(len(b) // 300):
        np.testing.assert_array_equal(np.sort(b[300 * c:300 * (c + 1)]), np.arange(300))
    # Resumed from the state saved after the growth: the same rows.
    tail, _ = run(again, steps=20)
    srcs = [zring.Dataset(r) for r in roots]
    with zring.DataLoader(zring.mix([{"x": s} for s in srcs], [0.5, 0.5]), state=again, **kw) as dl:
        np.testing.assert_array_equal(np.concatenate([next(dl)["x"][:, 0] for _ in range(20)]), np.concatenate(tail))
    for s in srcs:
        s.close()
