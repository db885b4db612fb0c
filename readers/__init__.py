"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    from tfshard import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch
    ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64)  # resident sliding windows
    mw = readers.model_windows("runs-tfr", length=256, shift=16, batch_size=64)  # gathered in the model's step
    readers.preview("photos-tfr").save("sheet.png")             # a contact sheet (tfshard.tools.preview)

Readers are tf.data pipelines, so importing this package imports TensorFlow; it
changes no TensorFlow setting. The functions are bound eagerly so that
``readers.images`` stays the function even after ``import tfshard.readers.images``
(likewise ``episodes`` and ``windows``).
The window-start arithmetic in ``readers/windows/starts.py`` itself is plain numpy.
"""

from .episodes import episodes
from .files import DatasetInfo, info
from .images import images
from .normalize import normalization
from .windows.dataset import windows
from .windows.in_model import ModelWindows, WindowGather, model_windows
from .windows.layout import Targets
from .windows.resident import resident_windows

__all__ = ["DatasetInfo", "ModelWindows", "Targets", "WindowGather", "episodes", "images", "info", "model_windows",
           "normalization", "preview", "resident_windows", "windows"]


def __getattr__(name):
    # ``readers.preview`` draws a finished dataset, so it lives with the other tools (``tfshard.tools.preview``,
    # which reads through this package); the name stays here for the code that calls it, resolved on first use.
    if name == "preview":
        from ..tools.preview import preview

        globals()["preview"] = preview
        return preview
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
