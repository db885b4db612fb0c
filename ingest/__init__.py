"""tfshard's converter: image class folders and numpy episodes → sharded TFRecords + ``dataset.json``.

The public names are loaded on first use, so ``import tfshard.ingest.plan`` (the
pure core) never pulls in TensorFlow and importing the package changes nothing.
The exceptions are bound at once: they live in ``tfshard.format.errors``, which loads nothing.

    from tfshard.ingest import convert_images, verify
    result = convert_images("photos/", "photos-tfr/", num_shards=8, val_fraction=0.1)
    print(result.summary())  # what `tfshard images photos/ photos-tfr/ --num-shards 8 --val-fraction 0.1` prints
"""

import importlib

from ..format.errors import InputError, OptionError, OutputExistsError, TfdsMetadataError, VerifyError

# The converter's own names and the manifest's, each imported from its module on first use.
_EXPORTS = {
    "convert_images": ".convert",
    "convert_episodes": ".convert",
    "EpisodeOptions": ".options",
    "ConvertOptions": ".options",
    "ConversionResult": ".summary",
    "ImageOptions": ".options",
    "parse_size": ".plan",
    "load_manifest": "..format.dataset",
    "Manifest": "..format.manifest",
}

__all__ = ["ConversionResult", "ConvertOptions", "EpisodeOptions", "ImageOptions", "InputError", "Manifest",
           "OptionError", "OutputExistsError", "TfdsMetadataError", "VerifyError", "convert_episodes", "convert_images",
           "load_manifest", "parse_size", "verify"]


def __getattr__(name):
    if name == "verify":
        # Compatibility: ``verify`` checks a finished dataset, so it lives with the tools (``tfshard.tools.verify``,
        # which imports this package's modules); the name stays here for the code that calls it. The one import
        # of ``ingest`` upwards, listed in tests/test_import_graph.py's COMPATIBILITY.
        from ..tools.verify import verify

        globals()["verify"] = verify
        return verify
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # wins over the submodule of the same name that the import just bound
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
