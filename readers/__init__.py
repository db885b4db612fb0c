"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    from tfshard import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch
    ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64)  # resident sliding windows
    mw = readers.model_windows("runs-tfr", length=256, shift=16, batch_size=64)  # gathered in the model's step
    readers.preview("photos-tfr").save("sheet.png")             # a contact sheet (episodes: plots, with matplotlib)

Readers are tf.data pipelines, so importing this package imports TensorFlow; it
changes no TensorFlow setting. The functions are bound eagerly so that
``readers.images`` stays the function even after ``import tfshard.readers.images``
(likewise ``episodes`` and ``windows``).
The window-start arithmetic in ``readers/starts.py`` itself is plain numpy.
"""

from .episodes import episodes
from .files import DatasetInfo, info
from .images import images
from .in_model import ModelWindows, WindowGather, model_windows
from .normalize import normalization
from .preview import preview
from .windows import resident_windows, windows

__all__ = ["DatasetInfo", "ModelWindows", "WindowGather", "episodes", "images", "info", "model_windows",
           "normalization", "preview", "resident_windows", "windows"]
