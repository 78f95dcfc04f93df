"""examples/jax_lm.py: a tiny transformer LM trained on a packed 3-source
mixture by two JAX processes, checkpointed with its loader state half-way
and resumed, in a small configuration."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("jax_lm", ROOT / "examples" / "jax_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_two_processes_train_on_a_packed_mixture_and_resume_exactly(tmp_path):
    mod = _example()
    reports = mod.run(processes=2, steps=24, batch_size=16, seq_len=32, docs=150, workdir=tmp_path, quiet=True)
    assert [r["process"] for r in reports] == [0, 1]
    for r in reports:
        assert len(r["losses"]) == 24
        assert r["resumed_exactly"], "the resumed loader must continue with the next batch"
        assert r["last_loss"] < r["first_loss"]
    # Both processes saw the same global loss and saved the same state.
    assert reports[0]["losses"] == pytest.approx(reports[1]["losses"])
    assert reports[0]["checkpoint"] == reports[1]["checkpoint"]
    assert reports[0]["checkpoint"]["step"] == 12
    assert (tmp_path / "ckpt" / "loader.json").is_file() and (tmp_path / "ckpt" / "model.npz").is_file()
