"""Reading a shard only as it was when its pipeline was built: a re-conversion of OUT is an error, not a mix.

A pipeline lists its shards once, when it is built; a conversion into the same
OUT (``--overwrite``) can replace them while it runs. Reading on would mix the
two datasets in one epoch (and a cache would save that mixture as complete).
So each shard's identity (``format.storage.file_identity``: size, mtime, and
locally inode and ctime) is taken at build time and checked again, every epoch,

1. just before the shard is opened: a shard replaced or changed since the build
   is never opened, none of its records is read;
2. after its last record: a shard replaced in the instant between that check and
   the open (the open itself), or rewritten in place (never tfshard's way), fails
   its read there, so the epoch fails before it ends; its records up to then have
   been handed on.

A failed check fails one pull: the stages after the reads pull again and the reads
go on to their end. So the epoch that fills a cache must also end with every record
and with the dataset unchanged (``images._cached_and_shuffled``), else it ends in an
error and the cache is not completed.

A third check, once the file was open, would close that instant too, at a
function set up by every iterator (~0.04-0.1 s of every first batch) and a
``zip`` step per record (docs/design.md, "Why a reader's first batch is fast"),
so only the reads that skip a changed shard (``ignore_errors``) make it: their
epoch does not fail, so a shard swapped at its open must yield none of its
records (the check after the last would only log it, its records handed on).

A shard that fails a check raises ``InvalidArgumentError`` naming it (so no
cache is finalised from the epoch), or, with ``ignore_errors``, is logged and
skipped. The checks are Python (``tf.py_function``, a stat per check, one
request on gs://), so they run in this process only: a tf.data service's
workers read without them (a service ships the graph, and Python functions
cannot travel with it). A shard that is not read again (a cache, a shard
cache's copy, resident episodes) is checked by ``epoch_guard.py`` instead, at
the start of every epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tensorflow as tf

from ..format.storage import NotRegularFileError, file_identity
from .options import external_state_ignored
from .python_steps import assert_no_problem, no_problem, problem_step

log = logging.getLogger(__name__)


def changed_shard(path: str, what: str, when: str) -> str:
    """The message for a shard that is no longer the file a pipeline was built on (``what`` happened to it)."""
    return (f"{path}: shard {what} since the pipeline reading it was built (seen {when}); a conversion into its "
            "folder must not run while a pipeline reads it: build the pipeline again to read the new data")


class ShardGuard:
    """The build-time identities of a pipeline's shards, and the check of one against its file now.

    Args:
      shards: ``files.ShardFile``s as ``check_shards`` made them.
      strict: raise (False: log and skip the shard, as ``ignore_errors`` asks).
    """

    def __init__(self, shards: Sequence, strict: bool):
        self.shards, self.strict = list(shards), strict

    def problem(self, index: int, when: str) -> str:
        """"" when shard ``index`` is still the file the pipeline was built on, else what happened to it."""
        shard = self.shards[index]
        try:
            now = file_identity(shard.path)
        except FileNotFoundError:
            what = "is gone"
        except (NotRegularFileError, OSError) as e:
            what = f"cannot be read as it was ({e})"
        else:
            if now == shard.identity:
                return ""
            what = f"was replaced or changed (size {shard.identity[0]} -> {now[0]} bytes)"
        message = changed_shard(shard.path, what, when)
        if not self.strict:
            log.warning("%s; skipping the rest of it (ignore_errors=True)", message)
        return message

    def check(self, index: tf.Tensor, when: str) -> tf.Tensor:
        """The graph op of ``problem``: a scalar string, empty when the shard is unchanged."""
        return problem_step(lambda i: self.problem(int(i), when), [index])

    def read(self, index: tf.Tensor, path: tf.Tensor, open_records) -> tf.data.Dataset:
        """``open_records(path)``'s records of shard ``index``, checked just before the open and after the last
        record (see the module docstring). Two functions per read, the fewest that place the checks: this one and
        the check after the last record (every function is traced when the pipeline is built and set up again by
        each iterator, so each one costs a pipeline's first batch ~10-20 ms of CPU). Not strict (``ignore_errors``):
        also checked once open (``_skipped_if_swapped_at_its_open``)."""
        before = self.check(index, "before it was opened")
        if self.strict:
            with tf.control_dependencies([assert_no_problem(before)]):  # on the dataset ops made here
                records = open_records(path)
        else:  # a shard gone or changed is skipped without opening it (TensorFlow would retry a failed open forever)
            records = tf.data.Dataset.from_tensors(path).filter(lambda _: no_problem(before)).flat_map(open_records)
            records = self._skipped_if_swapped_at_its_open(index, records)

        def after_the_last(_):  # never True: the check after the last record, as a filter of one placeholder
            problem = self.check(index, "by the end of its read")
            if not self.strict:
                return tf.logical_and(no_problem(problem), False)
            with tf.control_dependencies([assert_no_problem(problem)]):
                return tf.constant(False)

        return records.concatenate(tf.data.Dataset.from_tensors(tf.constant(b"")).filter(after_the_last))

    def _skipped_if_swapped_at_its_open(self, index: tf.Tensor, records: tf.data.Dataset) -> tf.data.Dataset:
        """``records``, or none of them if shard ``index`` was swapped in the instant between the check before the
        open and the open: skipping a shard (``ignore_errors``) must not hand on its records first, as the strict
        read may (its epoch fails anyway). The check rides on a dataset zipped beside the records: ``zip`` asks the
        records first, so it runs once the file is open and its first record read; then a constant repeats. Three
        functions more, for the ``ignore_errors`` reads only."""
        first = tf.data.Dataset.from_tensors(index).map(lambda i: no_problem(self.check(i, "once it was opened")))
        marks = first.concatenate(tf.data.Dataset.from_tensors(tf.constant(True)).repeat())
        return tf.data.Dataset.zip((records, marks)).take_while(lambda record, ok: ok).map(lambda record, ok: record)


def checkpointable(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A pipeline with guarded reads, still savable by ``tf.train.Checkpoint(iterator)``: the checks' Python
    function is "external state" to tf.data, which refuses to save it by default, but it holds no state (each
    check stats the file anew), so there is nothing to save or restore."""
    return dataset.with_options(external_state_ignored())
