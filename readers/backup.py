"""``readers.BackupAndRestore``: Keras' callback of that name, which also restores the tfshard input's position.

Keras' ``BackupAndRestore`` restores the weights and the epoch, and starts that epoch over: a job killed mid-epoch
trains on the epoch's first batches twice and on its input from wherever the input starts. This subclass (same
arguments) also saves the global steps the input has given, moves the input there before ``model.fit`` opens its
iterator (``readers/input_position.py``) and ends the resumed epoch after the batches it still had to train. So a
killed job, rerun with the same command, trains on exactly the batches an uninterrupted one does.

What it saves, in ``backup_dir``: ``step-N.weights.h5`` (the weights and the optimizer after N global steps) and
``tfshard_state.json`` (the epoch, the batches done in it, the step, which weights file), replaced atomically after
the weights are written. Keras writes its weights file and then its metadata in place, so a kill between the two,
or during the first, left a pair that does not match or a file that does not load; here the state file is the
commit: a kill anywhere leaves the last complete save in force.

    model.fit(readers.images("photos-tfr", batch_size=64, seed=0, repeat=True), epochs=90, steps_per_epoch=20_000,
              callbacks=[readers.BackupAndRestore("backup", save_freq=500)])
"""

from __future__ import annotations

import gc
import json
import posixpath
import re

import keras
import tensorflow as tf

from ..format.errors import NotRegularFileError
from ..format.storage import open_for_reading
from . import input_position

STATE_FILE = "tfshard_state.json"
STATE_FORMAT = "tfshard.BackupAndRestore/1"
_WEIGHTS = re.compile(r"step-\d{1,19}\.weights\.h5")
_MAX_STEP = 2**62


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore`` that also saves and restores the position of a tfshard input.

    The input is one ``readers.images(..., repeat=True, seed=...)`` (either stream: the default one or the
    index-driven one), resident ``readers.windows(..., repeat=True, seed=...)`` or the ``starts`` of
    ``readers.model_windows(..., repeat=True, seed=...)``, fed to ``model.fit`` with ``steps_per_epoch``. On
    ``on_train_begin`` it restores the weights and the optimizer, the epoch, and moves the input to the global step
    the backup had reached; the resumed epoch then trains only its remaining batches. Without a backup the input
    starts at its own ``start_step``. Put it first in ``callbacks``: it ends the resumed epoch early by setting
    ``model.stop_training`` and clears that flag at the epoch's end.

    Args:
      backup_dir: a folder (local or ``gs://``) for this run's backups alone.
      save_freq: ``"epoch"``, or save every this many batches.
      double_checkpoint: keep the save before the last too, restored when the last one's weights do not load.
      delete_checkpoint: delete ``backup_dir`` when ``fit`` ends.
      dataset: the input, or a dataset made from it; None: the one resumable tfshard input alive in this process.

    Raises:
      ValueError: (on ``fit``) no resumable tfshard input or several without ``dataset``, no ``steps_per_epoch``, an
        unbuilt model, or a state file that is not one this callback wrote or whose weights do not load.

    Example:
      ds = readers.images("photos-tfr", batch_size=64, seed=0, repeat=True)
      model.fit(ds, epochs=3, steps_per_epoch=100, callbacks=[readers.BackupAndRestore("bk", save_freq=50)])
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True, *,
                 dataset=None):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        if dataset is not None and input_position.of(dataset) is None:
            raise ValueError(f"{backup_dir}: dataset is not a resumable tfshard input (got {dataset!r}); pass what "
                             "readers.images or readers.windows (or model_windows' starts) returned with "
                             "(..., repeat=True, seed=...), or a dataset made from it")
        self._dataset = dataset
        self._state_path = posixpath.join(str(backup_dir), STATE_FILE)
        self._position = None
        self._state = {"current": None, "previous": None}
        self._epoch = self._batches = self._step = self._begin = 0
        self._resumed_epoch, self._resumed_batches, self._stopped = None, 0, False

    @property
    def step(self) -> int:
        """The global steps the input has given: the restored (or starting) step and the batches trained since."""
        return self._step

    # --- restore -------------------------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._position = self._input()
        steps = self.params.get("steps")
        if not isinstance(steps, int) or steps <= 0:
            raise ValueError(f"{self.backup_dir}: model.fit needs steps_per_epoch on an endless tfshard input, to "
                             f"resume mid-epoch (got steps_per_epoch={steps!r}); pass steps_per_epoch")
        self._load_model()
        self._position.start = self._step

    def _load_model(self):
        if not self.model.built:
            raise ValueError(f"{self.backup_dir}: the model must be built before fit() restores it (got an unbuilt "
                             f"{type(self.model).__name__}); build it first, e.g. by calling it on a batch")
        self._state = _read_state(self._state_path)
        saves = [s for s in (self._state["current"], self._state["previous"] if self.double_checkpoint else None) if s]
        if not saves:
            self._epoch, self._batches, self._step = 0, 0, self._position.first
            return
        for i, save in enumerate(saves):
            weights = posixpath.join(str(self.backup_dir), save["weights"])
            try:
                if self.model.optimizer is not None and not self.model.optimizer.built:
                    self.model.optimizer.build(self.model.trainable_variables)  # its variables, to load into
                self.model.load_weights(weights)
                break
            except (OSError, ValueError) as e:
                if i + 1 == len(saves):
                    raise ValueError(f"{weights}: the backup's weights do not load into this model (got {e}); "
                                     f"delete {self.backup_dir} to start afresh") from e
        epoch, batches, self._step = save["epoch"], save["batch"], save["step"]
        if batches >= self.params["steps"]:  # saved after its last batch, before its end: the next epoch
            epoch, batches = epoch + 1, 0
        self.model._initial_epoch = epoch  # as Keras' own callback resumes the epoch
        self._epoch, self._batches = epoch, batches
        self._resumed_epoch, self._resumed_batches = epoch, batches

    def _input(self) -> input_position.InputPosition:
        if self._dataset is not None:
            return input_position.of(self._dataset)
        found = input_position.live()
        if len(found) > 1:
            gc.collect()  # a dataset dropped in a reference cycle is not an input
            found = input_position.live()
        if len(found) != 1:
            raise ValueError(f"{self.backup_dir}: BackupAndRestore restores the position of one resumable tfshard "
                             f"input (got {len(found)}: {found}); pass it as readers.BackupAndRestore(..., "
                             "dataset=ds), ds = readers.images(..., repeat=True, seed=...)")
        return found[0]

    # --- count -------------------------------------------------------------------------------------------------

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches = self._resumed_batches if epoch == self._resumed_epoch else 0

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        given = batch - self._begin + 1  # steps_per_execution batches a call
        self._step += given
        self._batches += given
        super().on_train_batch_end(batch, logs)
        if self._epoch == self._resumed_epoch and self._batches >= self.params["steps"]:
            self.model.stop_training = self._stopped = True  # the resumed epoch's batches are all trained

    def on_epoch_end(self, epoch, logs=None):
        if self._stopped:
            self.model.stop_training = self._stopped = False
        self._resumed_epoch = None
        self._epoch, self._batches = epoch + 1, 0
        super().on_epoch_end(epoch, logs)

    # --- save --------------------------------------------------------------------------------------------------

    def _save_model(self):
        folder = str(self.backup_dir)
        tf.io.gfile.makedirs(folder)
        last = self._state["current"]
        if last is not None and last["step"] == self._step:
            weights = last["weights"]  # the same weights (an epoch's end right after its last batch's save)
        else:
            weights = f"step-{self._step}.weights.h5"
            self.model.save_weights(posixpath.join(folder, weights), overwrite=True)
        save = {"epoch": self._epoch, "batch": self._batches, "step": self._step, "weights": weights}
        previous = last if last is not None and last["weights"] != weights else self._state["previous"]
        previous = previous if self.double_checkpoint else None
        self._state = {"current": save, "previous": previous}
        state = {"format": STATE_FORMAT, **self._state}
        temporary = self._state_path + ".tmp"
        with tf.io.gfile.GFile(temporary, "w") as f:
            f.write(json.dumps(state))
        tf.io.gfile.rename(temporary, self._state_path, overwrite=True)  # the commit
        keep = {weights} | ({previous["weights"]} if previous else set())
        for name in tf.io.gfile.listdir(folder):
            if _WEIGHTS.fullmatch(name) and name not in keep:
                tf.io.gfile.remove(posixpath.join(folder, name))


