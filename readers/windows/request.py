"""``WindowRequest``: the arguments ``readers.windows``, ``readers.model_windows`` and ``readers.resident_windows``
share, documented once and checked once, before anything is read. Pure: no TensorFlow (a strategy or an input
context is held here, not used).

Each reader keeps its keyword arguments (its public signature) and builds one request from them; the pipeline is
then built from the request alone, so a reader's argument list and its checks are written once, here.

    request = WindowRequest(where="runs-tfr", length=256, shift=16, batch_size=64)
    request.layout_shape()  # {'length': 256, 'shift': 16, 'sampling_rate': 1, ...}: what Layout takes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..arguments import (
    DEFAULT_READ_BUFFER_BYTES,
    MAX_SHUFFLE_BUFFER,
    check_count,
    check_reading,
    check_resume,
    check_seed,
)
from ..indexed.request import StreamRequest
from ..windowing.targets import TargetsArg
from .layout import check_window_args

DEFAULT_SHUFFLE_BUFFER = 16384


@dataclasses.dataclass(frozen=True, kw_only=True)
class WindowRequest:
    """What a windows reader is asked for, checked on construction (numbers as ``int``, then frozen).

    Args:
      where: what errors name: the dataset's path, or ``"resident_windows"``.
      length: window length L in time steps.
      shift: steps between consecutive window starts S.
      batch_size: windows per batch; under a strategy, the global batch (split evenly over replicas).
      features: a feature name (elements are tensors) or a list of names (elements
        are dicts); None means every feature: as a dict, or, when the dataset has
        only one (``data``, from ``.npy`` files), as tensors, just as that name gives.
      targets: None (windows only); ``"same"`` (``(x, x)``, the autoencoder case:
        the same tensor twice, no second gather); a feature name (``(x, that
        feature's window)``); an int horizon H (``(x, the next H steps of x)``);
        ``"label"`` (``(x, the episode's label)``, for a dataset converted with
        episode labels); or a ``readers.Targets(features, width=, offset=)``: the
        last ``width`` points of a span of ``length + offset`` points, of any
        features (forecast another feature, leave a gap, predict the last step).
        One gather of the span serves inputs and targets.
      sampling_rate: steps between the points of a window (keras' name): point k
        of a window starting at step s is step ``s + k·sampling_rate``.
      time_range: ``(a, b)``: use only the steps ``[⌊a·T⌋, ⌊b·T⌋)`` of each episode
        (floats in [0, 1]) or ``[a, b)`` (ints), exactly as if each episode were that
        slice: ``(0.0, 0.8)`` to train and ``(0.8, 1.0)`` to validate, so no window
        straddles the cut.
      padding: None, or ``"start"``: also the windows that begin before an
        episode's (or its slice's) first step, as long as their last input point
        and the span's end lie in it (so targets after the inputs are always
        real), and so episodes shorter than the span; the points before the
        start hold ``pad_value``, and the inputs
        become ``{"inputs": x, "mask": m}`` with ``m`` bool ``[B, length]``, True
        where a point is real.
      pad_value: the value of padded points (default 0).
      shuffle: a new seeded order of windows every epoch. False: resident windows
        come in source order (episode id order: the sorted source files, each
        episode's windows by start step); streamed ones in the manifest's order,
        which is source order for a dataset written with ``--no-shuffle``.
      seed: an int in [0, 2**63 - 1] that makes the order reproducible; None draws one.
      drop_remainder: drop the last partial batch (static batch shapes).
      device: resident mode: where the arrays live (default the first GPU, else the CPU).
      strategy: a ``tf.distribute`` strategy: returns a distributed dataset with one
        resident copy per replica, each replica drawing a disjoint share of the
        windows every epoch. Called inside ``strategy.scope()`` it is picked up.
      with_keys: each element becomes ``(keys, element)``, ``keys = {"episode":
        int64 [B], "step": int64 [B]}``: each window's episode id (its source
        file's place in sorted order, as ``readers.info`` lists) and start step,
        to match predictions to sources in evaluation. Not for ``model.fit``
        (drop them: ``ds.map(lambda keys, element: element)``).
      repeat: resident mode: every epoch, each in a new order, from one endless
        iterator (``model.fit(..., steps_per_epoch=len(readers.windows(...)))``).
        ``tf.train.Checkpoint(input=iter(ds))`` saves that iterator mid-epoch in a
        few KB (the epoch's seed and position; never the arrays or prefetched
        windows) and a restore continues with exactly the windows an uninterrupted
        run would have seen next, this epoch and later ones (docs/guide/resuming.md). Inside ``model.fit``,
        ``readers.BackupAndRestore`` saves and restores the position with the model.
      start_step: with ``repeat``, start the stream at this step (batch) as if
        the ones before had been read: a job that saved only its step count
        (under a strategy, whose distributed iterators TensorFlow cannot
        checkpoint) resumes exactly from it.
      read_buffer_bytes: read buffer per shard of a tf.data read (streamed windows, a shard cache's
        copies); a resident load reads each record whole.
      resident: False streams episodes from the shards instead (data larger than
        device memory); windows are then mixed by a buffer of ``shuffle_buffer``.
      shuffle_buffer: streamed mode: windows the shuffle buffer holds.
      input_context: streamed mode: FILE sharding across input pipelines. On the stream (resident): this pipeline
        reads its contiguous slice of every global step, ``batch_size`` being the per-replica batch
        (``strategy.distribute_datasets_from_function``).
      service: streamed mode: ``"grpc://HOST:PORT"`` of a tf.data service
        dispatcher; reading, windowing, shuffling and batching run on its
        workers (see ``readers.images``: ``seed`` does not reach the workers,
        which shuffle afresh every epoch). Resident windows stay local by
        design: their arrays live in this process's device memory, and a
        service would ship every window over the network.
      service_job_name: clients passing the same name share one stream.
      processing_mode: ``"distributed_epoch"`` (each window once per epoch
        across workers) or ``"parallel_epochs"`` (each worker reads it all).
      stream: the index-driven stream's arguments (``readers/indexed/request.py``'s ``StreamRequest``: a list of
        paths, ``weights``, ``epoch_size``, ``balance``, ``with_source``), or None when none is given (today's
        window index). With it every epoch is the stream's (docs/guide/mixtures.md#windows), ``start_step`` in
        global steps on any replica count; with ``resident=False`` each source is its streamed pipeline and only
        the choice of source comes from the stream (``readers/windows/streamed_mixture.py``: no ``balance``,
        ``repeat`` or ``service``).

    Raises:
      ValueError: a number out of its range (``readers/arguments.py``), ``input_context`` or ``service`` with
        resident windows, ``start_step`` without ``repeat`` (or shuffled without a seed), ``repeat`` streamed,
        ``stream`` streamed with ``balance`` or ``service``.
    """

    where: str
    length: int
    shift: int = 1
    batch_size: int
    features: str | Sequence[str] | None = None
    targets: TargetsArg = None
    sampling_rate: int = 1
    time_range: tuple | None = None
    padding: str | None = None
    pad_value: Any = 0
    shuffle: bool = True
    seed: int | None = None
    drop_remainder: bool = True
    device: str | None = None
    strategy: Any = None
    with_keys: bool = False
    repeat: bool = False
    start_step: int = 0
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES
    resident: bool = True
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    input_context: Any = None
    service: str | None = None
    service_job_name: str | None = None
    processing_mode: str = "distributed_epoch"
    stream: StreamRequest | None = None

    def __post_init__(self):
        where = self.where
        check_window_args(self.length, self.shift, self.batch_size, where)
        shuffle_buffer = check_count(self.shuffle_buffer, "shuffle_buffer", where, high=MAX_SHUFFLE_BUFFER)
        read_buffer_bytes, _ = check_reading(where, read_buffer_bytes=self.read_buffer_bytes)
        # numpy ints would mix dtypes in the graph
        checked = dict(length=int(self.length), shift=int(self.shift), batch_size=int(self.batch_size),
                       shuffle_buffer=shuffle_buffer, read_buffer_bytes=read_buffer_bytes,
                       seed=check_seed(self.seed, where))
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.resident and self.input_context is not None and self.stream is None:
            raise ValueError(f"{where}: input_context is for resident=False; resident mode shards by replica "
                             "(strategy=)")
        if self.resident and self.service is not None:
            raise ValueError(
                f"{where}: service= is for resident=False (got service={self.service!r}); resident windows stay "
                "local by design: their arrays live in this process's device memory, and a service would ship every "
                "window over the network. Pass resident=False to window on service workers"
            )
        start_step = check_resume(self.repeat, self.start_step, where, shuffle=self.shuffle, seed=self.seed)
        object.__setattr__(self, "start_step", start_step)
        if self.stream is not None and not self.resident:
            for given, problem in [
                (self.stream.balance is not None, f"balance={self.stream.balance!r}: each class's windows would "
                 "be a filtered stream of its own, every source read once per class; drop resident=False (the "
                 "windows are then held in memory and balanced by position) or drop balance"),
                (self.service is not None, f"service={self.service!r}: the service's workers share an epoch out by "
                 "files, so the sources' exact shares of it would be lost; read the mixture without service"),
            ]:
                if given:
                    raise ValueError(f"{where}: cannot mix streamed windows (resident=False) with {problem}")
        if self.repeat and not self.resident:
            raise ValueError(f"{where}: repeat= is for resident windows (got resident=False); a streamed epoch's "
                             "shuffle buffer cannot be resumed exactly: repeat the dataset yourself (ds.repeat())")

    def layout_shape(self) -> dict:
        """The keyword arguments ``Layout`` takes of the request: the windows' shape and padding."""
        return dict(length=self.length, shift=self.shift, sampling_rate=self.sampling_rate,
                    time_range=self.time_range, padding=self.padding, pad_value=self.pad_value)
