"""The window-start stream and the gather: what turns resident arrays into batches of windows.

``index_batches`` is a dataset of window *start rows* (int32 below 2**31 rows: 4
bytes a window): each epoch they are permuted as one op (``stateless_shuffle``,
seeded per epoch), cut into batches, and (``gather_batches``) every batch becomes
windows with one vectorised gather of rows ``starts[:, None] + range(points / g)``
(``sampling_rate`` apart when points are), placed on the arrays' device
(``gather_windows``); ``Episodes`` adds what a window needs of its episode (keys,
the mask of a padded window, the label). ``readers/windows/resident.py``
places the arrays and builds one such pipeline per replica; ``in_model.py`` runs
the same gather inside the model's step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from ..epoch_guard import Stamp
from ..input_position import InputPosition, opened
from ..options import external_state_ignored, quiet_options, random_numbers
from ..windowing.starts import INT32_LIMIT  # tf.data's skip() takes a C++ int: a larger count silently wraps
from .layout import Concatenated, Layout

AUTOTUNE = tf.data.AUTOTUNE


def index_batches(
    starts: np.ndarray, *, batch_size: int, shuffle: bool, seed: int, drop_remainder: bool, replica: int, replicas: int,
    limit: int | None = None, repeat: bool = False, start_step: int | InputPosition = 0, then: Callable | None = None,
    where: str = "resident windows", epoch_check: Callable | None = None, stamp: Stamp | None = None,
) -> tf.data.Dataset:
    """Batches of window starts for one replica; a fresh seeded permutation of all starts each epoch.

    Each epoch permutes the starts as one op (``stateless_shuffle`` keyed by the epoch's seed) and slices
    batches from it. Replica ``r`` of ``n`` takes positions ``r, r + n, ...`` of the permutation, so replicas'
    shares are disjoint. Under ``resumable_options`` (symbolic checkpointing) a ``tf.train.Checkpoint`` of
    the iterator holds only the epoch's seed and positions: a few KB; a restore recomputes the permutation.

    ``limit``: use only the first ``limit`` positions of each epoch's permutation (equal steps across workers).
    ``repeat``: epoch after epoch, each with a new permutation, in one iterator (whose checkpoint then holds
    the epoch too). Epoch ``e``'s seed is then the e-th pair of ``Dataset.random(seed)``, so the stream is a
    pure function of ``seed`` and the step: ``start_step`` starts it at any step without reading the ones before
    (an ``InputPosition``: the step it holds when the iterator opens, ``readers.BackupAndRestore``'s).
    ``then``: a function of the start rows run in one parallel map (the gather: one map, one hand-off).
    ``epoch_check``: () -> op, run by each epoch's function (``EpochGuard.check``: the arrays were loaded from
    shards once, so each epoch checks they are still the dataset at the path).
    ``stamp``: the ``Stamp`` of the shards the episodes were loaded from (``EpochGuard.stamp``): each epoch's
    function checks it, so a checkpoint restores only into an index of the same data (a restore runs the current
    epoch's function again first). Once an epoch: as ``Stamp.lead`` per batch it cost 40% of the windows/s.
    """
    usable = len(starts) if limit is None else min(limit, len(starts))
    per_replica = usable // replicas  # equal shares, so no replica runs out of steps before the others
    full, tail = divmod(per_replica, batch_size)
    tail = 0 if drop_remainder else tail
    per_epoch = full + (1 if tail else 0)
    all_starts = tf.constant(starts)

    def epoch(seed_pair):
        order = tf.random.experimental.stateless_shuffle(all_starts, seed_pair) if shuffle else all_starts
        mine = order[replica : replica + per_replica * replicas : replicas]
        batches = tf.data.Dataset.from_tensor_slices(tf.reshape(mine[: full * batch_size], [full, batch_size]))
        if tail:
            batches = batches.concatenate(tf.data.Dataset.from_tensors(mine[full * batch_size :]))
        return batches

    def rows(index: tf.data.Dataset) -> tf.data.Dataset:
        return index if then is None else index.map(then, num_parallel_calls=AUTOTUNE, deterministic=True)

    def stamped(seeds: tf.data.Dataset) -> tf.data.Dataset:  # (stamp element, epoch, seed pair): no map to flatten
        # One zip with the epoch's count (enumerate() would add a second zip and a graph rewrite to set up); without
        # a stamp, the count is its element too.
        epochs = tf.data.Dataset.range(0, 2**63 - 1)
        return tf.data.Dataset.zip((stamp.stamps(), epochs, seeds) if stamp is not None else (epochs, epochs, seeds))

    def checked(stamp_element, e, seed_pair):  # the epoch's seed, once its stamp and its data are checked
        return once_checked(seed_pair, stamp, stamp_element, e, epoch_check)

    if repeat:
        if not per_epoch:  # an endless stream of empty epochs would never yield: refuse it
            raise ValueError(f"{where}: {usable} windows over {replicas} replicas leave replica {replica} no batch "
                             "in an epoch, so repeat=True would never yield one; pass a smaller batch_size or use "
                             "fewer replicas")
        first = start_step.first if isinstance(start_step, InputPosition) else start_step
        if first // per_epoch > INT32_LIMIT:
            raise ValueError(f"{where}: start_step={first} is {first // per_epoch} epochs in; tf.data skips at most "
                             f"{INT32_LIMIT}; pass the step count the job saved")

        def from_step(step):
            first_epoch, first_batch = step // per_epoch, step % per_epoch
            seeds = stamped(random_numbers(seed).batch(2, drop_remainder=True).skip(first_epoch))
            return seeds.flat_map(lambda s, e, seed_pair: epoch(checked(s, e, seed_pair)).skip(
                tf.where(e == 0, first_batch, tf.constant(0, tf.int64))))

        return rows(opened(start_step, from_step))
    seeds = random_numbers(seed, rerandomize_each_iteration=True).batch(2, drop_remainder=True).take(1)
    seeds = stamped(seeds)
    return rows(seeds.flat_map(lambda s, e, seed_pair: epoch(checked(s, e, seed_pair)))).apply(
        tf.data.experimental.assert_cardinality(per_epoch))


def once_checked(value: tf.Tensor, stamp: Stamp | None, stamp_element: tf.Tensor, position: tf.Tensor,
                 epoch_check: Callable | None) -> tf.Tensor:
    """``value``, once ``stamp_element`` is checked as the ``position``-th of ``stamp``'s (a checkpoint restores only
    into the same data) and ``epoch_check()`` passes (the data loaded is still the dataset at its path): what each
    epoch's (or stream chunk's) function of the window index runs first."""
    checks = ([stamp.check(stamp_element, position)] if stamp is not None else []) + (
        [epoch_check()] if epoch_check is not None else [])
    if not checks:
        return value
    with tf.control_dependencies(checks):
        return tf.identity(value)


class Episodes:
    """What a batch of window start rows needs to know of their episodes: which one each window is in, where it
    starts in it (the keys, the mask of a padded window), and its label. Small constants, one entry per episode.

    ``labels``: the labels' variable (on the arrays' device), or None.
    ``sources``: each episode's source (its dataset's index in a mixture's paths), int32, or None; given, the keys
    hold ``"source"`` too (``with_source``).
    """

    def __init__(self, data: Concatenated, dtype: tf.DType, labels: tf.Variable | None = None,
                 sources: np.ndarray | None = None):
        self.row = data.row
        offsets = data.offsets
        self.first_rows = tf.constant((offsets // data.row).astype(dtype.as_numpy_dtype))  # each segment's first row
        self.begin = tf.constant((offsets + data.pad).astype(np.int64))  # the step where each episode's slice starts
        self.lo = tf.constant(np.asarray([data.spec.bounds(t)[0] for t in data.lengths], np.int64))
        self.ids = tf.constant(np.asarray(data.ids, np.int64))
        self.labels = labels
        self.sources = None if sources is None else tf.constant(np.asarray(sources, np.int32))

    def episode_of(self, starts: tf.Tensor) -> tf.Tensor:
        """Each window's episode (its index here, not its id)."""
        return tf.searchsorted(self.first_rows, starts, side="right") - 1

    def locate(self, starts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Each window's episode (index) and start step relative to its slice (negative: padded)."""
        episode = self.episode_of(starts)
        return episode, tf.cast(starts, tf.int64) * self.row - tf.gather(self.begin, episode)

    def keys(self, episode: tf.Tensor, start: tf.Tensor) -> dict[str, tf.Tensor]:
        """``{"episode": id, "step": start}``: the episode's id (source order) and the step of the episode itself;
        and ``"source"`` when the episodes' sources are known."""
        keys = {"episode": tf.gather(self.ids, episode), "step": tf.gather(self.lo, episode) + start}
        return keys if self.sources is None else {**keys, "source": tf.gather(self.sources, episode)}


def _gather_rows(array: tf.Variable, rows: tf.Tensor) -> tf.Tensor:
    """A gather straight from the variable's buffer, never a read of the whole array. A mirrored variable in a
    replica's step gives that replica's own copy (``tf.gather`` would read it whole first: no ``sparse_read``)."""
    try:
        handle = array.handle
    except ValueError:  # a mirrored variable outside any replica's step: tf.gather reads its primary copy
        return tf.gather(array, rows)
    return tf.raw_ops.ResourceGather(resource=handle, indices=rows, dtype=array.dtype)


def gather_windows(arrays: dict, starts: tf.Tensor, ranges: dict[str, tuple[int, int]],
                   sampling_rate: int = 1) -> dict[str, tf.Tensor]:
    """For each name, points ``[first, first + count)`` of every window's span (``ranges``), ``[B, count, ...]``,
    from the row-shaped arrays ``[rows, g, ...]`` at start rows ``starts`` ``[B]``, on the arrays' device: one
    gather of the consecutive rows holding them per window and feature (cut to the points when they do not fill
    whole rows), or, ``sampling_rate`` steps apart (rows of one step then), of ``count`` rows that far apart."""
    out = {}
    for name, (first, count) in ranges.items():
        array = arrays[name]
        row = array.shape[1]
        with tf.device(array.device):
            if sampling_rate == 1:
                low, high = first // row, -(-(first + count) // row)
                rows = starts[:, None] + tf.range(low, high, dtype=starts.dtype)
            else:
                rows = starts[:, None] + tf.range(first, first + count, dtype=starts.dtype) * sampling_rate
            gathered = _gather_rows(array, rows)  # [B, rows, g, ...]: contiguous blocks of g steps
            steps = rows.shape[1] * row
            gathered = tf.reshape(gathered, [tf.shape(starts)[0], steps, *array.shape[2:]])  # no -1: [T, 0] too
            skip = first - low * row if sampling_rate == 1 else 0
            out[name] = gathered if steps == count else gathered[:, skip : skip + count]
    return out


def window_element(arrays: dict, layout: Layout, episodes: Episodes, starts: tf.Tensor, with_keys: bool = False,
                   with_source: bool = False):
    """What ``readers.windows`` yields for a batch of start rows: one gather per feature of the points it needs
    (``Layout.point_ranges``), the element shaped by ``layout``, with the mask of padded windows, the episodes'
    labels and the keys as they ask (``with_source``: ``"source"`` alone without ``with_keys``; ``episodes``
    must know the sources)."""
    spec = layout.spec
    gathered = gather_windows(arrays, starts, layout.point_ranges(), spec.sampling_rate)
    mask = labels = keys = None
    if layout.masked or with_keys:
        episode, start = episodes.locate(starts)
    elif layout.label or with_source:  # the label alone needs no start step: two ops fewer a batch
        episode = episodes.episode_of(starts)
    if layout.masked:
        points = tf.range(spec.length, dtype=tf.int64) * spec.sampling_rate
        mask = start[:, None] + points[None, :] >= 0
    if layout.label:
        with tf.device(episodes.labels.device):
            labels = _gather_rows(episodes.labels, episode)
    if with_keys:
        keys = episodes.keys(episode, start)
    elif with_source:
        keys = {"source": tf.gather(episodes.sources, episode)}
    element = layout.shape(gathered, mask, labels)
    return element if keys is None else (keys, element)


def gather_batches(make_index: Callable, arrays: dict, layout: Layout, episodes: Episodes,
                   with_keys: bool = False, with_source: bool = False) -> tf.data.Dataset:
    """``make_index``: ``index_batches`` with its arguments bound; the gather runs in its map, where the arrays are
    (only the element leaves the device: to the host, see ``readers.windows``)."""
    return make_index(then=lambda starts: window_element(arrays, layout, episodes, starts, with_keys,
                                                                with_source)).prefetch(
        AUTOTUNE).with_options(resumable_options(small=make_index.keywords.get("repeat", False)))


def resumable_options(small: bool) -> tf.data.Options:
    """What lets ``tf.train.Checkpoint(input=iterator)`` save a resident pipeline mid-epoch: the gather's read
    of the resident arrays treated as external state (they never change while the dataset exists).

    ``small`` (``repeat=True``, the resume path): symbolic checkpointing too, so the checkpoint holds
    positions into the index (~2 KB), not the prefetched windows (MBs). It costs ~10% of the windows/s
    iterated from Python (measured A/B, 1 channel), so one-epoch datasets keep TensorFlow's explicit mode.
    """
    options = external_state_ignored(quiet_options())
    options.experimental_symbolic_checkpoint = small
    return options
