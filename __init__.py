"""tfshard: sharded TFRecords from image folders and numpy episodes, and tf.data readers that keep accelerators busy.

    from tfshard import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)

    from tfshard.ingest import ConvertOptions, convert_images
    convert_images("photos/", "photos-tfr/", ConvertOptions(min_shards=8))

Importing ``tfshard`` imports nothing else: ``tfshard.ingest``'s pure core never
loads TensorFlow, and ``tfshard.readers`` loads it when imported.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("tfshard")
except _metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
