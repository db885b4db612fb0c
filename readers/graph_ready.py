"""The readers' tf.data functions are traced as written: no AutoGraph conversion of tfshard's own code.

``Dataset.map``, ``flat_map``, ``interleave``, ``filter`` and ``take_while`` run every function they are given through
AutoGraph, which parses its source, rewrites the syntax tree and compiles it again before tracing; and a function
built while another is traced inherits its conversion status. A reader's ~15 functions are graph code already (no
Python ``if`` or ``for`` on a tensor), so converting them changed nothing but the build time: measured with cProfile,
AutoGraph was 1.8 s of a 2.0 s first ``readers.images()`` and 0.35 s of 0.67 s on a second. Each public
reader is therefore built with AutoGraph off (``without_autograph``): every tf.data function made during the call,
at any depth, is traced directly. A user's function (``augment=``) is still converted, as ``Dataset.map`` would
(``as_map_converts``), so Python control flow on tensors keeps working in it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf


def without_autograph(reader: Callable) -> Callable:
    """``reader`` (a public reader's function), building its pipeline with AutoGraph off (see the module docstring).

    Example:
      images = without_autograph(images)  # readers.images(...) then traces its map functions as written
    """
    built = tf.autograph.experimental.do_not_convert(reader)
    return functools.wraps(reader)(built)


def as_map_converts(fn: Callable) -> Callable:
    """A user's function as ``Dataset.map`` would run it, converted by AutoGraph (with whatever it calls), also
    inside a reader built ``without_autograph``. Any callable: a function, a Keras layer, a ``tf.function``.

    Example:
      augment = as_map_converts(lambda images, seed: images if tf.reduce_mean(images) > 0.5 else 1 - images)
    """

    def call(*args):
        return fn(*args)

    return tf.autograph.to_graph(call)
