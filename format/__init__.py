"""The on-disk format of a tfshard dataset, in one place: what the converter writes and the readers read.

``names``: file names in OUT (shards, index, manifest, state, lock, TFDS files) and compression names.
``records``: the ``tf.train.Example`` keys of each kind and their parse specs.
``tfrecord``: the ``tf.train.Example`` wire format and TFRecord framing (CRC32C), written without TensorFlow.
``manifest``: ``dataset.json`` as typed dataclasses, canonical JSON, and the fingerprint.
``json_checks``: untrusted JSON parsed and type-checked, each problem naming the file and the field.
``untrusted``: ``dataset.json`` validated field by field: the top level, features, splits, shards, totals.
``labels``: the manifest's label fields (label kinds, class names and columns, class counts) and their checks.
``statistics``: the pixel and feature statistics a conversion can write, and their fields' checks.
``duplicates``: the manifest's ``duplicates`` field, summarised from the workers' hashes, and its checks.
``appends``: the manifest's ``appends`` field, one record per ``--append``, and its checks.
``inputs``: ``inputs.json``, every input an image dataset read and its exact pixel sums, validated on load.
``tfds``: how the TFDS metadata in OUT lays a dataset out (splits per generation, labels file).
``dataset``: ``load_manifest``: is this folder a dataset, and its validated manifest.
``storage``: paths and reads through ``tf.io.gfile`` (local or ``gs://``) or ``objects``, regular files only,
atomic writes.
``objects``: ``s3://``, ``az://``, ``abfs://``, ``https://`` read through fsspec (the ``cloud`` extra).
``owners``: owner records (host, pid, start time) of locks and caches, and whether that process still runs.
``stops``: Ctrl-C and SIGTERM recorded when they arrive and raised again at commit points: never lost.
``sizes``: byte sizes as people write them (``"64MiB"``), for both halves.
``errors``: tfshard's exceptions, one home every layer imports.

The converter (``tfshard.ingest``) writes through these modules and the readers
(``tfshard.readers``) read through them; the readers import nothing of the
converter. Importing them loads no TensorFlow (``storage`` and the parse specs
import it when called), so the converter's worker processes can use them too.
"""
