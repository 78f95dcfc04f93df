"""Train a small MLP with plain JAX from a zring DataLoader, checkpoint mid-run, resume.

What it shows:

1. ``zring.write_dataset`` stores a synthetic classification set (features
   float32 (32,), labels int32) in a temporary directory.
2. A ``zring.DataLoader`` feeds the training loop through
   ``zring.jax.device_prefetch``, which keeps batches on the device ahead
   of the step.
3. Half-way, the loader state (JSON) and the parameters and optimiser state
   (``np.savez``) are saved; the loader is closed; a fresh loader built
   from the checkpoint (``zring.jax.restore_loader``) continues. The first
   batch after the resume is checked against the batch the old loader
   would have delivered next.
4. The loss falls; the script exits 1 if it did not.

Run: ``python examples/jax_train.py [--steps 300] [--quiet]``. Needs jax
(``pip install "jax[cpu]"``) and zring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import zring  # noqa: E402
import zring.jax as zjax  # noqa: E402

FEATURES = 32
CLASSES = 4
HIDDEN = 64


def make_data(root: Path, n: int, seed: int = 0) -> dict[str, zring.Dataset]:
    """A noisy classification task an MLP can learn: the class is the argmax of a random 2-layer net."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    w1 = rng.standard_normal((FEATURES, 16)).astype(np.float32) / np.sqrt(FEATURES)
    w2 = rng.standard_normal((16, CLASSES)).astype(np.float32)
    logits = np.tanh(x @ w1) @ w2 + 0.1 * rng.standard_normal((n, CLASSES)).astype(np.float32)
    y = logits.argmax(axis=1).astype(np.int32)
    zring.write_dataset(root / "x", x)
    zring.write_dataset(root / "y", y)
    return {"x": zring.Dataset(root / "x"), "y": zring.Dataset(root / "y")}


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * np.sqrt(2.0 / FEATURES),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * np.sqrt(1.0 / HIDDEN),
        "b2": jnp.zeros(CLASSES),
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@jax.jit
def train_step(params: Any, opt: Any, batch: dict[str, jax.Array], lr: float = 3e-3) -> tuple[Any, Any, jax.Array]:
    """One Adam step, written out: m and v are the moment estimates, t the step count."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch["x"], batch["y"])
    b1, b2, eps = 0.9, 0.999, 1e-8
    t = opt["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
    scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, {"m": m, "v": v, "t": t}, loss


def save_checkpoint(path: Path, params: Any, opt: Any, loader_state: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "loader.json").write_text(json.dumps(loader_state))
    flat = {f"p_{k}": np.asarray(v) for k, v in params.items()}
    flat.update({f"m_{k}": np.asarray(v) for k, v in opt["m"].items()})
    flat.update({f"v_{k}": np.asarray(v) for k, v in opt["v"].items()})
    np.savez(path / "params.npz", t=np.asarray(opt["t"]), **flat)


def load_checkpoint(path: Path) -> tuple[Any, Any, dict[str, Any]]:
    state = json.loads((path / "loader.json").read_text())
    with np.load(path / "params.npz") as z:
        params = {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith("p_")}
        opt = {
            "m": {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith("m_")},
            "v": {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith("v_")},
            "t": jnp.asarray(z["t"]),
        }
    return params, opt, state


def run(steps: int = 300, batch_size: int = 128, samples: int = 20_000, workdir: Path | None = None,
        log: Any = print) -> dict[str, Any]:
    """Train for ``steps`` steps with a checkpoint/resume half-way; returns the losses."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        t0 = time.perf_counter()
        streams = make_data(root / "data", samples)
        log(f"wrote {samples} samples to {root / 'data'} in {time.perf_counter() - t0:.2f}s")

        params = init_params(jax.random.key(0))
        opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
               "t": jnp.asarray(0)}
        losses: list[jax.Array] = []
        half = steps // 2

        # Phase 1: steps [0, half).
        loader = zring.DataLoader(streams, batch_size=batch_size, num_workers=2, mode=2, seed=0)
        batches = zjax.device_prefetch(loader, size=2)
        for _ in range(half):
            params, opt, loss = train_step(params, opt, next(batches))
            losses.append(loss)
        ckpt = root / "ckpt"
        save_checkpoint(ckpt, params, opt, batches.state())
        expected_next = jax.tree.map(np.asarray, next(batches))
        batches.close()
        log(f"step {half}: loss {float(np.mean(losses[-10:])):.4f}; checkpoint {json.dumps(json.loads((ckpt / 'loader.json').read_text()))}")

        # Phase 2: a fresh loader from the checkpoint, steps [half, steps).
        params, opt, state = load_checkpoint(ckpt)
        loader = zjax.restore_loader(streams, state, num_workers=2)
        batches = zjax.device_prefetch(loader, size=2)
        first = True
        for _ in range(half, steps):
            batch = next(batches)
            if first:
                got = jax.tree.map(np.asarray, batch)
                if not all(np.array_equal(got[k], expected_next[k]) for k in got):
                    raise AssertionError("the resumed loader did not continue with the next batch")
                first = False
            params, opt, loss = train_step(params, opt, batch)
            losses.append(loss)
        batches.close()

        values = np.asarray(jax.device_get(losses), dtype=np.float64)
        window = max(1, min(10, steps // 4))
        first_loss, last_loss = float(values[:window].mean()), float(values[-window:].mean())
        for k in range(0, steps, max(1, steps // 6)):
            log(f"step {k:4d}  loss {values[k]:.4f}")
        log(f"loss: first {window} steps {first_loss:.4f} -> last {window} steps {last_loss:.4f} "
            f"({steps} steps, resumed at {half}, {time.perf_counter() - t0:.2f}s)")
        for ds in streams.values():
            ds.close()
        return {"losses": values, "first_loss": first_loss, "last_loss": last_loss, "resumed_at": half}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2")
    result = run(args.steps, args.batch_size, args.samples, log=(lambda *a: None) if args.quiet else print)
    fell = result["last_loss"] < result["first_loss"]
    print(f"{'ok' if fell else 'FAILED'}: loss {result['first_loss']:.4f} -> {result['last_loss']:.4f}")
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
