"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch

Public names load on first use: ``import readers.starts`` (pure numpy) never
pulls in TensorFlow, and no TensorFlow setting is changed on import.
"""

import importlib

_EXPORTS = {
    "images": "readers.images",
    "info": "readers.files",
    "DatasetInfo": "readers.files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # wins over the submodule of the same name that the import just bound
        return value
    raise AttributeError(f"module 'readers' has no attribute {name!r}")
