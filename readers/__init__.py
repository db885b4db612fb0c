"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

The image and window readers land with issues 3 and 4; until then, read shards
with ``tf.data.TFRecordDataset`` and the keys listed in the manifest's ``features``.
"""
