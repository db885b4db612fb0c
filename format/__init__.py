"""The on-disk format of a tfshard dataset, in one place: what the converter writes and the readers read.

``names``: file names in OUT (shards, index files, the manifest) and compression names.
``records``: the ``tf.train.Example`` keys of each kind and their parse specs.
``manifest``: ``dataset.json`` as typed dataclasses, canonical JSON, and validation of untrusted JSON.
``storage``: paths and reads through ``tf.io.gfile`` (local or ``gs://``), regular files only, and
``load_manifest``.

The converter (``tfshard.ingest``) writes through these modules and the readers
(``tfshard.readers``) read through them; the readers import nothing of the
converter. Importing them loads no TensorFlow (``storage`` and the parse specs
import it when called), so the converter's worker processes can use them too.
"""
