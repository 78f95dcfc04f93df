"""Train a tiny transformer LM on a packed 3-source token mixture across JAX processes, checkpoint, resume.

What it shows:

1. Three ragged token stores, "web", "code" and "math" (``zring.write_ragged``
   of documents of 20 to 300 tokens, each source with its own learnable
   structure; "web" holds uint16 tokens as a Megatron import would, the
   others int32), mixed 0.7/0.2/0.1 and packed into rows of ``seq_len``
   tokens, an EOD token added after every document:
   ``zring.pack(zring.mix(...), seq_len, labels=True, mask_boundaries=True,
   eod_id=EOD)``, delivered as int32. Each batch holds ``tokens``,
   ``segment_ids`` (1, 2, ... for the pieces of documents in a row),
   ``positions`` (each token's offset in its document), ``labels`` (each
   token's next token: a row's last label is the next row's first token, so
   every target is trained) and ``loss_mask`` (0 on each EOD, whose label
   starts another document).
2. ``jax.distributed`` joins ``--processes`` processes (CPU, on this host;
   the launcher starts them); ``zring.jax.global_loader`` gives each step
   as global ``jax.Array``s laid out over the mesh's ``data`` axis, every
   process reading only its own rows (and, the mixture's rows being
   interleaved, each process's rows hold each source's share).
3. The model is a plain-JAX decoder (token embedding plus sinusoidal
   embeddings of the ``positions``; attention causal and within a
   segment, so packed documents do not see each other; the loss is the
   cross-entropy of ``labels`` weighted by ``loss_mask``), trained with Adam
   written out.
4. Half-way, each process saves the loader state (JSON) with the model's
   parameters and optimiser state (``np.savez``) in one checkpoint
   directory; the loader is closed; a new one built from the checkpoint
   (``global_loader(..., state=...)``) continues, and its first batch is
   checked against the batch the old loader would have delivered next.
5. The loss falls; the run exits 1 if it did not or the resume differed.

Run: ``python examples/jax_lm.py [--processes 2] [--steps 200] [--quiet]``.
Needs jax (``pip install "jax[cpu]"``) and zring.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 64
EOD = VOCAB  # added by the packer after every document
SOURCES = ("web", "code", "math")
WEIGHTS = (0.7, 0.2, 0.1)
DIM, HEADS, LAYERS = 64, 4, 2


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def make_corpus(root: Path, docs: int, seed: int = 0) -> None:
    """Three ragged token stores (uint16, int32, int32) a small model can learn from: "web"
    walks up the vocabulary by 1 or 2, "code" repeats a short random motif,
    "math" counts in steps of a per-document stride."""
    import zring

    rng = np.random.default_rng(seed)
    for k, name in enumerate(SOURCES):
        out = []
        for _ in range(docs):
            n = int(rng.integers(20, 300))
            start = int(rng.integers(0, VOCAB))
            if name == "web":
                doc = start + np.cumsum(rng.choice([1, 2], size=n, p=[0.8, 0.2]))
            elif name == "code":
                motif = rng.integers(0, VOCAB, size=int(rng.integers(3, 7)))
                doc = np.resize(motif, n)
            else:
                doc = start + int(rng.integers(3, 6)) * np.arange(n)
            out.append((doc % VOCAB).astype(np.uint16 if name == "web" else np.int32))
        zring.write_ragged(root / name, out, overwrite=True)


def packed_source(root: Path, seq_len: int) -> Any:
    """The 0.7/0.2/0.1 mixture of the three stores, packed into rows with
    labels, an EOD after every document (int32, the widest source dtype)."""
    import zring

    mix = zring.mix([{"tokens": zring.RaggedDataset(root / name)} for name in SOURCES], WEIGHTS)
    return zring.pack(mix, seq_len, labels=True, mask_boundaries=True, eod_id=EOD)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def init_params(key: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(key, 2 + 4 * LAYERS))
    normal = lambda shape, scale: jax.random.normal(next(keys), shape) * scale  # noqa: E731
    params: dict[str, Any] = {"embed": normal((VOCAB + 1, DIM), 1.0), "unembed": normal((DIM, VOCAB + 1), DIM ** -0.5),
                              "out_norm": jnp.ones(DIM)}
    for i in range(LAYERS):
        params[f"l{i}"] = {
            "norm1": jnp.ones(DIM), "norm2": jnp.ones(DIM),
            "qkv": normal((DIM, 3 * DIM), DIM ** -0.5), "proj": normal((DIM, DIM), DIM ** -0.5 / LAYERS),
            "up": normal((DIM, 4 * DIM), DIM ** -0.5), "down": normal((4 * DIM, DIM), (4 * DIM) ** -0.5 / LAYERS),
        }
    return params


def _norm(x: Any, scale: Any) -> Any:
    import jax.numpy as jnp

    return x * scale / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _sinusoid(positions: Any) -> Any:
    """Embeddings of each token's offset in its document: they go on across
    rows (concat packing), so a table of seq_len rows would not do."""
    import jax.numpy as jnp

    freqs = jnp.exp(-jnp.log(10_000.0) * jnp.arange(0, DIM, 2) / DIM)
    angles = positions[..., None].astype(jnp.float32) * freqs
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def logits_fn(params: dict[str, Any], tokens: Any, segments: Any, positions: Any) -> Any:
    import jax
    import jax.numpy as jnp

    b, n = tokens.shape
    x = params["embed"][tokens] + 0.1 * _sinusoid(positions)
    # Causal, and only within the token's own segment (packed documents
    # must not see each other; padding, segment 0, sees nothing real).
    causal = jnp.tril(jnp.ones((n, n), bool))
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
    mask = (causal[None] & same)[:, None]
    for i in range(LAYERS):
        p = params[f"l{i}"]
        q, k, v = jnp.split(_norm(x, p["norm1"]) @ p["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(b, n, HEADS, DIM // HEADS).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(DIM // HEADS), -1e9)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, n, DIM)
        x = x + y @ p["proj"]
        x = x + jax.nn.gelu(_norm(x, p["norm2"]) @ p["up"]) @ p["down"]
    return _norm(x, params["out_norm"]) @ params["unembed"]


def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> Any:
    """Mean cross-entropy of the packer's labels where its loss_mask is 1:
    every token of a row predicts its label, the last one too (its label is
    the next row's first token); an EOD's label (another document) is
    masked."""
    import jax
    import jax.numpy as jnp

    logits = logits_fn(params, batch["tokens"], batch["segment_ids"], batch["positions"])
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)[..., 0]
    mask = batch["loss_mask"].astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1)


def make_train_step() -> Any:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def train_step(params: Any, opt: Any, batch: dict[str, Any], lr: float = 3e-3) -> tuple[Any, Any, Any]:
        """One Adam step, written out: m and v are the moment estimates, t the step count."""
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        b1, b2, eps = 0.9, 0.99, 1e-8
        t = opt["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, {"m": m, "v": v, "t": t}, loss

    return train_step


# --------------------------------------------------------------------------
# Checkpoints: the model's arrays and the loader state, in one directory
# --------------------------------------------------------------------------


def _local(x: Any) -> np.ndarray:
    """A replicated array's value, from this process's first device."""
    return np.asarray(x.addressable_shards[0].data)


def save_checkpoint(path: Path, params: Any, opt: Any, loader_state: dict[str, Any]) -> None:
    """Every process holds the same replicated model and the same loader
    state; process 0 writes them (files renamed into place)."""
    import jax

    if jax.process_index() != 0:
        return
    path.mkdir(parents=True, exist_ok=True)
    leaves, _ = jax.tree.flatten({"params": params, "opt": opt})
    np.savez(path / "model.tmp.npz", *[_local(x) for x in leaves])
    (path / "loader.tmp.json").write_text(json.dumps(loader_state))
    os.replace(path / "model.tmp.npz", path / "model.npz")
    os.replace(path / "loader.tmp.json", path / "loader.json")


def load_checkpoint(path: Path, like: Any, sharding: Any) -> tuple[Any, Any, dict[str, Any]]:
    import jax

    leaves, tree = jax.tree.flatten({"params": like[0], "opt": like[1]})
    with np.load(path / "model.npz") as z:
        arrays = [jax.device_put(z[f"arr_{i}"], sharding) for i in range(len(leaves))]
    restored = jax.tree.unflatten(tree, arrays)
    return restored["params"], restored["opt"], json.loads((path / "loader.json").read_text())


# --------------------------------------------------------------------------
# One process of the run
# --------------------------------------------------------------------------


def train(workdir: Path, steps: int, batch_size: int, seq_len: int, log: Any = print) -> dict[str, Any]:
    """This process's part of the run (jax.distributed already initialised
    when there are several): ``steps`` steps, checkpoint and resume half-way."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import zring.jax as zjax

    packed = packed_source(workdir / "data", seq_len)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    train_step = make_train_step()
    params = jax.device_put(init_params(jax.random.key(0)), replicated)
    opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
           "t": jax.device_put(jnp.asarray(0), replicated)}
    losses: list[float] = []
    half = steps // 2
    t0 = time.perf_counter()

    # Phase 1: steps [0, half).
    loader = zjax.global_loader(packed, batch_size, rows, mode=2, seed=0, num_workers=2)
    for _ in range(half):
        params, opt, loss = train_step(params, opt, next(loader))
        losses.append(float(_local(loss)))
    ckpt = workdir / "ckpt"
    state = loader.state()
    save_checkpoint(ckpt, params, opt, state)
    expected = {k: [np.asarray(s.data) for s in v.addressable_shards] for k, v in next(loader).items()}
    loader.close()
    log(f"process {jax.process_index()}: step {half}, loss {np.mean(losses[-5:]):.4f}; "
        f"checkpoint at step {state['step']}")

    # Every process reads the checkpoint process 0 wrote.
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("checkpoint written")

    # Phase 2: a new loader from the checkpoint, steps [half, steps).
    params, opt, state = load_checkpoint(ckpt, (params, opt), replicated)
    loader = zjax.global_loader(packed, batch_size, rows, state=state, num_workers=2)
    resumed_exactly = None
    for k in range(half, steps):
        batch = next(loader)
        if resumed_exactly is None:
            got = {name: [np.asarray(s.data) for s in v.addressable_shards] for name, v in batch.items()}
            resumed_exactly = all(np.array_equal(a, b) for name in expected for a, b in zip(got[name], expected[name]))
        params, opt, loss = train_step(params, opt, batch)
        losses.append(float(_local(loss)))
    loader.close()
    window = max(1, min(10, steps // 4))
    first, last = float(np.mean(losses[:window])), float(np.mean(losses[-window:]))
    log(f"process {jax.process_index()}: loss first {window} steps {first:.4f} -> last {window} {last:.4f} "
        f"({steps} steps, resumed at {half}{'' if resumed_exactly else ' NOT EXACTLY'}, "
        f"{time.perf_counter() - t0:.1f} s)")
    return {"process": jax.process_index(), "losses": losses, "first_loss": first, "last_loss": last,
            "resumed_at": half, "resumed_exactly": bool(resumed_exactly), "checkpoint": state}


def _worker(args: argparse.Namespace) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.worker, initialization_timeout=120)
    result = train(Path(args.workdir), args.steps, args.batch_size, args.seq_len,
                   log=(lambda *a: None) if args.quiet else print)
    (Path(args.workdir) / f"report-{args.worker}.json").write_text(json.dumps(result))
    jax.distributed.shutdown()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(processes: int = 2, steps: int = 200, batch_size: int = 16, seq_len: int = 64, docs: int = 2000,
        workdir: Path | None = None, quiet: bool = False, timeout: float = 600) -> list[dict[str, Any]]:
    """Writes the corpus and runs ``processes`` JAX processes of one job
    (each with one CPU device); returns each process's report."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        make_corpus(root / "data", docs)
        port = _free_port()
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        cmd = [sys.executable, __file__, "--processes", str(processes), "--steps", str(steps),
               "--batch-size", str(batch_size), "--seq-len", str(seq_len), "--workdir", str(root),
               "--port", str(port)] + (["--quiet"] if quiet else [])
        procs = [subprocess.Popen(cmd + ["--worker", str(i)], env=env) for i in range(processes)]
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes):
            raise RuntimeError(f"worker exit codes {codes}")
        return [json.loads((root / f"report-{i}.json").read_text()) for i in range(processes)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16, help="global rows per step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--docs", type=int, default=2000, help="documents per source")
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2")
    if args.batch_size % args.processes:
        parser.error("--batch-size must be a multiple of --processes")
    if args.worker is not None:
        return _worker(args)
    reports = run(args.processes, args.steps, args.batch_size, args.seq_len, args.docs,
                  Path(args.workdir) if args.workdir else None, args.quiet)
    fell = all(r["last_loss"] < r["first_loss"] for r in reports)
    exact = all(r["resumed_exactly"] for r in reports)
    r = reports[0]
    ok = fell and exact
    print(f"{'ok' if ok else 'FAILED'}: loss {r['first_loss']:.4f} -> {r['last_loss']:.4f} over {args.processes} "
          f"processes, resumed at step {r['resumed_at']} {'exactly' if exact else 'WITH OTHER BATCHES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
