"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch

Readers are tf.data pipelines, so importing this package imports TensorFlow; it
changes no TensorFlow setting. The functions are bound eagerly so that
``readers.images`` stays the function even after ``import readers.images``.
The window-start arithmetic in ``readers/starts.py`` itself is plain numpy.
"""

from readers.files import DatasetInfo, info
from readers.images import images

__all__ = ["DatasetInfo", "images", "info"]
