"""Loaders on small fixtures written here: digits, npz, MNIST idx, CIFAR-10 batches, image folders,
and one clear error for each kind of bad data."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _data_fixtures import ids_of, unique_images, write_cifar, write_idx, write_image_folder, write_mnist
from contrastkit.data import load_dataset
from contrastkit.data.base import stratified_split

# ---------------------------------------------------------------------------------------
# digits


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_digits_shapes_split_and_alignment():
    from sklearn.datasets import load_digits

    ds = load_dataset("digits")
    assert ds.name == "digits" and ds.num_classes == 10 and ds.image_shape == (1, 32, 32)
    sizes = [len(s) for _, s in ds.splits()]
    assert sum(sizes) == 1797
    ref = load_digits()
    counts = np.bincount(ref.target, minlength=10)
    for (name, split), frac in zip(ds.splits(), (0.60, 0.15, 0.25)):
        assert split.realisations is None and split.groups is None
        assert split.images.dtype == torch.float32
        assert float(split.images.min()) >= 0 and float(split.images.max()) <= 1
        per_class = torch.bincount(split.labels, minlength=10).numpy()
        assert np.all(np.abs(per_class - frac * counts) <= 1.0), name  # stratified
    # Every test image, shrunk back to 8x8, is nearest to an original digit of the same label.
    originals = torch.from_numpy(ref.images.reshape(-1, 64) / 16.0).float()
    small = F.avg_pool2d(ds.test.images, 4).reshape(-1, 64)
    nearest = torch.cdist(small, originals).argmin(dim=1)
    assert (torch.from_numpy(ref.target)[nearest] == ds.test.labels).float().mean() >= 0.99
    again = load_dataset("digits", seed=5)  # the split does not follow the training seed
    assert torch.equal(again.test.images, ds.test.images)
    other = load_dataset("digits", split_seed=1)
    assert not torch.equal(other.test.labels, ds.test.labels)


def test_digits_size_option():
    ds = load_dataset("digits", size=16)
    assert ds.image_shape == (1, 16, 16)


# ---------------------------------------------------------------------------------------
# stratified split helper


def test_stratified_split_partitions_and_keeps_proportions():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    parts = stratified_split(labels, [0.7, 0.1, 0.2], seed=3)
    together = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(together, np.arange(100))
    assert [len(p) for p in parts] == [70, 10, 20]
    assert np.bincount(labels[parts[2]]).tolist() == [10, 6, 4]
    again = stratified_split(labels, [0.7, 0.1, 0.2], seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="sum to 1"):
        stratified_split(labels, [0.5, 0.1], seed=0)


# ---------------------------------------------------------------------------------------
# npz


@pytest.mark.parametrize("layout", ["NHW", "NHWC", "NCHW"])
def test_npz_layouts_give_the_same_tensors(tmp_path, layout):
    x = unique_images(50, 1, 9, 7, 0)  # NCHW
    xt = unique_images(10, 1, 9, 7, 1)
    y, yt = np.arange(50) % 5, np.arange(10) % 5
    conv = {"NHW": lambda a: a[:, 0], "NHWC": lambda a: a.transpose(0, 2, 3, 1), "NCHW": lambda a: a}[layout]
    np.savez(tmp_path / "d.npz", x_train=conv(x), y_train=y, x_test=conv(xt), y_test=yt)
    ds = load_dataset(tmp_path / "d.npz", val_fraction=0.2)
    assert ds.name == "d" and ds.image_shape == (1, 9, 7) and ds.num_classes == 5
    assert torch.equal(ds.test.images, torch.from_numpy(xt).float() / 255)
    assert ds.test.labels.tolist() == yt.tolist()
    # train and val partition the stored training set, labels stay with their images.
    ids = ids_of(ds.train.images) + ids_of(ds.val.images)
    assert sorted(ids) == list(range(50))
    assert len(ds.val) == 10 and torch.bincount(ds.val.labels).tolist() == [2] * 5
    for split in (ds.train, ds.val):
        for i, label in zip(ids_of(split.images), split.labels.tolist()):
            assert y[i] == label


def test_npz_rgb_float_and_explicit_val(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((12, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / "rgb.npz", x_train=x, y_train=np.arange(12) % 3, x_test=x[:4], y_test=np.arange(4) % 3,
             x_val=x[4:7], y_val=np.array([0, 1, 2]))
    ds = load_dataset(str(tmp_path / "rgb.npz"), size=16)
    assert ds.image_shape == (3, 16, 16) and [len(s) for _, s in ds.splits()] == [12, 3, 4]
    assert ds.val.labels.tolist() == [0, 1, 2]
    assert ds.source == "npz"


# ---------------------------------------------------------------------------------------
# MNIST idx


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx(tmp_path, gz):
    xtr, ytr, xte, yte = write_mnist(tmp_path / "mnist", gz=gz)
    ds = load_dataset(tmp_path / "mnist")
    assert ds.source == "mnist" and ds.image_shape == (1, 28, 28) and ds.num_classes == 10
    assert [len(s) for _, s in ds.splits()] == [36, 4, 20]
    assert torch.equal(ds.test.images[:, 0], torch.from_numpy(xte).float() / 255)
    assert ds.test.labels.tolist() == yte.tolist()
    assert sorted(ids_of(ds.train.images) + ids_of(ds.val.images)) == list(range(40))
    for i, label in zip(ids_of(ds.val.images), ds.val.labels.tolist()):
        assert ytr[i] == label


def test_mnist_resize(tmp_path):
    write_mnist(tmp_path)
    assert load_dataset(tmp_path, size=32).image_shape == (1, 32, 32)


# ---------------------------------------------------------------------------------------
# CIFAR-10


@pytest.mark.parametrize("nested", [False, True])
def test_cifar_batches(tmp_path, nested):
    folder = tmp_path / "cifar-10-batches-py" if nested else tmp_path / "c"
    xtr, ytr, xte, yte = write_cifar(folder)
    ds = load_dataset(tmp_path if nested else folder, val_fraction=0.2)
    assert ds.source == "cifar10" and ds.image_shape == (3, 32, 32)
    assert ds.class_names == [f"class{i}" for i in range(10)]
    assert torch.equal(ds.test.images, torch.from_numpy(xte).float() / 255)
    assert ds.test.labels.tolist() == yte.tolist()
    # Channel order: the stored row is R plane, G plane, B plane.
    ids = sorted(ids_of(ds.train.images) + ids_of(ds.val.images))
    assert ids == list(range(30))
    for split in (ds.train, ds.val):
        for img, i, label in zip(split.images, ids_of(split.images), split.labels.tolist()):
            assert torch.equal(img, torch.from_numpy(xtr[i]).float() / 255) and ytr[i] == label


def test_cifar_without_meta_uses_cifar10_names(tmp_path):
    write_cifar(tmp_path, meta=False)
    assert load_dataset(tmp_path).class_names[0] == "airplane"


# ---------------------------------------------------------------------------------------
# image folders


def test_image_folder_gray(tmp_path):
    written = write_image_folder(tmp_path / "imgs")
    ds = load_dataset(tmp_path / "imgs")
    assert ds.name == "imgs" and ds.class_names == ["cat", "dog", "eel"] and ds.image_shape == (1, 12, 10)
    assert [len(s) for _, s in ds.splits()] == [21, 3, 6]
    stored = {arr.tobytes(): ci for arr, ci in written.values()}
    seen = 0
    for _, split in ds.splits():
        for img, label in zip(split.images, split.labels.tolist()):
            key = (img[0] * 255).round().to(torch.uint8).numpy().tobytes()
            assert stored[key] == label
            seen += 1
    assert seen == 30


def test_image_folder_rgb_mixed_sizes_and_train_test_parts(tmp_path):
    write_image_folder(tmp_path / "train", mode="RGB", sizes=((20, 20), (24, 16)))
    write_image_folder(tmp_path / "test", mode="RGB", per_class=2, sizes=((20, 20),))
    ds = load_dataset(tmp_path)  # mixed sizes -> 32x32
    assert ds.image_shape == (3, 32, 32) and ds.num_classes == 3
    assert [len(s) for _, s in ds.splits()] == [27, 3, 6]
    assert load_dataset(tmp_path, size=(8, 12)).image_shape == (3, 8, 12)
    # a gray folder can be read as RGB on request
    write_image_folder(tmp_path / "gray")
    assert load_dataset(tmp_path / "gray", color="RGB").image_shape == (3, 12, 10)


# ---------------------------------------------------------------------------------------
# bad data: one clear error naming the file


def test_unknown_name_or_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nonexistent"):
        load_dataset("nonexistent")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="notes.txt"):
        load_dataset(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="cannot recognise"):
        load_dataset(tmp_path / "empty")
    with pytest.raises(TypeError, match="unknown option"):
        load_dataset("digits", realisations=2)


@pytest.mark.parametrize("missing", ["t10k-labels-idx1-ubyte", "train-images-idx3-ubyte"])
def test_mnist_missing_file(tmp_path, missing):
    write_mnist(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing):
        load_dataset(tmp_path)


def test_mnist_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(19))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.*19 labels.*20 images"):
        load_dataset(tmp_path)


def test_mnist_truncated_and_bad_magic(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*bytes"):
        load_dataset(tmp_path)
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*magic"):
        load_dataset(tmp_path)
    write_idx(path, np.zeros((4, 5)))  # 2-D where 3-D images are expected
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*3 dimension"):
        load_dataset(tmp_path)


def test_mnist_corrupt_gzip(tmp_path):
    write_mnist(tmp_path, gz=True)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset(tmp_path)


def test_mnist_empty_split(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(0))
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.*no images"):
        load_dataset(tmp_path)


def test_cifar_missing_batch(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_dataset(tmp_path)


def test_cifar_wrong_shape_and_count(tmp_path):
    write_cifar(tmp_path)
    with open(tmp_path / "data_batch_2", "wb") as f:
        pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, f)
    with pytest.raises(ValueError, match="data_batch_2.*3072"):
        load_dataset(tmp_path)
    with open(tmp_path / "data_batch_2", "wb") as f:
        pickle.dump({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0] * 3}, f)
    with pytest.raises(ValueError, match="data_batch_2.*3 labels for 4 images"):
        load_dataset(tmp_path)
    with open(tmp_path / "data_batch_2", "wb") as f:
        pickle.dump({b"images": np.zeros((4, 3072), np.uint8)}, f)
    with pytest.raises(ValueError, match="data_batch_2.*'data' and 'labels'"):
        load_dataset(tmp_path)


class _Payload:
    """Unpickling this would create a file (via os.system-like call)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


