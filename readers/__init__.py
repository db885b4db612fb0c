"""tfshard's readers: stream ``dataset.json`` datasets back as ``tf.data.Dataset``s.

    from tfshard import readers
    ds = readers.images("photos-tfr", batch_size=64, seed=0)   # (images [B,224,224,3] float32, labels [B])
    info = readers.info("photos-tfr")                           # class names, counts, steps per epoch
    weights = readers.class_weights("photos-tfr", "train")      # {class index: weight} for model.fit(class_weight=)
    ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64)  # resident sliding windows
    mw = readers.model_windows("runs-tfr", length=256, shift=16, batch_size=64)  # gathered in the model's step
    readers.preview("photos-tfr").save("sheet.png")             # a contact sheet (tfshard.tools.preview)
    backup = readers.BackupAndRestore("bk", save_freq=500)      # model.fit resumes mid-epoch, input position too
    for x, y in readers.as_numpy(ds): ...                       # numpy batches, len() kept (PyTorch, JAX loops)

Readers are tf.data pipelines, so importing this package imports TensorFlow; it
changes no TensorFlow setting. The functions are bound eagerly so that
``readers.images`` stays the function even after ``import tfshard.readers.images``
(likewise ``episodes`` and ``windows``).
The window arithmetic in ``readers/windowing/`` and the stream arithmetic in ``readers/sampling/`` are plain numpy.

Compatibility: ``readers.preview`` (a contact sheet or an episode plot) lives with the other tools, as
``tfshard.tools.preview.preview``: it draws a finished dataset with PIL and reads through this package, so the
readers do not import it. The name stays here for the code that calls it, resolved on first use by ``__getattr__``
below: the one import from ``readers`` up into ``tools``, and the exception ``tests/test_import_graph.py`` lists.
"""

from .episodes import episodes
from .files import DatasetInfo, class_weights, info
from .images import images
from .normalize import normalization
from .numpy_batches import NumpyBatches, as_numpy
from .windowing.targets import Targets
from .windows.dataset import windows
from .windows.in_model import ModelWindows, WindowGather, model_windows
from .windows.resident import resident_windows

__all__ = ["BackupAndRestore", "DatasetInfo", "ModelWindows", "NumpyBatches", "Targets", "WindowGather", "as_numpy",
           "class_weights", "episodes", "images", "info", "model_windows", "normalization", "preview",
           "resident_windows", "windows"]


def __getattr__(name):
    """``readers.preview`` → ``tfshard.tools.preview.preview`` and ``readers.BackupAndRestore`` (a Keras callback,
    so Keras is imported only for it) on first use (see the module's docstring)."""
    if name == "BackupAndRestore":
        from .backup import BackupAndRestore

        globals()["BackupAndRestore"] = BackupAndRestore
        return BackupAndRestore
    if name == "preview":
        from ..tools.preview import preview

        globals()["preview"] = preview
        return preview
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))  # ``preview`` and ``BackupAndRestore`` before their first use too
