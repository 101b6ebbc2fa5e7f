"""Streamed image-text pairs: a user's map-style Dataset of ``(image, text)`` trains convirt and
siglip as the same pairs held in memory do (same seed -> the same weights, losses and
retrieval numbers, with 0 or 2 workers), resumes exactly with workers, reads its images only
batch by batch, and a bad item is one clear error naming its index."""

import copy

import pytest
import torch

from contrastkit.data import BadItemError, as_streaming, as_streaming_pairs, make_loader
from contrastkit.data import load_paired
from contrastkit.data.paired import PairedDataset, PairedSplit, StreamingPairedDataset
from contrastkit.data.streaming import in_memory  # the storage of the splits under test
from contrastkit.train import PretrainConfig, pretrain

SCENES = dict(train_scenes=40, val_scenes=12, test_scenes=16, size=28)


@pytest.fixture(scope="module")
def glyphs():
    return load_paired("glyphlab-text", seed=3, **SCENES)


class Pairs(torch.utils.data.Dataset):
    """A user's own Dataset of (image, text): the canonical images of a glyphlab-text split and
    its texts; ``texts`` / ``targets`` attributes when asked for; counts the items it is asked for."""

    def __init__(self, split, *, texts=True, labels=True, uint8=False):
        self.images = (split.images * 255).round().to(torch.uint8) if uint8 else split.images
        self._texts = list(split.texts)
        if texts:
            self.texts = list(split.texts)
        if labels:
            self.targets = split.labels.tolist()
        self.calls = 0

    def __len__(self):
        return len(self._texts)

    def __getitem__(self, i):
        self.calls += 1
        return self.images[i], self._texts[i]


def held(ds, labels=True):
    """The same pairs held in memory (canonical images, no realisations, no facts)."""
    splits = {name: PairedSplit(images=s.images, texts=list(s.texts), labels=s.labels if labels else None)
              for name, s in ds.splits()}
    return PairedDataset(name="pairs", **splits, class_names=list(ds.class_names) if labels else [],
                         class_prompts=dict(ds.class_prompts) if labels else {}, source="pairs")


def streamed(ds, labels=True, **options):
    sets = {name: Pairs(s, labels=labels, **options) for name, s in ds.splits()}
    pairs = as_streaming_pairs(sets["train"], sets["val"], sets["test"], name="pairs",
                               class_names=list(ds.class_names) if labels else None,
                               class_prompts=dict(ds.class_prompts) if labels else None)
    return pairs, sets


def config(out, method="convirt", **overrides):
    options = dict(method=method, data="glyphlab-text", epochs=2, batch_size=16, out=str(out), device="cpu",
                   log_every=1, projection_dim=16, eval_every=0, seed=5, threads=1)
    options.update(overrides)
    return PretrainConfig(**options)


def weights(out):
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


NUMBERS = ("final_loss", "retrieval_i2t_recall@1", "retrieval_t2i_recall@5", "val_retrieval_i2t_recall@1",
           "zero_shot_accuracy", "probe_accuracy", "knn_accuracy", "final_temperature")


def test_the_streamed_pairs_hold_texts_and_labels_but_no_image(glyphs):
    pairs, sets = streamed(glyphs)
    assert isinstance(pairs, StreamingPairedDataset) and pairs.streamed
    assert pairs.image_shape == glyphs.image_shape and pairs.num_classes == glyphs.num_classes
    for (name, split), (_, source) in zip(pairs.splits(), glyphs.splits()):
        assert not in_memory(split) and split.texts == source.texts, name
        assert torch.equal(split.labels, source.labels), name
        tensors = [v for v in vars(split).values() if isinstance(v, torch.Tensor)]
        assert [t.shape for t in tensors] == [split.labels.shape]  # no image tensor anywhere
        assert sets[name].calls == 1  # item 0 (its shape and checks); the texts came from `texts`
    image, text = pairs.train[3]
    assert torch.equal(image, glyphs.train.images[3]) and text == glyphs.train.texts[3]
    assert "(streamed)" in pairs.summary()