def test_cifar_pickle_cannot_run_code(tmp_path):
    write_cifar(tmp_path / "c")
    marker = tmp_path / "pwned"
    with open(tmp_path / "c" / "test_batch", "wb") as f:
        pickle.dump({b"data": _Payload(marker), b"labels": [0]}, f)
    with pytest.raises(ValueError, match="test_batch.*refusing"):
        load_dataset(tmp_path / "c")
    assert not marker.exists()


def test_cifar_garbage_file(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_5").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="data_batch_5"):
        load_dataset(tmp_path)


def _npz(path, **arrays):
    base = dict(x_train=np.zeros((10, 4, 4), np.uint8), y_train=np.arange(10) % 2,
                x_test=np.zeros((3, 4, 4), np.uint8), y_test=np.arange(3) % 2)
    base.update(arrays)
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return path


@pytest.mark.parametrize("arrays, match", [
    (dict(y_test=None), "missing array.*y_test"),
    (dict(y_train=np.arange(9)), "x_train has 10 images but y_train has 9 labels"),
    (dict(x_test=np.zeros((3, 16), np.uint8)), r"x_test must have shape"),
    (dict(x_test=np.zeros((3, 4, 4, 5), np.uint8)), r"x_test must have shape"),
    (dict(x_test=np.zeros((0, 4, 4), np.uint8), y_test=np.zeros(0, np.int64)), "x_test is empty"),
    (dict(x_train=np.full((10, 4, 4), 2.0)), r"x_train.*\[0, 1\]"),
    (dict(y_train=np.full(10, 0.5)), "y_train.*integers"),
    (dict(y_train=-np.ones(10, np.int64)), "y_train.*non-negative"),
    (dict(x_test=np.zeros((3, 5, 5), np.uint8)), "differ in shape"),
    (dict(x_val=np.zeros((2, 4, 4), np.uint8)), "x_val and y_val"),
])
def test_npz_bad_data(tmp_path, arrays, match):
    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match) as info:
        load_dataset(path)
    assert "bad.npz" in str(info.value)


