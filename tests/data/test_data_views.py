"""View makers: shapes, dtype, device, range; A/B pair semantics; reproducibility; errors."""

import numpy as np
import pytest
import torch

from contrastkit.data import Dataset, Split, load_dataset, make_views


pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture(scope="module")
def glyph():
    return load_dataset("glyphlab", seed=0, train_scenes=24, val_scenes=6, test_scenes=6, realisations=3)


@pytest.fixture(scope="module")
def clean_glyph():
    return load_dataset("glyphlab", seed=1, train_scenes=60, val_scenes=3, test_scenes=3, noise=0.0,
                        clutter=(0, 0))


def _rgb_dataset():
    g = torch.Generator().manual_seed(0)
    split = lambda n: Split(images=torch.rand(n, 3, 20, 20, generator=g), labels=torch.arange(n) % 2)
    return Dataset(name="rgb", class_names=["a", "b"], train=split(10), val=split(4), test=split(4))


def _moment_class(img: np.ndarray) -> int:
    """Nearest class angle (vertical, horizontal, diagonal) of the bright pixels' principal axis."""
    r, c = np.nonzero(img > (img.min() + img.max()) / 2)
    x, y = c - c.mean(), -(r - r.mean())
    angle = np.degrees(0.5 * np.arctan2(2 * (x * y).mean(), (x * x).mean() - (y * y).mean())) % 180
    gap = lambda a, b: min(abs(a - b), 180 - abs(a - b))
    return int(np.argmin([gap(angle, 90), gap(angle, 0), min(gap(angle, 45), gap(angle, 135))]))


@pytest.mark.parametrize("mode", ["augment", "A", "B"])
def test_shapes_dtype_device_range(glyph, mode):
    views = make_views(glyph, mode=mode, device=torch.device("cpu"))
    idx = torch.tensor([0, 5, 5, 23])
    a, b = views(glyph.train, idx)
    for v in (a, b):
        assert v.shape == (4, 1, 32, 32) and v.dtype == torch.float32 and v.device.type == "cpu"
        assert float(v.min()) >= 0.0 and float(v.max()) <= 1.0
        assert v.is_contiguous()


def test_rgb_and_digits_augment():
    ds = _rgb_dataset()
    a, b = make_views(ds, "augment")(ds.train, torch.arange(10))
    assert a.shape == (10, 3, 20, 20) and b.shape == (10, 3, 20, 20)
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    assert not torch.equal(a, b)
    digits = load_dataset("digits")
    views = make_views(digits, "augment")
    assert views.flip is False  # mirrored digits are not digits
    a, b = views(digits.val, torch.arange(64))
    assert a.shape == (64, 1, 32, 32) and not torch.equal(a, b)


def test_a_views_are_two_different_realisations_of_the_same_scene(glyph):
    torch.manual_seed(0)
    idx = torch.arange(24).repeat(3)
    a, b = make_views(glyph, "A")(glyph.train, idx)
    real = glyph.train.realisations
    for row, i in enumerate(idx.tolist()):
        match_a = [r for r in range(3) if torch.equal(a[row], real[i, r])]
        match_b = [r for r in range(3) if torch.equal(b[row], real[i, r])]
        assert len(match_a) == 1 and len(match_b) == 1 and match_a != match_b
    assert not torch.equal(a, b)


def test_b_view_is_another_realisation_rotated_90_degrees(glyph):
    torch.manual_seed(1)
    idx = torch.arange(24)
    a, b = make_views(glyph, "B")(glyph.train, idx)
    real = glyph.train.realisations.numpy()
    for row, i in enumerate(idx.tolist()):
        # np.rot90 rotates counter-clockwise: out[r, c] = in[c, W - 1 - r].
        rotated = [np.rot90(real[i, r, 0]) for r in range(3)]
        match_a = [r for r in range(3) if np.array_equal(a[row, 0].numpy(), real[i, r, 0])]
        match_b = [r for r in range(3) if np.array_equal(b[row, 0].numpy(), rotated[r])]
        assert len(match_a) == 1 and len(match_b) == 1 and match_a != match_b


def test_b_rotation_swaps_vertical_and_horizontal(clean_glyph):
    split = clean_glyph.train
    a, b = make_views(clean_glyph, "B")(split, torch.arange(len(split)))
    swap = {0: 1, 1: 0, 2: 2}
    assert [_moment_class(x[0].numpy()) for x in a] == split.labels.tolist()
    assert [_moment_class(x[0].numpy()) for x in b] == [swap[c] for c in split.labels.tolist()]


