"""Batched augmentation: each op acts per image, as one op over the batch."""

import numpy as np
import pytest
import tensorflow as tf
from tfshard.readers import augment


def _batch(n=32, h=6, w=5):
    return tf.constant(np.random.default_rng(0).integers(0, 256, (n, h, w, 3)), tf.uint8)


def test_flip_mirrors_some_images_exactly_and_leaves_the_rest():
    images = _batch()
    flipped = augment.random_flip_batch(images, tf.constant([1, 2], tf.int64)).numpy()
    mirrored = [np.array_equal(f, i[:, ::-1]) for f, i in zip(flipped, images.numpy())]
    kept = [np.array_equal(f, i) for f, i in zip(flipped, images.numpy())]
    assert all(m or k for m, k in zip(mirrored, kept))
    assert 4 < sum(mirrored) < 28  # about half, per image


def test_crop_keeps_uint8_and_gives_the_asked_size():
    images = _batch(h=40, w=40)
    cropped = augment.random_resized_crop_batch(images, (8, 10), tf.constant([3, 4], tf.int64))
    assert cropped.dtype == tf.uint8 and cropped.shape == (32, 8, 10, 3)
    as_float = augment.random_resized_crop_batch(tf.cast(images, tf.float32), (8, 10), tf.constant([3, 4], tf.int64))
    np.testing.assert_allclose(cropped.numpy(), np.round(as_float.numpy()), atol=1)  # the same crop, rounded


@pytest.mark.parametrize("seed", [[3, 4], [[3, 4], [5, 6], [7, 8]]], ids=["batch-seed", "image-seeds"])
def test_a_partial_batch_of_no_static_size_crops_as_a_batch_of_known_size(seed):
    """Without ``drop_remainder`` the batches' shape has no static size; the crop then pads its boxes to the
    pipeline's batch size (a static count for grappler's cost model) and drops the padding's crops: the same
    images as the crop of a batch whose size is known."""
    images, seed = _batch(n=3, h=40, w=40), tf.constant(seed, tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([None, 40, 40, 3], tf.uint8)])
    def partial(batch):
        return augment.random_resized_crop_batch(batch, (8, 10), seed, batch_size=5)

    got = partial(images)
    assert got.shape == (3, 8, 10, 3)
    np.testing.assert_array_equal(got.numpy(), augment.random_resized_crop_batch(images, (8, 10), seed).numpy())


@pytest.mark.parametrize("recipe, dtype", [(augment.default_augment, tf.uint8), (augment.color_augment, tf.float32)])
def test_recipes_are_seeded_and_in_range(recipe, dtype):
    images = _batch(h=40, w=40)
    seed = tf.constant([5, 6], tf.int64)
    a = recipe(images, seed, crop_to=(16, 16))
    b = recipe(images, seed, crop_to=(16, 16))
    c = recipe(images, tf.constant([5, 7], tf.int64), crop_to=(16, 16))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), c.numpy())
    assert a.dtype == dtype and a.shape == (32, 16, 16, 3)
    if dtype == tf.float32:
        assert 0.0 <= float(tf.reduce_min(a)) and float(tf.reduce_max(a)) <= 1.0


def test_default_recipe_is_crop_then_flip_and_nothing_else():
    """Without a crop the default recipe only mirrors images: every pixel value is kept exactly."""
    images = _batch(h=12, w=9)
    out = augment.default_augment(images, tf.constant([1, 1], tf.int64)).numpy()
    for got, source in zip(out, images.numpy()):
        assert np.array_equal(got, source) or np.array_equal(got, source[:, ::-1])


def test_colour_jitter_is_brightness_then_contrast_then_saturation():
    """The one-matrix jitter equals the three steps done one by one (numpy reference), to float rounding."""
    images = tf.random.stateless_uniform([6, 9, 7, 3], [1, 2])
    seed = tf.constant([3, 4], tf.int64)
    got = augment.color_jitter_batch(images, seed, 0.2, 0.3, 0.4).numpy()
    b_seed, c_seed, s_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=3))
    b = tf.random.stateless_uniform([6], b_seed, -0.2, 0.2).numpy()[:, None, None, None]
    c = tf.random.stateless_uniform([6], c_seed, 0.7, 1.3).numpy()[:, None, None, None]
    s = tf.random.stateless_uniform([6], s_seed, 0.6, 1.4).numpy()[:, None, None, None]
    x = images.numpy() + b
    x = (x - x.mean(axis=(1, 2, 3), keepdims=True)) * c + x.mean(axis=(1, 2, 3), keepdims=True)
    x = (x - x.mean(axis=3, keepdims=True)) * s + x.mean(axis=3, keepdims=True)
    np.testing.assert_allclose(got, np.clip(x, 0.0, 1.0), atol=1e-5)
