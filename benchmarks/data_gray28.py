"""Make the read-out benchmark's 28x28 grayscale data sets from a CIFAR-10 class-folder tree.

* ``OUT``: the 60,000 CIFAR-10 images converted to grayscale (PIL's ``L``: ITU-R 601 luma) and
  resized to 28x28 (bilinear), written as MNIST idx files (``train-*`` 50,000, ``t10k-*``
  10,000, in a fixed shuffled order): a 60,000-image 28x28 grayscale set in the format users
  of MNIST-like data have, that nothing in contrastkit was tuned on.
* ``OUT_HARD``: the same images with every label drawn at random (10 classes, seed 0): the
  hard case, whose features no linear model separates, so weakly regularised probe fits run
  as long as their stopping rules let them.

    python benchmarks/data_gray28.py CIFAR10_DIR OUT OUT_HARD
"""

import os
import struct
import sys

import numpy as np
from PIL import Image


def read(root: str, split: str, classes: list) -> tuple:
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, split, name)
        for file in sorted(os.listdir(folder)):
            with Image.open(os.path.join(folder, file)) as image:
                gray = image.convert("L").resize((28, 28), Image.BILINEAR)
            images.append(np.asarray(gray, dtype=np.uint8))
            labels.append(label)
    return np.stack(images), np.array(labels, dtype=np.uint8)


def write(folder: str, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{prefix}-images-idx3-ubyte"), "wb") as handle:
        handle.write(struct.pack(">IIII", 2051, len(images), 28, 28))
        handle.write(images.tobytes())
    with open(os.path.join(folder, f"{prefix}-labels-idx1-ubyte"), "wb") as handle:
        handle.write(struct.pack(">II", 2049, len(labels)))
        handle.write(labels.tobytes())


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    source, out, out_hard = sys.argv[1:]
    classes = sorted(os.listdir(os.path.join(source, "train")))
    rng = np.random.default_rng(0)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = read(source, split, classes)
        order = rng.permutation(len(images))  # MNIST's files are not sorted by class either
        images, labels = images[order], labels[order]
        write(out, prefix, images, labels)
        write(out_hard, prefix, images, rng.integers(0, 10, len(labels)).astype(np.uint8))


if __name__ == "__main__":
    main()