def _read_state(path: str) -> dict:
    """The saves in a state file (none when there is no file), each checked: it may have been edited or damaged.

    Raises:
      ValueError: anything but a state file this callback wrote, naming it.
    """
    if not tf.io.gfile.exists(path):
        return {"current": None, "previous": None}
    fix = f"delete {posixpath.dirname(path)} to start afresh, or restore the file this callback wrote"
    try:
        with open_for_reading(path) as f:  # a FIFO there is refused, not opened (it would block for good)
            text = f.read(65536)
    except NotRegularFileError as e:
        raise ValueError(f"{e}; {fix}") from e
    try:
        state = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise ValueError(f"{path}: not a BackupAndRestore state file (got {text[:80]!r}); {fix}") from e
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("current") is None:
        raise ValueError(f"{path}: not a BackupAndRestore state file (got {str(state)[:80]!r}); {fix}")
    for key in ("current", "previous"):
        save = state.get(key)
        if save is None and key == "previous":
            continue
        keys = {"epoch", "batch", "step", "weights"}
        if not isinstance(save, dict) or set(save) != keys or not all(
                type(save[k]) is int and 0 <= save[k] < _MAX_STEP for k in ("epoch", "batch", "step")) or not (
                isinstance(save["weights"], str) and _WEIGHTS.fullmatch(save["weights"])):
            raise ValueError(f"{path}: its {key} save is not an epoch, batch and step count with a step-N.weights.h5 "
                             f"file (got {save!r}); {fix}")
    return {"current": state["current"], "previous": state.get("previous")}