@pytest.mark.parametrize("method", ["convirt", "siglip"])
def test_streamed_training_equals_the_in_memory_run_on_the_same_pairs(tmp_path, glyphs, method):
    # eval_every: the val read-outs (retrieval, kNN, the probe choosing the reported epoch) too
    memory = pretrain(config(tmp_path / "memory", method, eval_every=1), dataset=held(glyphs), progress=False)
    stream = pretrain(config(tmp_path / "stream", method, eval_every=1), dataset=streamed(glyphs)[0],
                      progress=False)
    assert_same_weights(weights(tmp_path / "memory"), weights(tmp_path / "stream"))
    for key in NUMBERS:
        assert stream[key] == memory[key], key
    assert stream["retrieval_pairs"] == len(glyphs.test)


def test_two_workers_and_a_plain_dataset_give_the_same_run(tmp_path, glyphs):
    """Workers only decode: 2 of them give the weights of 0; a Dataset without a ``texts``
    attribute (texts read from one pass over its items) and uint8 images (scaled by 1/255 on
    the device) give the run of the float images their uint8 values stand for."""
    quantised = copy.deepcopy(glyphs)
    for _, split in quantised.splits():
        split.images = (split.images * 255).round() / 255
    pretrain(config(tmp_path / "zero", workers=0), dataset=held(quantised), progress=False, baselines=False)
    sets = {name: Pairs(s, texts=False, uint8=True) for name, s in glyphs.splits()}
    two = pretrain(config(tmp_path / "two", workers=2), dataset=sets, progress=False,  # a dict, as for (image, label)
                   baselines=False)
    assert_same_weights(weights(tmp_path / "zero"), weights(tmp_path / "two"))
    assert two["probe_accuracy"] >= 0 and "zero_shot_accuracy" in two


def test_resume_with_workers_ends_with_the_uninterrupted_weights(tmp_path, glyphs):
    full = pretrain(config(tmp_path / "full", workers=2), dataset=streamed(glyphs)[0], progress=False,
                    baselines=False)

    class Stop(Exception):
        pass

    def stop(epoch, record):
        if epoch == 1:
            raise Stop

    out = tmp_path / "resumed"
    with pytest.raises(Stop):
        pretrain(config(out, workers=2), dataset=streamed(glyphs)[0], progress=False, on_epoch_end=stop)
    resumed = pretrain(config(out, workers=2), dataset=streamed(glyphs)[0], resume=True, progress=False,
                       baselines=False)
    assert_same_weights(weights(tmp_path / "full"), weights(out))
    assert resumed["final_loss"] == full["final_loss"]
    assert resumed["retrieval_i2t_recall@1"] == full["retrieval_i2t_recall@1"]


def test_images_are_read_batch_by_batch_never_all_up_front(tmp_path, glyphs):
    pairs, sets = streamed(glyphs, labels=False)
    assert all(s.calls == 1 for s in sets.values())  # building it decoded item 0 of each split only
    summary = pretrain(config(tmp_path / "run", epochs=3), dataset=pairs, progress=False)
    steps = len(glyphs.train) // 16
    # training reads each epoch's batches once (the last partial batch dropped; the report's record
    # of the last batch keeps the images the loader decoded); the read-out reads the val and test
    # pairs once each for retrieval; no probe reads them without labels
    assert sets["train"].calls == 1 + 3 * steps * 16 < 3 * len(glyphs.train) + 1
    assert sets["val"].calls == 1 + len(glyphs.val) and sets["test"].calls == 1 + len(glyphs.test)
    # without labels: retrieval only, no image probe, no zero-shot
    assert "retrieval_i2t_recall@1" in summary and "probe_accuracy" not in summary
    assert "zero_shot_accuracy" not in summary and summary["beats_baselines"] is None


def test_a_loader_batch_holds_only_its_images(glyphs):
    pairs, sets = streamed(glyphs)
    loader = make_loader(pairs.train, batch_size=8)
    images, indices = next(iter(loader))
    assert images.shape == (8, *glyphs.image_shape) and indices.tolist() == list(range(8))
    assert sets["train"].calls == 1 + 8


def test_as_streaming_detects_pairs_and_carves_the_missing_splits(glyphs):
    pairs = as_streaming(Pairs(glyphs.train, labels=False), split_seed=1)
    assert isinstance(pairs, StreamingPairedDataset) and not pairs.has_labels
    sizes = [len(s) for _, s in pairs.splits()]
    assert sum(sizes) == len(glyphs.train) and min(sizes) > 0
    texts = pairs.train.texts + pairs.val.texts + pairs.test.texts
    assert sorted(texts) == sorted(glyphs.train.texts)
    index = pairs.test.indices[0]  # a carved split's item is the source's
    assert pairs.test[0][1] == glyphs.train.texts[index] and pairs.test.texts[0] == glyphs.train.texts[index]


