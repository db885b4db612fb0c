"""tfshard's converter: image class folders and numpy episodes → sharded TFRecords + ``dataset.json``.

The public names are loaded on first use, so ``import tfshard.ingest.plan`` (the
pure core) never pulls in TensorFlow and importing the package changes nothing.

    from tfshard.ingest import ConvertOptions, convert_images, verify
    manifest = convert_images("photos/", "photos-tfr/", ConvertOptions(num_shards=8))
"""

import importlib

_EXPORTS = {
    "convert_images": ".convert",
    "convert_episodes": ".convert",
    "EpisodeOptions": ".options",
    "ConvertOptions": ".options",
    "ImageOptions": ".options",
    "parse_size": ".plan",
    # A finished dataset's checks live with the other tools; these names stay here for the code that uses them.
    "verify": "..tools.verify",
    "VerifyError": "..tools.verify",
    "load_manifest": "..format.dataset",
    "Manifest": "..format.manifest",
    "InputError": ".errors",
    "OutputExistsError": ".errors",
    "TfdsMetadataError": ".errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # wins over the submodule of the same name that the import just bound
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
