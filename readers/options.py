"""The ``tf.data.Options`` every reader sets, in one place.

Autotune is off everywhere: with it on (TF 2.21), deleting an iterator often blocks until the autotuner's next
optimisation step, so ``model.fit`` paid 0.4-1.3 s between epochs (``benchmarks/images.py``'s model.fit rows);
off, 0.03 s, with the same img/s on 2 cores (AUTOTUNE parallelism then means one thread per core), and the
resident windows' per-batch cost drops ~10%.
"""

from __future__ import annotations

import tensorflow as tf


def quiet_options() -> tf.data.Options:
    """Autotune off (see the module docstring)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def external_state_ignored(options: tf.data.Options | None = None) -> tf.data.Options:
    """``options`` (new ones by default) letting ``tf.train.Checkpoint(iterator)`` save a pipeline whose functions
    read state tf.data cannot save but that never changes while the dataset exists: resident arrays, or the
    shard checks' Python (``readers/guard.py``), which stats the file anew each time, or a resumable input's start
    step (``readers/input_position.py``), read once as its iterator opens."""
    options = options or tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options
