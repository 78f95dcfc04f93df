"""A PyTorch training loop fed by zring, two ways.

What it shows:

1. ``zring.write_dataset`` stores a synthetic regression set (features
   float32 (16,), targets float32).
2. The zring ``DataLoader`` reads ahead in Rust threads; each batch's numpy
   arrays become tensors with ``torch.from_numpy`` (no copy) and train a
   linear model with SGD. The loss falls; the script exits 1 if it did not.
3. ``zring.adapters.TorchDataset`` hands the same stores to torch's own
   ``DataLoader``, whose batched ``__getitems__`` reads each batch in one
   store read, and the default collate stacks it into tensors.

Run: ``python examples/torch_loop.py [--steps 200]``. Needs torch
(``pip install torch``); without it the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import zring
import zring.adapters

try:
    import torch
except ImportError:
    torch = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if torch is None:
        print("torch is not installed: pip install torch to run this example")
        return 0

    rng = np.random.default_rng(0)
    true_w = rng.normal(size=16).astype(np.float32)
    x = rng.normal(size=(8192, 16)).astype(np.float32)
    y = (x @ true_w + 0.01 * rng.normal(size=8192)).astype(np.float32)

    with tempfile.TemporaryDirectory(prefix="zring-torch-") as tmp:
        root = Path(tmp)
        zring.write_dataset(root / "x.zr", x, codec="raw")
        zring.write_dataset(root / "y.zr", y, codec="raw")

        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        streams = {"x": zring.Dataset(root / "x.zr"), "y": zring.Dataset(root / "y.zr")}
        losses = []
        with zring.DataLoader(streams, batch_size=128, mode=2, seed=1, num_workers=2) as loader:
            for _, batch in zip(range(args.steps), loader):
                xb, yb = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
                loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        first, last = np.mean(losses[:10]), np.mean(losses[-10:])
        print(f"zring DataLoader -> torch: loss {first:.3f} -> {last:.4f} over {args.steps} steps")
        if not last < first / 10:
            print("the loss did not fall", file=sys.stderr)
            return 1

        ds = zring.adapters.TorchDataset({"x": root / "x.zr", "y": root / "y.zr"})
        tl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=0)
        batch = next(iter(tl))
        print(f"torch DataLoader over zring.adapters.TorchDataset: x {tuple(batch['x'].shape)} "
              f"{batch['x'].dtype}, y {tuple(batch['y'].shape)}")
        ds.close()
        if tuple(batch["x"].shape) != (256, 16):
            print("unexpected batch shape from the adapter", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
