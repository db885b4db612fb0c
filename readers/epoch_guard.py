"""Every epoch starts by checking that the dataset its pipeline was built on is still the one at its path.

``guard.py`` checks each shard as it is read; a cache (``cache=DIR``, ``"memory"``), a shard cache's verified copy
or device-resident episodes mean the shards are not read again, so after an ``--overwrite`` they would go on
serving the old data. So before each epoch's first element (a dataset of no element, concatenated ahead of the
epoch's part of the pipeline: it runs each time that part is iterated) the pipeline

1. takes the identity of ``OUT/dataset.json`` (``format.dataset.manifest_identity``; on a URL also its sha256,
   as TensorFlow's GCS client may answer a stat from its cache for a few seconds); when it changed, re-reads the
   manifest through the untrusted loader and checks that it still lists every shard of the pipeline under the
   same name, size and sha256 (an ``--append`` does: it only adds shards);
2. takes the identity of each of the pipeline's shard files (16 at a time: on gs:// each is a request) and
   compares it with the one taken when the pipeline was built.

Anything else fails the epoch with ``InvalidArgumentError`` naming OUT and what changed, and saying to build the
pipeline again. Measured on the tests' local 8-shard dataset: the check itself 0.17 ms (9 stats); an epoch of 80
cached images 28 ms longer with it than without (median of 30, on 2 cores at load average 13: mostly setting up
the check's function with each epoch's iterator); nothing per element. The check is Python
(``tf.py_function``), so it runs where the pipeline is iterated: through a tf.data service, in the client at the
start of each of its iterations, not on the workers.

A ``tf.train.Checkpoint`` of an iterator holds what the pipeline had read: file offsets, the shuffle and prefetch
buffers, a memory cache's images, the shard cache's local copies in flight. Restored into a pipeline of other data
(the dataset at the path rewritten since, another dataset, another split or input pipeline) TensorFlow served the
old images on (a memory cache: for good), or crashed in its file cache's restore. So every reader's pipeline is led
by a *stamp* of the data it reads (``Stamp``: a hash of its shards' sha256s, in a stage tf.data restores first),
which a restore checks before anything else is restored: a checkpoint of other data fails the restore, naming the
dataset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import tensorflow as tf

from ..format.dataset import load_manifest, manifest_identity
from ..format.storage import is_url
from .files import DatasetInfo, ShardFile, stat_all
from .options import external_state_ignored
from .python_steps import assert_no_problem, problem_step

try:  # choose_from_datasets without its selector's rewrite for the tf.data service (see Stamp.lead)
    from tensorflow.python.data.ops.directed_interleave_op import _directed_interleave
except ImportError:  # pragma: no cover - every TensorFlow this project supports has it
    _directed_interleave = None


class EpochGuard:
    """A pipeline's dataset as it was built, and the check, at each epoch's start, that it still is.

    Args:
      dataset: ``files.DatasetInfo`` the pipeline was built from (its ``manifest_identity`` taken before the load).
      split: the split read.
      shards: the ``files.ShardFile``s the pipeline reads, as ``files.check_shards`` found them.

    Example:
      guard = EpochGuard(dataset, "train", files.check_shards(dataset, "train", [0, 1]))
      guard.ahead(records)  # each iteration first checks the dataset; fails naming it if it changed
    """

    def __init__(self, dataset: DatasetInfo, split: str, shards: Sequence[ShardFile]):
        self.path, self.split = dataset.path, split
        self.manifest = dataset.manifest_identity
        self.shards = list(shards)

    def changed(self) -> str:
        """"" while the dataset at the path is the one the pipeline was built on, else what changed."""
        if manifest_identity(self.path) != self.manifest:
            try:
                manifest = load_manifest(self.path)
            except (OSError, ValueError) as e:
                return f"its manifest cannot be read as it was ({e})"
            split = manifest.splits.get(self.split)
            listed = {s.file: (s.bytes, s.sha256) for s in (split.shards if split is not None else [])}
            for shard in self.shards:
                if shard.info.file not in listed:
                    return f"its manifest no longer lists shard {shard.info.file} of split {self.split!r}"
                size, sha256 = listed[shard.info.file]
                if (size, sha256) != (shard.info.bytes, shard.info.sha256):
                    return (f"its manifest lists another shard {shard.info.file} (got {size} bytes, sha256 "
                            f"{sha256[:12]}..., was {shard.info.bytes} bytes, sha256 {shard.info.sha256[:12]}...)")
        for shard, (found, error) in zip(self.shards, stat_all([s.path for s in self.shards])):
            if isinstance(error, FileNotFoundError):
                return f"shard {shard.path} is gone"
            if error is not None:
                return f"shard {shard.path} cannot be read as it was ({error})"
            if found != shard.identity:
                return f"shard {shard.path} was replaced or changed (size {shard.identity[0]} -> {found[0]} bytes)"
        return ""

    def problem(self) -> str:
        """"" or the message the epoch fails with."""
        what = self.changed()
        if not what:
            return ""
        return (f"{self.path}: the dataset changed since the pipeline reading it was built ({what}); its cache, "
                "shard cache or resident copy would serve the old data: build the pipeline again to read the "
                "dataset now in the folder")

    def covered_by_reads(self, session) -> bool:
        """True when every epoch reads every shard from OUT itself, each checked as it opens (``guard.py``): local
        shards with no shard cache (``session`` None). The per-shard checks then cover this one, which a reader may
        skip (its function costs a first batch ~15 ms of CPU). Not on a URL: the manifest's sha256 check is this
        one's."""
        return session is None and not any(is_url(s.path) for s in self.shards)

    def ahead(self, dataset: tf.data.Dataset, skippable: bool = False) -> tf.data.Dataset:
        """``dataset``, each iteration of which starts with the check (nothing per element). Its Python holds no
        state, so the result is still savable by ``tf.train.Checkpoint(iterator)``. ``skippable``
        (``ignore_errors``): a failed check is one error, which the pipeline's ``ignore_errors`` logs before reading
        on, instead of failing every later pull (which ``ignore_errors`` would skip forever)."""
        return python_step(dataset, self.problem, once=skippable)

    def behind(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """``dataset``, each iteration of which ends with the check, which then fails that pull and every later one
        of the iteration. A failed shard check fails one pull only (the stages after it pull again and read on), so
        an epoch that read a shard swapped at its open reached its end, and a cache took it as complete; this one,
        in front of the cache, makes such an epoch end in an error instead."""
        return python_step(dataset, self.problem, after=True)

    def check(self) -> tf.Operation:
        """The check as one op, for a function that already runs once an epoch (the window index's epoch function):
        no dataset or function of its own (``ahead``'s costs a first batch ~20 ms). It fails that function, naming
        what changed; run again (the next epoch, or a pull that asks for one), it fails again."""
        return assert_no_problem(problem_step(self.problem, []))

    @property
    def stamp(self) -> Stamp:
        """The stamp of this pipeline's shards (``Stamp``)."""
        return Stamp(self.path, [s.info.sha256 for s in self.shards])


class Stamp:
    """A stamp of the data a pipeline reads (the shards of sha256s ``shas``, in order), which a restore of an
    iterator checkpoint checks before anything else it restores: one of other data fails, naming ``path``.

    The stamp is a 62-bit hash of ``shas``, and an endless ``range`` starting at it (``stamps``). A restore of a
    ``flat_map`` or ``interleave`` runs its function again, before it restores what that function gave, on the input
    element the checkpoint holds (TensorFlow's explicit mode) or on the one its input's restored position gives
    (symbolic mode: a range's position is its value, so the old stamp; hence a range to the end of int64): a
    function of ``stamps``' elements that asserts (``check``) they are this pipeline's stamps fails that restore.

    Example:
      stamp = guard.stamp
      stamp.lead(batches)  # restoring a checkpoint of it into a pipeline of other shards fails, naming the dataset
    """

    def __init__(self, path: str, shas: Sequence[str]):
        self.value = int.from_bytes(hashlib.sha256("\n".join(shas).encode()).digest()[:8], "big") >> 2
        self.refused = (
            f"{path}: this iterator checkpoint was saved by a pipeline of other data (the dataset at {path} has been "
            "rewritten since, or it comes from another dataset, split or input pipeline), so it would serve data this "
            "pipeline does not read; restore it only into a pipeline of the data it was saved from, or start this "
            "input afresh (with start_step= where the reader takes it)")

    def stamps(self) -> tf.data.Dataset:
        """This stamp, then the numbers after it: the ``n``-th element is ``value + n``."""
        return tf.data.Dataset.range(self.value, 2**63 - 1)

    def check(self, element: tf.Tensor, index: tf.Tensor | int = 0) -> tf.Operation:
        """Asserts ``element`` is this pipeline's stamp at position ``index`` of ``stamps``."""
        return tf.debugging.Assert(tf.equal(element, self.value + index), [self.refused])

    def lead(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """``dataset``'s elements, each chosen by an endless stream of zeros (a ``flat_map`` of ``stamps``' first
        element) that ``choose_from_datasets`` restores first. No function of the element (a ``zip`` with the stamp
        needed a ``map`` to drop it again: traced on the element's structure, ~0.03-0.06 s of a first batch, and
        ~25 us an element); its length stays ``dataset``'s. Built without ``choose_from_datasets``' rewrite of its
        selector for the tf.data service's dynamic sharding (~6 ms a build): no reader puts a stamp in a graph a
        service runs, and its guards' Python could not run there."""

        def zeros(value):
            with tf.control_dependencies([self.check(value)]):
                return tf.data.Dataset.from_tensors(tf.identity(tf.constant(0, tf.int64))).repeat()

        selector = self.stamps().flat_map(zeros)
        if _directed_interleave is None:
            led = tf.data.Dataset.choose_from_datasets([dataset], selector)
        else:
            led = _directed_interleave(selector, [dataset], True)
        length = int(dataset.cardinality())
        known = length >= 0 or length == tf.data.INFINITE_CARDINALITY
        return led.apply(tf.data.experimental.assert_cardinality(length)) if known else led


def python_step(dataset: tf.data.Dataset, step: Callable[[], str], after: bool = False,
                once: bool = False) -> tf.data.Dataset:
    """``dataset`` with the Python function ``step`` run at the start (``after``: the end) of each iteration of it:
    a dataset of its element spec that never yields, concatenated ahead of it (or after it), whose one function
    runs ``step``; nothing per element. A non-empty string ``step`` returns fails the iteration, as its message,
    and every later pull of that iteration too (a parallel stage downstream pulls again after an error: with a
    stage that ran ``step`` once, the second pull went on into ``dataset``, and hung on the FIFO the first had
    found); with ``once``, only that pull (an ``ignore_errors`` pipeline logs it and reads on). ``step`` must hold
    no state tf.data would have to save: the result is still savable by ``tf.train.Checkpoint(iterator)``."""

    def passes(*_):  # never True: "" ends the step's dataset, a problem fails this pull (and the next: repeat())
        problem = problem_step(step, [])
        with tf.control_dependencies([assert_no_problem(problem)]):
            return tf.constant(False)

    # One function over repeats of one placeholder of the element spec (each function of a dataset is set up anew
    # with every iterator: a map, filter and map cost twice this one's setup).
    placeholder = tf.nest.map_structure(_zeros_of, dataset.element_spec)
    placeholders = tf.data.Dataset.from_tensors(placeholder)
    stepped = placeholders.filter(passes) if once else placeholders.repeat().take_while(passes)
    joined = dataset.concatenate(stepped) if after else stepped.concatenate(dataset)
    return joined.with_options(external_state_ignored())


def _zeros_of(spec: tf.TensorSpec) -> tf.Tensor:
    """A tensor that fits ``spec`` (never yielded: it only gives the empty dataset ``spec``'s structure)."""
    if not isinstance(spec, tf.TensorSpec):
        raise TypeError(f"epoch guard: elements of tensors only (got {spec!r})")
    shape = [0] if spec.shape.rank is None else [0 if d is None else d for d in spec.shape.as_list()]
    return tf.zeros(shape, spec.dtype)
