"""Streamed data: the file index of an image folder, batches through DataLoaders with workers,
the same epoch order as the in-memory path, exact resume with workers, a user's own Dataset,
unreadable images named, and the read-out in batches."""

import json
import os
import tarfile

import numpy as np
import pytest
import torch

from _data_fixtures import write_image_folder
from contrastkit.cli import main
from contrastkit.data import (EpochBatchSampler, ImageFolderDataset, UnreadableImageError, load_dataset,
                              make_loader, stream_image_folder)
from contrastkit.data.files import load_image_folder
from contrastkit.train import PretrainConfig, evaluate_run, extract_features, pretrain

from _data_fixtures import CIFAR_TARBALL

# The real-data folder lives next to the project (``../shared/data`` from its root, or higher up
# for a checkout in a subfolder); the test skips when it is absent.


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, classes=("cat", "dog", "eel"), per_class=14, mode="RGB", sizes=((16, 16),))
    return root


def config(out, data, **overrides):
    options = dict(data=str(data), epochs=2, batch_size=8, out=str(out), device="cpu", log_every=1,
                   data_options={"stream": True})
    options.update(overrides)
    return PretrainConfig(**options)


def test_a_streamed_folder_holds_only_the_file_index(folder):
    data = stream_image_folder(folder)
    train = data.train.dataset if hasattr(data.train, "dataset") else data.train
    assert isinstance(train, ImageFolderDataset) and train.files.dtype.kind == "S"
    tensors = [v for v in vars(train).values() if isinstance(v, torch.Tensor)]
    assert [t.shape for t in tensors] == [train.labels.shape]  # no image tensor anywhere
    image, label = data.train[0]
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 16, 16) and isinstance(label, int)


def test_streamed_splits_and_pixels_equal_the_in_memory_load(folder):
    streamed, held = stream_image_folder(folder), load_image_folder(folder)
    assert streamed.class_names == held.class_names and streamed.image_shape == held.image_shape
    for (name, s), (_, h) in zip(streamed.splits(), held.splits()):
        assert torch.equal(s.labels, h.labels), name
        pixels = torch.stack([s[i][0] for i in range(len(s))]).float() / 255
        assert torch.equal(pixels, h.images), name
        # the read-out's features of a streamed split are those of the same images held whole
        encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
        assert np.allclose(extract_features(encoder, s, torch.device("cpu"), batch_size=5, workers=2),
                           extract_features(encoder, h.images, torch.device("cpu")), atol=1e-6)


def test_epoch_batches_are_the_in_memory_order():
    sampler = EpochBatchSampler(50, 8, seed=3)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = torch.randperm(50, generator=torch.Generator().manual_seed(3 * 100_003 + epoch))
        assert list(sampler) == [order[i * 8:(i + 1) * 8].tolist() for i in range(6)]
    from torch.utils.data import DistributedSampler

    ranked = EpochBatchSampler(50, 4, seed=1, rank=1, world_size=2)
    ranked.set_epoch(2)
    reference = DistributedSampler(range(50), num_replicas=2, rank=1, shuffle=True, seed=1, drop_last=True)
    reference.set_epoch(2)
    assert sum(list(ranked), []) == list(reference)[:24] and len(ranked) == 6
    # the loader of an in-memory split yields those index batches and leaves the global RNG alone
    split = load_dataset("digits").train
    state = torch.get_rng_state()
    batches = list(make_loader(split, batch_sampler=sampler))
    assert torch.equal(state, torch.get_rng_state())
    assert [b.tolist() for b in batches] == list(sampler)


def test_an_epoch_started_in_its_middle_yields_the_rest_of_its_batches():
    for world_size, rank in ((1, 0), (2, 1)):
        sampler = EpochBatchSampler(50, 4, seed=5, rank=rank, world_size=world_size)
        sampler.set_epoch(3)
        whole = list(sampler)
        sampler.set_epoch(3, start=4)  # a run resumed 4 batches into epoch 3
        assert list(sampler) == whole[4:] and len(sampler) == len(whole) - 4
        sampler.set_epoch(4)  # the next epoch starts at its beginning again
        assert len(sampler) == len(whole)
    with pytest.raises(ValueError, match="start"):
        sampler.set_epoch(1, start=-1)


