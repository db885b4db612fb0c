"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch

Importing this package imports TensorFlow (readers are tf.data pipelines) but
changes no TensorFlow setting.
"""

from readers.files import DatasetInfo, info
from readers.images import images

__all__ = ["DatasetInfo", "images", "info"]
