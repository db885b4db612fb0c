"""tfshard's converter: image class folders and numpy episodes → sharded TFRecords + ``dataset.json``.

The public names are loaded on first use, so ``import ingest.plan`` (the pure
core) never pulls in TensorFlow and importing the package changes nothing.

    from ingest import ConvertOptions, convert_images, verify
    manifest = convert_images("photos/", "photos-tfr/", ConvertOptions(num_shards=8))
"""

import importlib

_EXPORTS = {
    "convert_images": "ingest.convert",
    "convert_episodes": "ingest.convert",
    "EpisodeOptions": "ingest.episodes",
    "ConvertOptions": "ingest.convert",
    "ImageOptions": "ingest.images",
    "parse_size": "ingest.plan",
    "verify": "ingest.readback",
    "load_manifest": "ingest.readback",
    "Manifest": "ingest.manifest",
    "InputError": "ingest.errors",
    "OutputExistsError": "ingest.errors",
    "VerifyError": "ingest.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # wins over the submodule of the same name that the import just bound
        return value
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")
