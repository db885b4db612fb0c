"""``readers.model_windows()``: resident windows gathered inside the model's step, where the model runs.

A tf.data pipeline runs on the host: a dataset function's outputs are placed on
the dataset's (CPU) device even when it reads a GPU variable, so windows gathered
inside the pipeline (``readers.windows``) travel device → host → device every
batch. Here the pipeline yields only window *start rows* (int32, 4 bytes a
window), and a Keras layer holding the resident arrays turns them into windows
inside the train step, on the arrays' device: nothing but the starts crosses the
bus. Under a ``tf.distribute`` strategy the arrays are mirrored variables (one
copy on each replica's device) and each replica gathers from its own copy.

    windows = readers.model_windows("runs-tfr", length=256, shift=16, batch_size=64, features="obs",
                                    targets="same")
    model = windows.wrap(autoencoder)       # a keras.Model taking start rows
    model.compile("adam", "mse")
    model.fit(windows.starts, epochs=10)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from ...format.objects import use_storage_options
from ..arguments import DEFAULT_READ_BUFFER_BYTES, check_not_empty, per_replica_text
from ..graph_ready import without_autograph
from ..indexed.request import stream_request
from ..indexed.stream import Position
from ..input_position import InputPosition, attach
from ..windowing.starts import row_steps_of, start_rows
from ..windowing.targets import TargetsArg
from .dataset import plan_mixture, plan_resident
from .index import Episodes, index_batches, resumable_options, window_element
from .layout import LABEL_ARRAY, Concatenated, Layout
from .mixture import check_epoch_batches, stream_of
from .request import WindowRequest
from .resident import (
    check_batch_divides,
    default_device,
    draw_seed,
    pick_strategy,
    report_short_episodes,
    resident_variables,
    variables_on,
)
from .stream import stream_batches

AUTOTUNE = tf.data.AUTOTUNE


class _Resident:
    """The resident arrays and how start rows become dataset elements. A plain object on purpose: Keras and
    ``tf.train.Checkpoint`` track only trackable attributes, so the data is never saved with the model."""

    def __init__(self, arrays: dict[str, tf.Variable], layout: Layout, episodes: Episodes, dtype: tf.DType):
        self.arrays, self.layout, self.episodes, self.dtype = arrays, layout, episodes, dtype
        # Per thread (a MirroredStrategy traces each replica's step on its own thread): the start rows of the last
        # gather and its element, so the targets of a step reuse the gather its inputs made.
        self._last = threading.local()

    def element(self, starts: tf.Tensor):
        """What ``readers.windows`` would yield for these start rows: inputs, or ``(inputs, targets)``."""
        # Keras also traces in scratch graphs: reuse a gather only within the graph that made it.
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        last = getattr(self._last, "pair", None)
        if graph is not None and last is not None and last[0] is starts and last[1] is graph:
            return last[2]
        # Keras builds a model on symbolic inputs of its own dtype (float32 under a strategy): cast them back.
        element = window_element(self.arrays, self.layout, self.episodes, tf.cast(starts, self.dtype))
        self._last.pair = (starts, graph, element)
        return element

    def keys(self, starts: tf.Tensor) -> dict[str, tf.Tensor]:
        """``{"episode": id, "step": start}`` of each window, as ``readers.windows(with_keys=True)`` gives them."""
        return self.episodes.keys(*self.episodes.locate(tf.cast(starts, self.dtype)))

    def inputs(self, starts: tf.Tensor):
        element = self.element(starts)
        return element[0] if self.layout.targets is not None else element

    def targets(self, starts: tf.Tensor):
        return self.element(starts)[1] if self.layout.targets is not None else None


class WindowGather(keras.layers.Layer):
    """start rows ``int32 [B]`` → the windows ``readers.windows`` would yield as inputs, gathered on the arrays'
    device (under a strategy, each replica's own copy). Holds no weights: saving a model saves none of the data."""

    def __init__(self, resident: _Resident, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self._resident = resident

    def call(self, starts):
        return self._resident.inputs(starts)


class WindowModel(keras.Model):
    """``model`` fed by start rows: the inputs are gathered in ``call``, the targets for the loss and the metrics
    from the same gather (one gather per step, where the step runs)."""

    def __init__(self, model: keras.Model, gather: WindowGather, **kwargs):
        super().__init__(**kwargs)
        self.model, self.gather = model, gather

    def call(self, starts, training=None):
        return self.model(self.gather(starts), training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(x, self.gather._resident.targets(x), y_pred, sample_weight, training=training)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, self.gather._resident.targets(x), y_pred, sample_weight)


@dataclasses.dataclass(frozen=True)
class ModelWindows:
    """What ``model_windows`` returns.

    Attributes:
      starts: a ``tf.data.Dataset`` of int32 ``[B]`` window start rows (global batches; Keras splits
        them over the replicas), a new seeded permutation every epoch; ``len()`` known.
      layer: a Keras layer, start rows → the inputs ``readers.windows`` would yield.
      arrays: the resident ``tf.Variable`` per feature, ``[rows, g, ...]`` (mirrored under a strategy:
        ``strategy.experimental_local_results(v)`` lists the per-replica copies).
      row: steps per row ``g``.
    """

    starts: tf.data.Dataset
    layer: WindowGather
    arrays: dict[str, tf.Variable]
    row: int

    def wrap(self, model: keras.Model) -> keras.Model:
        """A ``keras.Model`` that takes start rows: ``fit``/``evaluate``/``predict`` on ``starts`` gather inputs
        and targets in the step. Save or export ``model`` itself: the wrapper holds only the gather."""
        return WindowModel(model, self.layer)

    def element(self, starts: tf.Tensor):
        """Start rows → ``(inputs, targets)`` (or inputs), for a custom training loop."""
        return self.layer._resident.element(starts)

    def keys(self, starts: tf.Tensor) -> dict[str, tf.Tensor]:
        """Start rows → ``{"episode": int64 [B], "step": int64 [B]}``: each window's episode id and start step (what
        ``readers.windows(with_keys=True)`` adds), to match predictions to sources in evaluation."""
        return self.layer._resident.keys(starts)


def _variables(data: Concatenated, strategy: tf.distribute.Strategy | None, device: str | None):
    if strategy is None:
        return variables_on(data, [device or default_device()])[0]
    with strategy.scope():  # mirrored: one copy per replica, each read on its own device in the step
        return resident_variables(data)


@without_autograph
def model_windows(
    path: str | Sequence[str],
    split: str = "train",
    *,
    length: int,
    shift: int = 1,
    batch_size: int,
    features: str | Sequence[str] | None = None,
    targets: TargetsArg = None,
    sampling_rate: int = 1,
    time_range: tuple | None = None,
    padding: str | None = None,
    pad_value=0,
    shuffle: bool = True,
    seed: int | None = None,
    drop_remainder: bool = True,
    device: str | None = None,
    strategy: tf.distribute.Strategy | None = None,
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    repeat: bool = False,
    start_step: int = 0,
    weights: Sequence[float] | None = None,
    epoch_size: int | None = None,
    balance: str | None = None,
    with_source: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> ModelWindows:
    """Sliding windows as ``readers.windows`` gives them, gathered in the model's step instead of the pipeline.

    Use it when the model runs on an accelerator: only 4 bytes a window cross
    the bus. ``readers.windows`` suits a CPU-only model or a custom loop that
    wants windows as data. Same windows, order and seeds: the ``starts``
    dataset is ``readers.windows``' index dataset, and ``layer`` its gather.

    Args:
      path, split: as for ``readers.windows``.
      length, shift, batch_size, features, targets, sampling_rate, time_range, padding, pad_value, shuffle, seed,
        drop_remainder, device, read_buffer_bytes, repeat, start_step: as ``WindowRequest`` documents them
        (``targets="label"``: the episodes' labels, mirrored too; ``repeat``/``start_step``: ``starts`` runs epoch
        after epoch from one iterator, checkpointable, or started at a saved step, under a strategy too, where
        Keras distributes ``starts``; seeded, ``readers.BackupAndRestore`` moves it).
      weights, epoch_size, balance, with_source: as for ``readers.windows`` (a list of paths too): ``starts`` then
        reads the stream's global batches, so ``start_step`` counts global steps on any replica count (Keras
        splits each global batch into contiguous per-replica slices); ``with_source`` adds ``"source"`` to
        ``keys(starts)``.
      strategy: a single-worker ``tf.distribute`` strategy (``MirroredStrategy``,
        ``OneDeviceStrategy``); picked up from an enclosing ``strategy.scope()``.
        Each replica holds a full copy of the arrays. For several workers, use
        ``readers.windows(strategy=...)``, where each worker holds only its shards (on the stream: every window).
        Keras splits ``starts`` over several workers by its own sharding, not into the stream's contiguous
        slices of each global step, so a multi-worker strategy is refused here.
      storage_options: as for ``readers.images``.

    Returns:
      A ``ModelWindows``: ``starts`` (the dataset to fit on), ``layer``, ``arrays``, ``wrap(model)``, and
      ``keys(starts)`` (each window's episode and step: ``with_keys`` for a custom evaluation loop).

    Raises:
      ValueError: as ``readers.windows``; a multi-worker strategy; a batch that does not divide over the replicas.

    Example:
      windows = readers.model_windows("runs-tfr", length=256, shift=16, batch_size=64, features="obs",
                                      targets="same")
      model = windows.wrap(autoencoder)
      model.compile("adam", "mse")
      model.fit(windows.starts, epochs=10)
    """
    use_storage_options(path, storage_options)
    stream = stream_request(path, weights=weights, epoch_size=epoch_size, balance=balance, with_source=with_source)
    where = path if stream is None else stream.where
    request = WindowRequest(
        where=where, length=length, shift=shift, batch_size=batch_size, features=features, targets=targets,
        sampling_rate=sampling_rate, time_range=time_range, padding=padding, pad_value=pad_value, shuffle=shuffle,
        seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy,
        read_buffer_bytes=read_buffer_bytes, repeat=repeat, start_step=start_step, stream=stream)
    batch_size = request.batch_size
    strategy = pick_strategy(strategy)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise ValueError(
            f"{where}: model_windows supports single-worker strategies (got {type(strategy).__name__}); use "
            "readers.windows(..., strategy=strategy), which reads on several workers (each its own shards' "
            "episodes, or on the stream every window)"
        )
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    check_batch_divides(batch_size, replicas, where)
    mixture = None
    if stream is None:
        layout, source = plan_resident(path, split, features, targets, request.read_buffer_bytes,
                                       **request.layout_shape())
    else:
        layout, source, mixture = plan_mixture(stream, split, features, targets, request.read_buffer_bytes,
                                               **request.layout_shape())
    spec = layout.spec
    report_short_episodes(source.where, spec, source.lengths)
    if drop_remainder and mixture is None:
        what = f"batch_size={batch_size}" if replicas == 1 else per_replica_text(batch_size // replicas, batch_size,
                                                                                  replicas)
        check_not_empty(source.where, spec.count(source.lengths), "windows", "for this pipeline", batch_size, what)
    position = Position(1, 0, batch_size, batch_size)  # global batches: Keras splits them over the replicas
    if mixture is not None:
        epoch_size = spec.count(source.lengths) if epoch_size is None else epoch_size
        check_epoch_batches(where, position, epoch_size, drop_remainder)
    row = row_steps_of(spec, source.lengths)
    data = source.load(None, row)
    arrays = _variables(data, strategy, device)
    starts = start_rows(spec, data.lengths, row)
    # A seeded endless stream is a pure function of its start: readers.BackupAndRestore moves it (input_position.py).
    resumable = repeat and (seed is not None or not shuffle)
    start = InputPosition(request.start_step, where) if resumable else request.start_step
    resume = dict(repeat=repeat, start_step=start, where=where, epoch_check=source.epoch_check, stamp=source.stamp)
    if mixture is None:
        index = index_batches(starts, batch_size=batch_size, shuffle=shuffle, seed=draw_seed(seed),
                              drop_remainder=drop_remainder, replica=0, replicas=1, **resume)
    else:
        index = stream_batches(starts, stream=stream_of(mixture, spec, data.lengths, shuffle=shuffle,
                                                        seed=draw_seed(seed)),
                               position=position, drop_remainder=drop_remainder, **resume)
    dtype = index.element_spec.dtype
    sources = mixture.episode_sources if mixture is not None and with_source else None
    episodes = Episodes(data, dtype, arrays.pop(LABEL_ARRAY, None), sources)
    gather = WindowGather(_Resident(arrays, layout, episodes, dtype), name="window_gather")
    starts_ds = attach(index.prefetch(AUTOTUNE).with_options(resumable_options(small=repeat)),
                       start if resumable else None)
    return ModelWindows(starts_ds, gather, arrays, row)
