"""Writers of small data fixtures in real file formats (idx, CIFAR pickles, PNG), for the data tests."""

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np


def unique_images(n, c, h, w, seed):
    """uint8 images whose first pixel encodes the index, so samples can be traced through splits."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, c, h, w), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(n) % 256
    x[:, 0, 0, 1] = np.arange(n) // 256
    return x


def ids_of(images):
    """Recover the index encoded by unique_images from float images."""
    px = (images[:, 0, 0, :2] * 255).round().long()
    return (px[:, 0] + 256 * px[:, 1]).tolist()


def write_idx(path, array, gz=False):
    array = np.asarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    data = header + array.tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        Path(path).write_bytes(data)


def write_mnist(folder, n_train=40, n_test=20, gz=False, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xtr = unique_images(n_train, 1, 28, 28, seed)[:, 0]
    xte = unique_images(n_test, 1, 28, 28, seed + 1)[:, 0]
    ytr, yte = np.arange(n_train) % 10, rng.integers(0, 10, n_test)
    write_idx(folder / "train-images-idx3-ubyte", xtr, gz)
    write_idx(folder / "train-labels-idx1-ubyte", ytr, gz)
    write_idx(folder / "t10k-images-idx3-ubyte", xte, gz)
    write_idx(folder / "t10k-labels-idx1-ubyte", yte, gz)
    return xtr, ytr, xte, yte


def write_cifar(folder, per_batch=6, n_test=8, meta=True):
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for b in range(1, 6):
        x = unique_images(per_batch, 3, 32, 32, b)
        x[:, 0, 0, 0] = np.arange(per_batch) + per_batch * (b - 1)  # unique over all batches
        y = [(i + b) % 10 for i in range(per_batch)]
        with open(folder / f"data_batch_{b}", "wb") as f:
            pickle.dump({b"batch_label": b"x", b"data": x.reshape(per_batch, -1), b"labels": y}, f, protocol=2)
        xs.append(x)
        ys.extend(y)
    xte = unique_images(n_test, 3, 32, 32, 99)
    yte = [i % 10 for i in range(n_test)]
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": xte.reshape(n_test, -1), b"labels": yte}, f, protocol=2)
    if meta:
        names = [f"class{i}".encode() for i in range(10)]
        with open(folder / "batches.meta", "wb") as f:
            pickle.dump({b"label_names": names, b"num_cases_per_batch": per_batch}, f, protocol=2)
    return np.concatenate(xs), np.array(ys), xte, np.array(yte)


def write_image_folder(root, classes=("cat", "dog", "eel"), per_class=10, mode="L", sizes=((12, 10),)):
    from PIL import Image

    rng = np.random.default_rng(0)
    written = {}
    for ci, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = sizes[i % len(sizes)]
            shape = (h, w) if mode == "L" else (h, w, 3)
            arr = rng.integers(0, 256, size=shape, dtype=np.uint8)
            path = root / name / f"img_{i:03d}.png"
            Image.fromarray(arr, mode=mode).save(path)
            written[path] = (arr, ci)
    return written


# ------------------------------------------------------------------------------ CIFAR-10 (when present)

#: The CIFAR-10 JPEG tarball (``shared/data`` beside or above the checkout, or
#: ``$CONTRASTKIT_CIFAR10_TARBALL``); "" when absent, and the tests that need it skip.
CIFAR_TARBALL = next((str(path) for path in (
    [os.environ.get("CONTRASTKIT_CIFAR10_TARBALL", "")]
    + [base / "shared" / "data" / "cifar10-jpeg.tar.gz" for base in Path(__file__).resolve().parents[:4]])
    if str(path) and os.path.isfile(path)), "")


def cifar_subset(folder, per_class):
    """``per_class`` JPEGs of each class of the tarball's ``test/`` part (it comes first, so the
    scan stops there) as a class-folder tree in ``folder``, which the loader splits three ways."""
    import tarfile

    counts = {}
    with tarfile.open(CIFAR_TARBALL, "r:gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if parts[0] != "test":
                if counts:
                    break
                continue
            if not member.isfile() or len(parts) != 3 or counts.get(parts[1], 0) >= per_class:
                continue
            counts[parts[1]] = counts.get(parts[1], 0) + 1
            target = folder / parts[1] / parts[2]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.extractfile(member).read())
    assert len(counts) == 10, f"expected the 10 CIFAR-10 classes in the tarball's test/ part, found {sorted(counts)}"
    return folder


# ------------------------------------------------------------------------------ unlabeled collections

def write_collection(root, count=48, damaged=("zero.jpg", "fake.png")):
    """A folder of ``count`` RGB images without class structure (every fifth in ``nested/``, JPEG
    and PNG in turn, 24 x 28..32 pixels, three colour groups by ``i % 3``) and the ``damaged``
    files beside them: zero bytes when the name starts with ``zero``, else text under an image
    extension. Returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        array = (rng.random((24, 28 + i % 5, 3)) * 60).astype(np.uint8)
        array[:, : array.shape[1] // 2] = (200 * (i % 3 == 0), 200 * (i % 3 == 1), 200 * (i % 3 == 2))
        folder = root / "nested" if i % 5 == 0 else root
        folder.mkdir(exist_ok=True)
        Image.fromarray(array).save(folder / f"p{i:03d}.{'jpg' if i % 2 else 'png'}")
    for name in damaged:
        if name.startswith("zero"):
            (root / name).write_bytes(b"")
        else:
            (root / name).write_text("text, not pixels")
    return root
