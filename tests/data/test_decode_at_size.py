"""JPEG files decoded at the size used: the smallest of libjpeg's DCT scales whose sides still
hold what the resize makes of the picture, then the picture's region of it resized on the same
grid. Checked against PIL called directly (the oracle), against a full decode (a few levels of
255 apart), and by its memory: a photo whose full decode is over the input ceiling is read.
"""

import os

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from contrastkit._io import MAX_INPUT_BYTES_ENV  # noqa: E402
from contrastkit.data import ImagePreprocessing, preprocess_image  # noqa: E402
from contrastkit.data.collection import open_collection  # noqa: E402
from contrastkit.data.files import draft_scale, load_image_folder  # noqa: E402
from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, STRETCH  # noqa: E402
from contrastkit.data.streaming import ImageFolderDataset  # noqa: E402


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like picture: smooth colour fields with edges and fine texture (JPEG's
    coefficients at every frequency), so that a scaled decode has something to lose."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / (37 + 11 * c) + y / (53 - 7 * c) + c) for c in range(3)], axis=-1)
    base += 60 * ((x // 97 + y // 61) % 2)[..., None]  # hard edges
    base += rng.normal(0, 12, size=base.shape)  # grain
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def photo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("photos") / "wide.jpg"
    _photo(1003, 777).save(path, quality=92)  # odd sides: the reduced decode's last row and column are partial
    return path


def _oracle_crop(path, side: int) -> np.ndarray:
    """Resize(side) + CenterCrop(side) of a reduced decode, by PIL alone."""
    with Image.open(path) as image:
        width, height = image.size
        short = min(width, height)
        resized = (max(side, round(width * side / short)), max(side, round(height * side / short)))
        _, box = image.draft("RGB", resized)
        image.load()
        whole = image.resize(resized, Image.BILINEAR, box=box)
    left, top = (resized[0] - side) // 2, (resized[1] - side) // 2
    return np.asarray(whole.crop((left, top, left + side, top + side))).transpose(2, 0, 1)


def test_draft_scale_is_the_smallest_dct_scale_that_keeps_the_size(photo_file):
    expected = {(1003, 777): 1, (500, 300): 2, (250, 194): 4, (125, 97): 8, (126, 97): 4, (40, 40): 8}
    for at_least, scale in expected.items():
        with Image.open(photo_file) as image:
            assert draft_scale(image, at_least) == scale, at_least
            image.load()
            assert image.size[0] >= at_least[0] and image.size[1] >= at_least[1]
    with Image.open(photo_file) as image:
        image.load()
    png = photo_file.with_suffix(".png")
    _photo(300, 200).save(png)
    with Image.open(png) as image:
        assert draft_scale(image, (30, 20)) == 1  # only JPEG decodes at a reduced scale


@pytest.mark.parametrize("side", [24, 64, 97])
def test_a_collection_reads_a_jpeg_as_pil_does_at_the_reduced_scale(photo_file, side):
    crop = ImagePreprocessing("RGB", (side, side), SHORTER_SIDE_THEN_CENTRE_CROP)
    assert np.array_equal(crop.read(photo_file), _oracle_crop(photo_file, side))


@pytest.mark.parametrize("side", [24, 64, 97])
def test_the_reduced_decode_is_within_a_few_levels_of_a_full_decode(photo_file, side):
    crop = ImagePreprocessing("RGB", (side, side), SHORTER_SIDE_THEN_CENTRE_CROP)
    reduced = crop.read(photo_file).astype(np.int16)
    full = crop.read(photo_file, full_decode=True).astype(np.int16)
    difference = np.abs(reduced - full)
    assert not np.array_equal(reduced, full)  # it did decode at a reduced scale
    # Bounds from what the two differ by: the DCT's downscale replacing part of the bilinear one
    # (this grainy picture: mean 0.5 to 1.3 levels, 99th percentile 3 to 5, at 24 to 97 px).
    assert difference.mean() < 2.0 and np.percentile(difference, 99) < 8, (difference.mean(), difference.max())


def test_without_the_region_box_the_grid_would_shift(photo_file):
    """The box matters: resizing the whole reduced decode (its sides rounded up) would stretch
    the picture by up to a pixel of the reduced grid and move every edge."""
    side = 24
    with Image.open(photo_file) as image:
        width, height = image.size
        resized = (round(width * side / height), side)
        image.draft("RGB", resized)
        image.load()
        unboxed = np.asarray(image.resize(resized, Image.BILINEAR)).transpose(2, 0, 1).astype(np.int16)
    left = (resized[0] - side) // 2
    unboxed = unboxed[:, :, left:left + side]
    ours = ImagePreprocessing("RGB", (side, side), SHORTER_SIDE_THEN_CENTRE_CROP).read(photo_file).astype(np.int16)
    full = ImagePreprocessing("RGB", (side, side), SHORTER_SIDE_THEN_CENTRE_CROP).read(
        photo_file, full_decode=True).astype(np.int16)
    assert np.abs(ours - full).mean() < np.abs(unboxed - full).mean()


def test_a_class_folder_stream_and_the_export_read_the_same_reduced_pixels(photo_file, tmp_path):
    stretch = ImagePreprocessing("RGB", (40, 56), STRETCH)
    with Image.open(photo_file) as image:
        _, box = image.draft("RGB", (56, 40))
        image.load()
        oracle = np.asarray(image.resize((56, 40), Image.BILINEAR, box=box)).transpose(2, 0, 1)
    streamed, _ = ImageFolderDataset([photo_file], [0], color="RGB", size=(40, 56))[0]
    assert np.array_equal(streamed.numpy(), oracle)
    assert np.array_equal(stretch.read(photo_file), oracle)
    exported = preprocess_image(photo_file, {"input": stretch.contract()})
    assert np.array_equal(exported, oracle[None].astype(np.float32) / np.float32(255.0))
    assert "Image.draft" in stretch.contract()["jpeg_decode"]


def test_a_photo_whose_full_decode_is_over_the_ceiling_is_read_at_the_size_used(tmp_path, monkeypatch):
    """2400 x 1800 RGB decodes to 12.4 MiB whole, 0.2 MiB at 1/8: under a 4 MiB ceiling the
    reduced decode reads it (collection, class folders in memory and streamed); the full one
    is refused, naming the file."""
    root = tmp_path / "photos"
    for i, cls in enumerate(["a", "a", "b", "b"]):
        (root / cls).mkdir(parents=True, exist_ok=True)
        _photo(2400, 1800, seed=i).save(root / cls / f"p{i}.jpg", quality=85)
    big = root / "a" / "p0.jpg"
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "4M")
    crop = ImagePreprocessing("RGB", (32, 32), SHORTER_SIDE_THEN_CENTRE_CROP)
    assert crop.read(big).shape == (3, 32, 32)
    with pytest.raises(ValueError, match="p0.jpg.*ceiling"):
        crop.read(big, full_decode=True)
    held = load_image_folder(root, size=(32, 32), val_fraction=0.25, test_fraction=0.25)
    assert held.train.images.shape[1:] == (3, 32, 32)
    streamed, _ = ImageFolderDataset([big], [0], color="RGB", size=(32, 32))[0]
    assert streamed.shape == (3, 32, 32) and streamed.dtype == torch.uint8
    collection = open_collection(root, size=32)
    image, _ = collection.train[0]
    assert image.shape == (3, 32, 32)


def test_a_class_folder_held_or_streamed_reads_transparent_and_palette_images_as_the_contract_says(tmp_path):
    """Held class folders converted colours their own way (a transparent pixel kept its hidden
    colour); streamed ones and the export's contract composite it over white."""
    from contrastkit.data.streaming import stream_image_folder

    root = tmp_path / "classes"
    rng = np.random.default_rng(1)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(4):
            rgba = rng.integers(0, 256, (20, 24, 4), dtype=np.uint8)
            rgba[..., 3] = np.where(np.arange(24) < 12, 0, 255)  # left half transparent
            Image.fromarray(rgba, "RGBA").save(root / cls / f"t{i}.png")
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).convert("P").save(
                root / cls / f"p{i}.png")
    held = load_image_folder(root, size=(16, 16), val_fraction=0.25, test_fraction=0.25, color="RGB")
    streamed = stream_image_folder(root, size=(16, 16), val_fraction=0.25, color="RGB")
    contract = ImagePreprocessing("RGB", (16, 16), STRETCH)
    for name in ("train", "val", "test"):
        split = getattr(streamed, name)
        files = [split.dataset.path(int(i)) if hasattr(split, "indices") else split.path(i)
                 for i in (split.indices if hasattr(split, "indices") else range(len(split)))]
        expected = np.stack([contract.read(path) for path in files])
        read = np.stack([split[i][0].numpy() for i in range(len(split))])
        assert np.array_equal(read, expected), name
    every = np.concatenate([getattr(held, name).images.numpy() for name in ("train", "val", "test")])
    every = np.round(every * 255).astype(np.uint8)
    files = sorted((root / c / f for c in ("a", "b") for f in sorted(os.listdir(root / c))), key=str)
    expected = {contract.read(path).tobytes() for path in files}
    assert {image.tobytes() for image in every} == expected  # the same pixels, whatever split each fell in
    transparent = contract.read(root / "a" / "t0.png")
    assert (transparent[:, :, :7] == 255).all()  # the transparent half is white


def test_a_library_error_raised_from_none_is_not_taken_for_a_write_error():
    from contrastkit._io import os_error_of

    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("unrelated") from None
    except RuntimeError as err:
        assert os_error_of(err) is None
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail] torch.save's write")
    except RuntimeError as err:
        assert os_error_of(err).errno == 28
