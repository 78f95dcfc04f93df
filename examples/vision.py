"""Images stored encoded, decoded on the loader's transform threads.

What it shows:

1. ``zring.write_ragged`` stores each image in its encoded form, one uint8
   record per image (here zlib-compressed pixels stand in for JPEG or PNG:
   the standard library has no image codec), and ``zring.write_dataset``
   stores the labels.
2. A ``zring.DataLoader`` gathers the encoded bytes of each batch and hands
   them to ``transform=``, which decodes, flips half the images at random and
   scales them to float32 on ``transform_workers`` threads, several steps at
   once, while batches still come out in step order. ``zlib.decompress``
   releases the GIL, as OpenCV's and Pillow's decoders do, so the threads
   decode in parallel.
3. Every decoded image is checked against the picture it was made from.

Run: ``python examples/vision.py [--images 2000] [--steps 20]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

import zring

SIDE = 32


def picture(i: int) -> np.ndarray:
    """Image ``i``: a gradient whose slope depends on its label (i % 10)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    label = i % 10
    img = np.stack([(x * (label + 1) + i) % 256, (y * 7 + i) % 256, (x + y + label * 20) % 256], axis=-1)
    return img.astype(np.uint8)


def decode(batch: dict) -> dict:
    """The transform: encoded bytes in, a float32 (B, 32, 32, 3) batch out."""
    values, row_splits = batch["image"]
    images = np.stack([
        np.frombuffer(zlib.decompress(values[a:b].tobytes()), np.uint8).reshape(SIDE, SIDE, 3)
        for a, b in zip(row_splits[:-1], row_splits[1:])
    ])
    # A per-batch generator keyed by the batch's content: the transform may run
    # on several threads at once, so it keeps no state between calls.
    rng = np.random.default_rng(int(batch["label"].sum()))
    flip = rng.random(len(images)) < 0.5
    images[flip] = images[flip, :, ::-1]
    return {"image": images.astype(np.float32) / 255.0, "label": batch["label"], "flipped": flip}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="zring-vision-") as tmp:
        root = Path(tmp)
        encoded = (np.frombuffer(zlib.compress(picture(i).tobytes(), 6), np.uint8) for i in range(args.images))
        zring.write_ragged(root / "images.zr", encoded, dtype=np.uint8, codec="raw")  # already compressed
        zring.write_dataset(root / "labels.zr", np.arange(args.images, dtype=np.int64) % 10, codec="raw")

        streams = {"image": zring.RaggedDataset(root / "images.zr"), "label": zring.Dataset(root / "labels.zr")}
        with zring.DataLoader(streams, batch_size=64, mode=2, seed=0, transform=decode,
                              num_workers=2, transform_workers=2) as loader:
            for _ in range(args.steps):
                batch = next(loader)
                for row, i in enumerate(loader.last_indices):
                    want = picture(int(i))
                    if batch["flipped"][row]:
                        want = want[:, ::-1]
                    if not np.array_equal((batch["image"][row] * 255).round().astype(np.uint8), want):
                        print(f"image {i} decoded wrong", file=sys.stderr)
                        return 1
                    if batch["label"][row] != i % 10:
                        print(f"label of image {i} wrong", file=sys.stderr)
                        return 1
        print(f"{args.steps} batches of 64 decoded images {batch['image'].shape}, "
              f"{int(batch['flipped'].sum())} of the last batch flipped; every image checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
