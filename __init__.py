"""tfshard: sharded TFRecords from image folders and numpy episodes, and tf.data readers that keep accelerators busy.

    from tfshard import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)

    from tfshard.ingest import ConvertOptions, convert_images
    convert_images("photos/", "photos-tfr/", ConvertOptions(min_shards=8))

Importing ``tfshard`` imports nothing else: ``tfshard.ingest``'s pure core never
loads TensorFlow, and ``tfshard.readers`` loads it when imported.
"""


def __getattr__(name: str):
    """``tfshard.__version__``, looked up when asked for: importlib.metadata takes ~0.25 s to import, and the
    ``tfshard`` command handles Ctrl-C only once this package is imported (``__main__.py``)."""
    if name != "__version__":
        raise AttributeError(f"module 'tfshard' has no attribute {name!r}")
    from importlib import metadata

    try:
        return metadata.version("tfshard")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
