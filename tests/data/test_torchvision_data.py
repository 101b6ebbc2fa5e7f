"""torchvision data sets and transforms.v2 pipelines in the Python API: an ``ImageFolder``, a
``FakeData`` and a CIFAR-like ``VisionDataset`` (with its test split) train and read out,
streamed through DataLoader workers; a v2 pipeline makes the views in the workers (two
different views of the right shape, the same whatever the number of workers, exact on resume);
objects that are not data sets and transforms that break the contract are clear errors."""

import json

import numpy as np
import pytest
import torch

from _data_fixtures import write_image_folder
from contrastkit.data import as_data, make_loader
from contrastkit.data.batch_source import StepBatch
from contrastkit.data.transform_views import TransformViews, ViewItems
from contrastkit.train import PretrainConfig, pretrain

torchvision = pytest.importorskip("torchvision", reason="the torchvision extra is not installed")
from torchvision import datasets  # noqa: E402
from torchvision.transforms import v2  # noqa: E402


def config(out, **overrides):
    options = dict(epochs=1, batch_size=8, out=str(out), device="cpu", log_every=1, threads=1)
    options.update(overrides)
    return PretrainConfig(**options)


def pipeline(size=16):
    """SimCLR's CIFAR augmentations as torchvision v2 transforms, on a (C, H, W) uint8 tensor."""
    return v2.Compose([v2.RandomResizedCrop(size, scale=(0.2, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                       v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), v2.RandomGrayscale(p=0.2),
                       v2.ToDtype(torch.float32, scale=True)])


class CifarLike(datasets.VisionDataset):
    """What torchvision's CIFAR10 is after it unpickled its batches: ``data`` (N, H, W, 3) uint8,
    ``targets``, ``classes``; items (PIL image, int) through its ``transform``."""

    classes = ["airplane", "automobile", "bird"]

    def __init__(self, n, seed, transform=None):
        super().__init__(root="", transform=transform)
        rng = np.random.default_rng(seed)
        self.targets = [i % 3 for i in range(n)]
        self.data = (rng.integers(0, 96, (n, 16, 16, 3)) + 80 * np.array(self.targets)[:, None, None, None]
                     ).astype(np.uint8)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image

        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform else image), self.targets[index]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    write_image_folder(root, classes=("cat", "dog", "eel"), per_class=10, mode="RGB", sizes=((16, 16), (20, 18)))
    return root


def test_an_image_folder_trains_through_workers_and_reads_out(tmp_path, tree):
    # the images differ in size: the data set's own (deterministic) transform makes them one
    folder = datasets.ImageFolder(str(tree), transform=v2.Compose([v2.PILToTensor(), v2.Resize((16, 16))]))
    data = as_data(folder)
    assert data.class_names == ["cat", "dog", "eel"] and data.image_shape == (3, 16, 16)
    assert torch.equal(torch.sort(torch.cat([data.train.labels, data.val.labels, data.test.labels]))[0],
                       torch.tensor(sorted(folder.targets)))
    summary = pretrain(config(tmp_path / "run", workers=2), dataset=folder, progress=False, baselines=False)
    assert summary["epochs"] == 1 and np.isfinite(summary["final_loss"])
    assert 0 <= summary["probe_accuracy"] <= 1 and 0 <= summary["knn_accuracy"] <= 1
    derived = json.loads((tmp_path / "run" / "config.json").read_text())["derived"]
    assert derived["dataset"]["streamed"] is True and derived["dataset"]["num_classes"] == 3


def test_fakedata_with_its_test_split_trains_and_reads_out(tmp_path):
    train = datasets.FakeData(size=32, image_size=(3, 16, 16), num_classes=2, random_offset=0)
    test = datasets.FakeData(size=12, image_size=(3, 16, 16), num_classes=2, random_offset=500)
    data = as_data({"train": train, "test": test})
    assert (len(data.train) + len(data.val), len(data.test)) == (32, 12)  # val carved from train only
    assert data.test.labels.tolist() == [int(test[i][1]) for i in range(12)]
    summary = pretrain(config(tmp_path / "run"), dataset={"train": train, "test": test}, progress=False,
                       baselines=False)
    assert summary["epochs"] == 1 and 0 <= summary["probe_accuracy"] <= 1


def test_a_cifar_like_vision_dataset_keeps_its_classes_and_is_read_out(tmp_path):
    train, test = CifarLike(36, 0), CifarLike(15, 1)
    data = as_data({"train": train, "test": test})
    assert data.class_names == CifarLike.classes and data.image_shape == (3, 16, 16)
    summary = pretrain(config(tmp_path / "run"), dataset={"train": train, "test": test}, progress=False)
    # the classes differ in brightness: the raw pixels separate them, so the read-out saw the labels
    assert summary["raw_pixel_probe_accuracy"] > 0.9


def test_a_v2_pipeline_makes_two_different_views_of_the_right_shape():
    data = as_data(CifarLike(12, 0))
    items = ViewItems(data.train, pipeline(), seed=3)
    pairs = torch.stack([items[(i, 1)][0] for i in range(len(items))])
    assert pairs.shape == (len(items), 2, 3, 16, 16) and pairs.dtype == torch.float32
    assert float(pairs.min()) >= 0 and float(pairs.max()) <= 1
    assert all(not torch.equal(pair[0], pair[1]) for pair in pairs)  # two draws, not one view twice
    assert torch.equal(items[(5, 1)][0], pairs[5])                   # a view is a function of its key
    assert not torch.equal(items[(5, 2)][0], pairs[5])               # and new each epoch
    # the training stream is untouched: drawing views does not move torch's global generator
    state = torch.get_rng_state()
    items[(0, 0)]
    assert torch.equal(state, torch.get_rng_state())


