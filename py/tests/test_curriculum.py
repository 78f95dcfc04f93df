"""Curricula: the packed sequence length and the batch size as ramps of the
step. Each step has the ramps' shape; the token stream is the one a loader
of fixed shape reads (so every document is in it once per cycle); a run
killed and resumed from its state gives the same batches; segment ids and
labels hold across the joined rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import zring

SEQ = {0: 64, 30: 128, 60: 256}
BATCH = {0: 8, 20: 16, 50: 32}


def _docs(path, n=600, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(5, 400, n)
    zring.write_ragged(str(path), [np.full(int(k), i, np.int32) for i, k in enumerate(lens)], codec="zstd")
    return lens


def _loader(path, state=None, **kw):
    ds = zring.RaggedDataset(str(path))
    return ds, zring.DataLoader(zring.pack(ds, zring.ramp(SEQ), labels=True), batch_size=zring.ramp(BATCH),
                                mode=2, seed=4, state=state, **kw)


def test_each_step_has_the_ramps_shape_and_the_stream_is_the_fixed_loaders(tmp_path):
    lens = _docs(tmp_path / "t")
    ds, dl = _loader(tmp_path / "t")
    seq, batch = zring.ramp(SEQ), zring.ramp(BATCH)
    toks = []
    with ds, dl:
        assert isinstance(dl, zring.CurriculumLoader) and dl.unit == 64 and dl.tick == 8
        for t in range(80):
            b = next(dl)
            assert b["tokens"].shape == (batch(t), seq(t)) == b["labels"].shape == b["segment_ids"].shape, t
            # Labels are the next tokens, across the joined short rows too.
            np.testing.assert_array_equal(b["labels"][:, :-1], b["tokens"][:, 1:])
            # A segment is one document's consecutive positions.
            for r in range(b["tokens"].shape[0]):
                seg, tok, pos = b["segment_ids"][r], b["tokens"][r], b["positions"][r]
                assert seg[0] == 1 and np.all(np.diff(seg) >= 0) and np.all(np.diff(seg) <= 1)
                same = np.diff(seg) == 0
                assert np.all(np.diff(tok)[same] == 0) and np.all(np.diff(pos)[same] == 1), (t, r)
                assert np.all(pos[1:][~same] == 0), (t, r)  # a new segment in a row starts its document
            toks.append(b["tokens"].reshape(-1))
    stream = np.concatenate(toks)
    with zring.RaggedDataset(str(tmp_path / "t")) as ds2, \
         zring.DataLoader(zring.pack(ds2, 64, labels=True), batch_size=8, mode=2, seed=4) as ref:
        fixed = np.concatenate([next(ref)["tokens"].reshape(-1) for _ in range(stream.size // 512)])
    np.testing.assert_array_equal(stream, fixed[:stream.size])
    # Every document once per cycle.
    total = int(lens.sum())
    assert stream.size >= 2 * total
    for c in range(2):
        np.testing.assert_array_equal(np.bincount(stream[c * total:(c + 1) * total], minlength=len(lens)), lens)


CHILD = r"""
import json, sys, time
import numpy as np, zring
path, out, state = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ds = zring.RaggedDataset(path)
dl = zring.DataLoader(zring.pack(ds, zring.ramp({0: 64, 30: 128, 60: 256}), labels=True),
                      batch_size=zring.ramp({0: 8, 20: 16, 50: 32}), mode=2, seed=4, state=state)
with open(out, "a") as f:
    while True:
        b = next(dl)
        f.write(json.dumps({"step": dl.last_step, "sum": int(b["tokens"].astype(np.int64).sum()),
                            "first": int(b["tokens"][0, 0]), "shape": list(b["tokens"].shape),
                            "state": dl.state()}) + "\n")
        f.flush()
        time.sleep(0.02)  # a training step
"""


def test_a_run_killed_with_sigkill_resumes_with_the_same_batches(tmp_path):
    _docs(tmp_path / "t")
    ds, dl = _loader(tmp_path / "t")
    with ds, dl:
        want = []
        for _ in range(90):
            b = next(dl)
            want.append((int(b["tokens"].astype(np.int64).sum()), int(b["tokens"][0, 0]), list(b["tokens"].shape)))
    log = tmp_path / "log.jsonl"
    state, runs = None, 0
    while runs < 20:
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "t"), str(log), json.dumps(state)])
        time.sleep(1.5)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        runs += 1
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.endswith("}")]
        state = lines[-1]["state"] if lines else None
        if lines and lines[-1]["step"] >= 89:
            break
    assert runs > 1 and lines[-1]["step"] >= 89, (runs, lines[-1]["step"] if lines else None)
    got = {}
    for x in (json.loads(x) for x in log.read_text().splitlines() if x.endswith("}")):
        got.setdefault(x["step"], (x["sum"], x["first"], x["shape"]))
        assert got[x["step"]] == (x["sum"], x["first"], x["shape"]), x["step"]
    for step, v in got.items():
        if step < len(want):
            assert v == want[step], step


def test_seeking_megatrons_rampup_and_refusals(tmp_path):
    _docs(tmp_path / "t")
    ds, dl = _loader(tmp_path / "t")
    with ds, dl:
        batches = [next(dl)["tokens"] for _ in range(70)]
        state = dl.state()
    # Seek: any step, from any state of the run.
    state["step"] = 41
    ds, dl = _loader(tmp_path / "t", state=state)
    with ds, dl:
        np.testing.assert_array_equal(next(dl)["tokens"], batches[41])
    # Another curriculum is refused.
    with zring.RaggedDataset(str(tmp_path / "t")) as d2:
        with pytest.raises(ValueError, match="resume with the same ramps"):
            zring.DataLoader(zring.pack(d2, zring.ramp({0: 64, 31: 128})), batch_size=zring.ramp(BATCH),
                             mode=2, state=state)
        with pytest.raises(ValueError, match='needs mode="concat"'):
            zring.pack(d2, zring.ramp(SEQ), mode="first_fit", pad_id=0)
        with pytest.raises(ValueError, match="do not divide"):
            zring.DataLoader(zring.pack(d2, zring.ramp({0: 64, 10: 96})), batch_size=3, shard=(0, 2))
    # Megatron's --rampup-batch-size 8 8 1000 toward 32: +8 each 333.3 samples.
    r = zring.rampup_batch_size(8, 8, 1000, 32)
    assert [r(s) for s in (0, 41, 42, 62, 63, 10_000)] == [8, 8, 16, 16, 24, 32], r.pieces
    consumed = sum(r(s) for s in range(42))
    assert consumed >= 1000 / 3 and consumed - 8 < 1000 / 3
    with pytest.raises(ValueError, match="start at 0 and increase"):
        zring.ramp({1: 8})