class Items(torch.utils.data.Dataset):
    """Four good pairs, and item 2 replaced by ``bad``."""

    def __init__(self, bad, n=24):
        self.bad, self.n = bad, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 2:
            return self.bad
        return torch.full((1, 8, 8), 0.5), f"a text {i}"


@pytest.mark.parametrize("bad, message", [
    ((torch.zeros(1, 8, 8), 7), "train: item 2's text must be a non-empty str, got int"),
    ((torch.zeros(1, 8, 8), "  "), "train: item 2's text must be a non-empty str, got '  '"),
    (torch.zeros(1, 8, 8), "train: item 2 must be (image, text), got Tensor"),
    ((torch.zeros(1, 8, 8), "a", "b"), "train: item 2 must be (image, text), got a tuple of 3"),
    ((torch.zeros(1, 9, 8), "a text"), "train item 2: the image has shape (1, 9, 8), item 0's (1, 8, 8)"),
    ((torch.full((1, 8, 8), 2.0), "a text"), "train item 2: float images must lie in [0, 1]"),
    (("not an image", "a text"), "train item 2: the image must be a (C, H, W) tensor, a PIL image or an HWC "
                                 "array, got str"),
])
def test_a_bad_item_is_one_clear_error_naming_its_index(bad, message):
    with pytest.raises(BadItemError) as caught:  # without a texts attribute: found reading the texts
        as_streaming_pairs(Items(bad))
    assert str(caught.value).startswith(message) and len(str(caught.value).splitlines()) == 1


class Lazy(Items):
    """Items with a ``texts`` attribute: a bad image is found only when its batch is read."""

    def __init__(self, bad):
        super().__init__(bad)
        self.texts = [f"a text {i}" for i in range(self.n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_image_found_in_training_is_raised_in_the_main_process(tmp_path, workers):
    pairs = as_streaming_pairs(Lazy((torch.zeros(1, 9, 8), "a text")), Lazy((torch.zeros(1, 8, 8), "x")),
                               Lazy((torch.zeros(1, 8, 8), "x")))
    with pytest.raises(BadItemError, match=r"^train item 2: the image has shape \(1, 9, 8\)"):
        pretrain(config(tmp_path / "run", workers=workers, epochs=1, batch_size=24),
                 dataset=pairs, progress=False, baselines=False)


def test_paired_data_and_labelled_data_are_not_confused(tmp_path, glyphs):
    class Labelled(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return torch.zeros(1, 8, 8), i % 2

    with pytest.raises(ValueError, match="convirt trains on \\(image, text\\) pairs; the data set's items are "
                                         "\\(image, label\\)"):
        pretrain(config(tmp_path / "a"), dataset=Labelled(), progress=False)
    with pytest.raises(ValueError, match="labels .* all splits or none; train, val have them, test not"):
        as_streaming_pairs(Pairs(glyphs.train), Pairs(glyphs.val), Pairs(glyphs.test, labels=False))
    with pytest.raises(ValueError, match="class_names were given but the pairs carry no labels"):
        as_streaming_pairs(Pairs(glyphs.train, labels=False), class_names=["a"])
    with pytest.raises(ValueError, match="train: 3 texts for 40 items"):
        bad = Pairs(glyphs.train)
        bad.texts = bad.texts[:3]
        as_streaming_pairs(bad)
    with pytest.raises(ValueError, match=r"train.texts\[1\] is empty or not a string"):
        bad = Pairs(glyphs.train)
        bad.texts[1] = ""
        as_streaming_pairs(bad)


def test_split_limits_cut_the_streamed_pairs_as_the_held_ones(tmp_path, glyphs):
    limits = dict(train_limit=32, val_limit=8, test_limit=12)
    memory = pretrain(config(tmp_path / "memory", epochs=1, **limits), dataset=held(glyphs), progress=False,
                      baselines=False)
    stream = pretrain(config(tmp_path / "stream", epochs=1, **limits), dataset=streamed(glyphs)[0], progress=False,
                      baselines=False)
    assert_same_weights(weights(tmp_path / "memory"), weights(tmp_path / "stream"))
    assert stream["retrieval_pairs"] == memory["retrieval_pairs"] == 12
    assert stream["retrieval_i2t_recall@1"] == memory["retrieval_i2t_recall@1"]