def test_augmentations_keep_the_glyph_class(clean_glyph):
    torch.manual_seed(0)
    split = clean_glyph.train
    a, b = make_views(clean_glyph, "augment")(split, torch.arange(len(split)))
    labels = split.labels.tolist()
    agree = sum(_moment_class(v[0].numpy()) == c for views in (a, b) for v, c in zip(views, labels))
    assert agree / (2 * len(labels)) >= 0.98
    assert not torch.equal(a, split.images)


def test_strength_zero_augment_is_identity_and_a_with_strength_is_augmented(glyph):
    idx = torch.tensor([3, 1, 4])
    a, b = make_views(glyph, "augment", strength=0)(glyph.train, idx)
    assert torch.equal(a, glyph.train.images[idx]) and torch.equal(b, glyph.train.images[idx])
    torch.manual_seed(0)
    a, b = make_views(glyph, "A", strength=0.5)(glyph.train, idx)
    real = glyph.train.realisations[idx]
    assert not any(torch.equal(a[k], real[k, r]) for k in range(3) for r in range(3))


def test_reproducible_from_torch_rng(glyph):
    for mode in ("augment", "A", "B"):
        views = make_views(glyph, mode, strength=0.7)
        torch.manual_seed(123)
        first = views(glyph.train, torch.arange(16))
        state = torch.get_rng_state()
        second = views(glyph.train, torch.arange(16))
        torch.manual_seed(123)
        again = views(glyph.train, torch.arange(16))
        torch.set_rng_state(state)
        again2 = views(glyph.train, torch.arange(16))
        assert all(torch.equal(x, y) for x, y in zip(first, again))
        assert all(torch.equal(x, y) for x, y in zip(second, again2))
        assert not torch.equal(first[0], second[0])


def test_config_is_reported(glyph):
    views = make_views(glyph, "augment", strength=0.5, crop_scale=(0.8, 1.0), flip=False)
    assert views.config == dict(mode="augment", strength=0.5, crop_scale=[0.8, 1.0], flip=False, device="cpu")


def test_a_and_b_need_realisations():
    ds = _rgb_dataset()
    for mode in ("A", "B"):
        with pytest.raises(ValueError, match="no realisations"):
            make_views(ds, mode)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(mode="C"), ValueError, "mode"),
    (dict(strength=-1.0), ValueError, "strength"),
    (dict(strength=float("nan")), ValueError, "strength"),
    (dict(crop_scale=(0.0, 1.0)), ValueError, "crop_scale"),
    (dict(crop_scale=(0.9, 0.5)), ValueError, "crop_scale"),
])
def test_bad_arguments(glyph, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_views(glyph, **kwargs)


def test_bad_indices(glyph):
    views = make_views(glyph, "A")
    with pytest.raises(ValueError, match=r"\[0, 24\)"):
        views(glyph.train, torch.tensor([0, 24]))
    with pytest.raises(ValueError, match=r"\[0, 24\)"):
        views(glyph.train, torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer"):
        views(glyph.train, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        views(glyph.train, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="Tensor"):
        views(glyph.train, [0, 1])
    with pytest.raises(TypeError, match="Split"):
        make_views(glyph, "A")(glyph, torch.arange(2))
    with pytest.raises(TypeError, match="Dataset"):
        make_views(glyph.train, "A")


def test_split_rejects_out_of_range_or_mismatched_tensors():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Split(images=torch.full((2, 1, 4, 4), 1.5), labels=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Split(images=torch.full((2, 1, 4, 4), float("nan")), labels=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="2 images but 3 labels"):
        Split(images=torch.zeros(2, 1, 4, 4), labels=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="realisations"):
        Split(images=torch.zeros(2, 1, 4, 4), labels=torch.zeros(2, dtype=torch.long),
              realisations=torch.zeros(2, 1, 1, 4, 4))
    with pytest.raises(ValueError, match="empty"):
        Dataset(name="x", class_names=["a"], train=Split(torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.long)),
                val=Split(torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.long)),
                test=Split(torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.long)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is missing")
def test_cuda_device_without_cuda(glyph):
    with pytest.raises(ValueError, match="CUDA is not available"):
        make_views(glyph, "A", device="cuda")