def test_npz_unreadable(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="x.npz"):
        load_dataset(tmp_path / "x.npz")


def test_npz_too_small_for_validation(tmp_path):
    path = _npz(tmp_path / "tiny.npz", x_train=np.zeros((1, 4, 4), np.uint8), y_train=np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="tiny.npz.*too few"):
        load_dataset(path)


def test_image_folder_unreadable_image(tmp_path):
    write_image_folder(tmp_path)
    bad = tmp_path / "dog" / "img_003.png"
    bad.write_bytes(b"this is not a png")
    with pytest.raises(ValueError, match="img_003.png.*cannot read image"):
        load_dataset(tmp_path)


def test_image_folder_empty_class_and_bad_parts(tmp_path):
    write_image_folder(tmp_path / "a")
    (tmp_path / "a" / "fox").mkdir()
    (tmp_path / "a" / "fox" / "readme.txt").write_text("no images")
    with pytest.raises(ValueError, match="fox.*no image files"):
        load_dataset(tmp_path / "a")
    write_image_folder(tmp_path / "b" / "train")
    write_image_folder(tmp_path / "b" / "test", classes=("cat", "yak"), per_class=2)
    with pytest.raises(ValueError, match="yak.*training folder"):
        load_dataset(tmp_path / "b")


def test_image_folder_too_few_images(tmp_path):
    write_image_folder(tmp_path, per_class=1)
    with pytest.raises(ValueError, match="too few"):
        load_dataset(tmp_path)