def test_views_made_in_workers_do_not_depend_on_how_many(tmp_path):
    from contrastkit.data import EpochBatchSampler

    data = as_data(CifarLike(24, 0))
    views = TransformViews(pipeline(), seed=7)
    epochs = {}
    for workers in (0, 2):
        sampler = EpochBatchSampler(len(data.train), 8, seed=0)
        loader = make_loader(views.training_items(data.train), batch_sampler=sampler, workers=workers)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            epochs[workers, epoch] = [(pairs, indices) for pairs, indices in loader]
    for epoch in (0, 1):
        for (a, ia), (b, ib) in zip(epochs[0, epoch], epochs[2, epoch]):
            assert torch.equal(ia, ib) and torch.equal(a, b)
    assert not torch.equal(epochs[0, 0][0][0], epochs[0, 1][0][0])
    # the batch maker hands the loader's views to the step, a part of them to a micro-batch
    pairs, indices = epochs[2, 1][0]
    views.hold(data.train, StepBatch(indices, indices, pairs, None))
    view_a, view_b = views(data.train, indices)
    assert torch.equal(view_a, pairs[:, 0]) and torch.equal(view_b, pairs[:, 1])
    assert torch.equal(views(data.train, indices[2:5])[1], pairs[2:5, 1])
    # the same indices of another split are that split's views, made here (not the training batch's)
    rows = (indices < len(data.test)).nonzero().flatten()[:3]
    assert rows.numel() > 0
    held_out = views(data.test, indices[rows])[0]
    assert torch.equal(held_out, views(data.test, indices[rows])[0]) and not torch.equal(held_out, pairs[rows, 0])


def test_a_v2_pipeline_trains_and_resumes_exactly(tmp_path):
    dataset = {"train": CifarLike(32, 0), "test": CifarLike(12, 1)}

    full = pretrain(config(tmp_path / "full", epochs=2, workers=2), dataset=dataset, transform=pipeline(),
                    progress=False, baselines=False)
    assert np.isfinite(full["final_loss"])
    derived = json.loads((tmp_path / "full" / "config.json").read_text())["derived"]
    assert derived["views"]["mode"] == "transform" and "RandomResizedCrop" in derived["views"]["transform"]

    class Stop(Exception):
        pass

    def stop(epoch, record):
        raise Stop

    with pytest.raises(Stop):
        pretrain(config(tmp_path / "cut", epochs=2, workers=0), dataset=dataset, transform=pipeline(),
                 progress=False, on_epoch_end=stop)
    resumed = pretrain(config(tmp_path / "cut", epochs=2, workers=2), dataset=dataset, transform=pipeline(),
                       resume=True, progress=False, baselines=False)
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # workers 0 then 2: the same views, the same weights
    assert resumed["final_loss"] == full["final_loss"]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.zeros(3, 8, 8), 0


@pytest.mark.parametrize("thing, says", [
    (42, "not a map-style data set"),
    ("photos/", "is a path"),
    (datasets.FakeData, "pass an instance"),
    (torch.zeros(4, 3, 8, 8), "not a map-style data set"),
    ("stream", "iterable-style"),
])
def test_an_object_that_is_not_a_data_set_is_a_clear_error(tmp_path, thing, says):
    if thing == "stream":
        thing = Stream()
    with pytest.raises(TypeError, match=says):
        pretrain(config(tmp_path / "run"), dataset=thing, progress=False)
    with pytest.raises(TypeError, match=r"dataset\['test'\]"):
        as_data({"train": CifarLike(12, 0), "test": thing})


def test_a_transform_that_breaks_the_contract_is_a_clear_error(tmp_path):
    data = as_data(CifarLike(12, 0))
    with pytest.raises(TypeError, match="transform must be callable"):
        ViewItems(data.train, "RandomCrop", seed=0)
    with pytest.raises(ValueError, match=r"views have shape \(3, 12, 12\), the data's images \(3, 16, 16\)"):
        ViewItems(data.train, v2.RandomCrop(12), seed=0)
    normalised = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)])
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*leave normalisation out"):
        ViewItems(data.train, normalised, seed=0)
    with pytest.raises(ValueError, match="item 0's view is a Image"):
        ViewItems(data.train, v2.ToPILImage(), seed=0)
    with pytest.raises(ValueError, match="convirt trains on .image, text. pairs"):
        pretrain(config(tmp_path / "a", method="convirt", data="glyphlab-text",
                        data_options=dict(train_scenes=4, val_scenes=3, test_scenes=3)), transform=pipeline(),
                 progress=False)
    with pytest.raises(ValueError, match="not both"):
        pretrain(config(tmp_path / "b"), dataset=CifarLike(12, 0), transform=pipeline(), views=object(),
                 progress=False)
    with pytest.raises(ValueError, match="views 'A' pair noise realisations"):
        pretrain(config(tmp_path / "c", views="A"), transform=pipeline(), progress=False)
