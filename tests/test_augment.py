"""Batched augmentation: each op acts per image, as one op over the batch."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfshard.readers import augment  # noqa: E402


def _batch(n=32, h=6, w=5):
    return tf.constant(np.random.default_rng(0).integers(0, 256, (n, h, w, 3)), tf.uint8)


def test_flip_mirrors_some_images_exactly_and_leaves_the_rest():
    images = _batch()
    flipped = augment.random_flip_batch(images, tf.constant([1, 2], tf.int64)).numpy()
    mirrored = [np.array_equal(f, i[:, ::-1]) for f, i in zip(flipped, images.numpy())]
    kept = [np.array_equal(f, i) for f, i in zip(flipped, images.numpy())]
    assert all(m or k for m, k in zip(mirrored, kept))
    assert 4 < sum(mirrored) < 28  # about half, per image


def test_crop_reads_uint8_and_returns_unit_floats_of_the_asked_size():
    cropped = augment.random_resized_crop_batch(_batch(h=40, w=40), (8, 10), tf.constant([3, 4], tf.int64))
    assert cropped.dtype == tf.float32 and cropped.shape == (32, 8, 10, 3)
    assert 0.0 <= float(tf.reduce_min(cropped)) and float(tf.reduce_max(cropped)) <= 1.0


def test_default_augment_is_seeded_and_in_range():
    images = _batch(h=40, w=40)
    seed = tf.constant([5, 6], tf.int64)
    a = augment.default_augment(images, seed, crop_to=(16, 16))
    b = augment.default_augment(images, seed, crop_to=(16, 16))
    c = augment.default_augment(images, tf.constant([5, 7], tf.int64), crop_to=(16, 16))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), c.numpy())
    assert 0.0 <= float(tf.reduce_min(a)) and float(tf.reduce_max(a)) <= 1.0
