"""``tfshard verify``'s one read of a shard: every record parsed in batches as it is read, counted, and the first
bad one found only when a batch fails; and the ``Tally`` a split's totals are then weighed against.

TensorFlow's reader checks both CRCs of each record. The checks of what the records hold are
``tools/record_checks.py`` (images, and ``read_shard``), ``tools/episode_checks.py`` and ``tools/split_checks.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from ..format.names import tf_compression_type
from ..ingest.episodes import FeatureSums
from .report import short_tf_error

REWRITE = "rerun the conversion with --overwrite to rewrite it"
LIES = "the manifest does not describe this shard's records; rerun the conversion with --overwrite"


def _records(path: str, compression: str | None):
    return tf.data.TFRecordDataset(path, compression_type=tf_compression_type(compression))


def count_records(path: str, compression: str | None) -> tuple[int, str | None]:
    """Reads every record (TensorFlow checks both CRCs of each); returns the count and any read error."""
    try:
        return int(_records(path, compression).reduce(0, lambda n, _: n + 1)), None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return 0, short_tf_error(e.message)


def first_unparseable(path: str, compression: str | None, spec: dict, start: int) -> tuple[int, str]:
    """The first record from ``start`` on that does not parse with ``spec``, and why: run only after a batch failed,
    so it parses at most one batch, one record at a time."""
    for index, record in enumerate(_records(path, compression).skip(start), start):
        try:
            tf.io.parse_single_example(record, spec)
        except tf.errors.InvalidArgumentError as e:
            return index, short_tf_error(e.message)[:160]  # TensorFlow quotes the record: not all of it
    return start, "no longer fails"


def record_text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")  # as ingest/examples.py encodes names: non-UTF-8 ones round-trip


class ParsedShard:
    """Every record of a shard parsed with ``spec``, in order, as dicts of numpy values: the one read of a shard.

    A read or parse error ends the iteration: ``error`` keeps it, ``count`` the records yielded before it (the
    failing record is in the next batch).
    """

    def __init__(self, path: str, compression: str | None, spec: dict, batch: int, then=None):
        self.path, self.compression, self.spec, self.batch, self.then = path, compression, spec, batch, then
        self.count, self.error = 0, None

    def __iter__(self):
        spec, then = self.spec, self.then or (lambda parsed: parsed)
        dataset = _records(self.path, self.compression).map(lambda r: then(tf.io.parse_single_example(r, spec)))
        try:
            for columns in dataset.batch(self.batch).as_numpy_iterator():
                for i in range(len(next(iter(columns.values())))):
                    self.count += 1
                    yield {key: values[i] for key, values in columns.items()}
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            self.error = short_tf_error(e.message)


@dataclasses.dataclass
class Tally:
    """What one split's shards hold, added up as they are read. Its totals are weighed against the split's only
    when every shard is ``intact`` (there, of its listed size and sha256, read whole with its listed count);
    otherwise the damaged shard's own problem is the evidence, and the totals are not second-guessed."""

    labels: list[int]
    intact: bool = True
    records: int = 0
    bytes: int = 0
    sums: dict[str, FeatureSums] = dataclasses.field(default_factory=dict)
    split: str = ""
    images: Any = None  # an image dataset's ImageChecks (tools/image_checks.py): each record is added to it


def first_finding(found: dict, key: str, value) -> None:
    """Counts a finding of kind ``key``, keeping the first one's details: one problem per kind per shard."""
    found.setdefault(key, [0, value])[0] += 1
