"""The raw-pixel baseline at any image size: images larger than RAW_PIXEL_SIDE are averaged down
to it, so the baseline's features (and the probe's and kNN's matrices) do not grow with
``--image-size``."""

import dataclasses

import numpy as np
import torch

from contrastkit.metrics import RAW_PIXEL_SIDE, evaluate_encoders, pixel_features, baseline_pixel_images


def test_images_up_to_the_side_are_read_as_they_are():
    images = torch.randint(0, 256, (3, 3, RAW_PIXEL_SIDE, 20), dtype=torch.uint8)
    assert baseline_pixel_images(images) is images


def test_larger_images_become_the_means_of_the_pixels_each_output_pixel_covers():
    images = torch.randint(0, 256, (4, 3, 2 * RAW_PIXEL_SIDE, 2 * RAW_PIXEL_SIDE), dtype=torch.uint8)
    means = images.numpy().astype(np.float64).reshape(4, 3, RAW_PIXEL_SIDE, 2, RAW_PIXEL_SIDE, 2).mean(axis=(3, 5))
    small = baseline_pixel_images(images)
    assert small.dtype == torch.uint8 and small.shape == (4, 3, RAW_PIXEL_SIDE, RAW_PIXEL_SIDE)
    assert np.array_equal(small.numpy(), np.round(means).astype(np.uint8))  # both round half to even
    floats = baseline_pixel_images(images.float() / 255.0)
    assert floats.dtype == torch.float32
    assert np.allclose(floats.numpy(), means / 255.0, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_the_longer_side_is_brought_to_the_side_and_the_shape_kept():
    assert baseline_pixel_images(torch.zeros(1, 1, 224, 160)).shape == (1, 1, RAW_PIXEL_SIDE, round(160 * 32 / 224))
    assert baseline_pixel_images(torch.zeros(1, 3, 100, 1000)).shape == (1, 3, round(100 * 32 / 1000), RAW_PIXEL_SIDE)
    assert baseline_pixel_images(torch.zeros(1, 3, 1, 4096)).shape == (1, 3, 1, RAW_PIXEL_SIDE)


def test_the_baselines_features_of_224_pixel_images_are_those_of_32_pixel_ones():
    images = torch.randint(0, 256, (6, 3, 224, 224), dtype=torch.uint8)
    features = pixel_features(images)
    assert features.dtype == np.uint8 and features.shape == (6, 3 * RAW_PIXEL_SIDE * RAW_PIXEL_SIDE)
    assert np.array_equal(features, baseline_pixel_images(images).reshape(6, -1).numpy())


def test_a_read_out_of_large_images_reads_the_encoders_on_the_full_images():
    """At 64 pixels the baseline reads 32-pixel means, while the encoders still read the images
    themselves: their numbers equal a read-out without the raw pixels."""
    from contrastkit.data import load_dataset

    small = load_dataset("glyphlab", seed=0)

    def upsampled(split):
        images = torch.nn.functional.interpolate(split.images.float(), scale_factor=2, mode="nearest")
        return dataclasses.replace(split, images=images.to(split.images.dtype), realisations=None)

    data = dataclasses.replace(small, train=upsampled(small.train), val=upsampled(small.val),
                               test=upsampled(small.test), image_shape=(0, 0, 0))
    assert max(data.image_shape[1:]) == 2 * max(small.image_shape[1:]) > RAW_PIXEL_SIDE
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(data.image_shape)), 16))
    with_pixels = evaluate_encoders(data, encoder, torch.device("cpu"))
    without = evaluate_encoders(data, encoder, torch.device("cpu"), raw_pixels=False)
    assert {k: v for k, v in with_pixels.items() if not k.startswith("raw_pixel_")} == without
    # The pixels of 2 x 2 nearest-neighbour copies average back to the 32-pixel images exactly.
    at_32 = evaluate_encoders(small, torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(
        int(np.prod(small.image_shape)), 16)), torch.device("cpu"))
    assert {k: v for k, v in with_pixels.items() if k.startswith("raw_pixel_")} == \
        {k: v for k, v in at_32.items() if k.startswith("raw_pixel_")}