def test_resume_with_workers_ends_with_the_uninterrupted_weights(tmp_path, folder):
    full = pretrain(config(tmp_path / "full", folder, workers=2), progress=False, baselines=False)
    out = tmp_path / "resumed"

    class Stop(Exception):
        pass

    def stop(epoch, record):
        if epoch == 1:
            raise Stop

    with pytest.raises(Stop):
        pretrain(config(out, folder, workers=2), progress=False, on_epoch_end=stop)
    resumed = pretrain(config(out, folder, workers=2), resume=True, progress=False, baselines=False)
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["final_loss"] == full["final_loss"]
    # workers only decode: the same run with none gives the same weights
    pretrain(config(tmp_path / "none", folder, workers=0), progress=False, baselines=False)
    c = torch.load(tmp_path / "none" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_cli_streams_a_folder_with_workers_and_probe_reads_it_again(tmp_path, folder, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--data", str(folder), "--workers", "2", "--epochs", "1", "--batch-size", "8",
                 "--out", str(out), "--quiet", "--device", "cpu", "--no-report"])
    assert code == 0
    capsys.readouterr()
    with open(out / "config.json", encoding="utf-8") as handle:
        derived = json.load(handle)["derived"]
    assert derived["dataset"]["streamed"] is True
    with open(out / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    again = evaluate_run(str(out), device="cpu")
    for key in ("probe_accuracy", "knn_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy"):
        assert again[key] == summary[key], key


def test_an_unreadable_image_is_one_clear_error_naming_it(tmp_path, folder, capsys):
    broken = tmp_path / "broken"
    write_image_folder(broken, classes=("a", "b"), per_class=10, mode="RGB", sizes=((16, 16),))
    bad = broken / "b" / "img_007.png"
    bad.write_bytes(b"not an image at all")
    data = stream_image_folder(broken)  # only the index: nothing is decoded yet
    errors = []
    for _, split in data.splits():
        try:
            for _ in make_loader(split, batch_size=4, workers=2):
                pass
        except UnreadableImageError as err:  # raised in a worker, re-raised here
            errors.append(str(err))
    assert errors == [f"{bad}: cannot read image (UnidentifiedImageError: cannot identify image file)"]
    code = main(["pretrain", "--data", str(broken), "--workers", "2", "--epochs", "1", "--batch-size", "4",
                 "--out", str(tmp_path / "run"), "--quiet", "--device", "cpu", "--no-report"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and str(bad) in err and "cannot read image" in err and len(err.splitlines()) == 1


class _Tensors(torch.utils.data.Dataset):
    """A user's own Dataset: float images in [0, 1] and labels, no label attribute."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels_ = torch.arange(n) % 2
        self.images = torch.rand(n, 1, 12, 12, generator=g) * 0.5 + 0.5 * self.labels_[:, None, None, None]

    def __len__(self):
        return len(self.labels_)

    def __getitem__(self, i):
        return self.images[i], int(self.labels_[i])


@pytest.mark.parametrize("method", ["simclr", "supcon"])
def test_a_users_map_style_dataset_trains_and_evaluates(tmp_path, method):
    summary = pretrain(config(tmp_path / "run", "glyphlab", epochs=1, data_options={}, method=method),
                       dataset={"train": _Tensors(40, 0), "test": _Tensors(16, 1)}, progress=False)
    assert summary["epochs"] == 1 and 0 <= summary["probe_accuracy"] <= 1
    assert summary["raw_pixel_probe_accuracy"] > 0.9  # the two classes differ in brightness


def test_bad_streaming_options_are_clear(tmp_path, folder):
    with pytest.raises(ValueError, match="stream must be true or false"):
        pretrain(config(tmp_path / "a", folder, data_options={"stream": "yes"}), progress=False)
    with pytest.raises(ValueError, match="'glyphlab' is none of them"):
        pretrain(config(tmp_path / "b", "glyphlab", data_options={"stream": True}), progress=False)
    with pytest.raises(ValueError, match="workers must be an integer >= 0"):
        pretrain(config(tmp_path / "c", folder, workers=-1), progress=False)
    with pytest.raises(TypeError, match="map-style"):
        pretrain(config(tmp_path / "d", folder), dataset=42, progress=False)


@pytest.mark.skipif(not os.path.isfile(CIFAR_TARBALL), reason="the CIFAR-10 JPEG tarball is not present")
def test_a_cifar10_subset_streams_with_workers(tmp_path):
    wanted = {"train": 12, "test": 4}  # per class
    counts = {}
    with tarfile.open(CIFAR_TARBALL, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 3:
                continue
            split, cls = parts[-3], parts[-2]
            key = (split, cls)
            if split in wanted and counts.get(key, 0) < wanted[split]:
                counts[key] = counts.get(key, 0) + 1
                target = tmp_path / "cifar" / split / cls / parts[-1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
            if len(counts) == 20 and all(counts[k] == wanted[k[0]] for k in counts):
                break
    summary = pretrain(config(tmp_path / "run", tmp_path / "cifar", epochs=1, batch_size=16, workers=2,
                              data_options={}), progress=False, baselines=False)
    assert summary["epochs"] == 1 and summary["data"] == "cifar"


class _Images(torch.utils.data.Dataset):
    """A streamed split of constant images: item ``i`` is an image filled with ``base + i``."""

    def __init__(self, base, n=8):
        self.base, self.n = base, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return torch.full((1, 4, 4), self.base + index, dtype=torch.uint8), 0


def test_a_held_training_batch_answers_only_for_its_own_split():
    """The loop hands each training batch's decoded images to the batch maker; a held-out
    split's batch of the same indices (a stream's positions restart at 0 every epoch) is that
    split's images, read, not the training batch's."""
    from contrastkit.data.batches import HeldImages

    train, val = _Images(0), _Images(100)
    indices = torch.arange(4)
    held = HeldImages()
    decoded = torch.stack([train[i][0] for i in range(4)])
    held.hold(train, indices, decoded)
    assert held(train, indices) is decoded and torch.equal(held(train, indices[1:3]), decoded[1:3])
    assert torch.equal(held(val, indices), torch.stack([val[i][0] for i in range(4)]))
    assert held.rows(val, indices) is None and held.rows(train, torch.tensor([5])) is None