@pytest.mark.parametrize("options, match", [
    (dict(val_fraction=1.5), "val_fraction"),
    (dict(size=0), "size"),
    (dict(size="big"), "size"),
    (dict(split_seed=-2), "split_seed"),
    (dict(color="CMYK"), "color"),
])
def test_path_option_errors(tmp_path, options, match):
    write_image_folder(tmp_path)
    with pytest.raises(ValueError, match=match):
        load_dataset(tmp_path, **options)


def test_stratified_split_small_classes_still_fill_small_parts():
    labels = np.repeat(np.arange(10), 4)  # 10 classes of 4: 10% of each class rounds to 0
    train, val = stratified_split(labels, [0.9, 0.1], seed=0)
    assert len(val) == 4 and len(train) == 36
    assert len(set(labels[val].tolist())) == 4  # four different classes, one sample each
    _, half = stratified_split(np.zeros(5, dtype=np.int64), [0.9, 0.1], seed=0)
    assert len(half) == 1  # 0.5 rounds up


def test_a_preemption_signal_to_a_loader_worker_leaves_it_reading(tmp_path):
    """A scheduler signals every process of a job, the DataLoader's workers too: a worker
    ignores SIGTERM and SIGUSR1 (the training process stops at the end of its step and ends its
    workers itself), so the loader goes on instead of failing with "worker killed"."""
    import os
    import signal
    import time

    from contrastkit.data import open_data
    from contrastkit.data.loader import make_loader

    from _shards import write_image_tree

    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=12, size=8)
    split = open_data(tree, stream=True, size=8).train
    loader = make_loader(split, batch_size=2, workers=1)
    batches = iter(loader)
    next(batches)
    worker = loader.loader._iterator._workers[0]  # the DataLoader's one worker process
    assert worker.is_alive()
    for name in ("SIGTERM", "SIGUSR1"):
        os.kill(worker.pid, getattr(signal, name))
    time.sleep(0.3)
    assert worker.is_alive()
    assert sum(1 for _ in batches) >= 1


EXITS_WITH_WORKERS_RUNNING = '''
import sys
from contrastkit.data import open_data
from contrastkit.data.loader import make_loader

loader = make_loader(open_data(sys.argv[1], stream=True, size=8).train, batch_size=2, workers=2)
batches = iter(loader)
next(batches)
kept = batches  # an error kept with its traceback keeps the iterator, and its workers, like this
print("done", flush=True)
'''


def test_a_process_that_ends_with_a_loaders_workers_running_exits(tmp_path):
    """The workers ignore SIGTERM, which is what Python's multiprocessing sends its daemonic
    children at exit before it waits for them: a process that ended with a loader's iterator
    alive (a --bad-files fail error kept by the caller) waited for its workers forever."""
    import os
    import subprocess
    import sys

    from _shards import write_image_tree

    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=12, size=8)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", EXITS_WITH_WORKERS_RUNNING, tree], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
