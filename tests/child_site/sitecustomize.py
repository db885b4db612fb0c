"""The test run's Python processes (tests/conftest.py appends this folder to PYTHONPATH): ``import tensorflow`` there
skips two optional imports it makes only for features no test uses, ~1.8 of its ~7.6 CPU-seconds in each of the
suite's ~100 TensorFlow processes (the CLI, killed jobs, workers).

- ``tensorflow.lite.python.util`` tries ``from jax import jit`` (for converting JAX models to TFLite), and Keras'
  ``callbacks.orbax_checkpoint`` tries ``import jax`` (to patch it for Orbax, not installed here): ~1 s;
- Keras' ``visualization.plot_image_gallery`` tries ``import matplotlib.pyplot``: ~1.4 s with fontTools.

Both catch the ImportError this raises and carry on without the feature. Only those two importers are refused:
anything else (tfshard's preview, a docs snippet's JAX loop) imports jax and matplotlib as usual. Nothing of the
library changes, and users' processes never load this file.
"""

from __future__ import annotations

import sys

# (module refused, the importer it is refused to): the importer is the module whose code runs the import statement.
_REFUSED = {"jax": ("tensorflow.lite.", "keras.src.callbacks.orbax_checkpoint"),
            "matplotlib": ("keras.src.visualization.",)}


class _OptionalImportsOfTensorFlow:
    """A meta path finder that refuses ``_REFUSED``'s modules to their importers (ModuleNotFoundError)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        importers = _REFUSED.get(name)
        if importers is None:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        importer = frame.f_globals.get("__name__", "") if frame is not None else ""
        if importer.startswith(importers):
            raise ModuleNotFoundError(f"{name} is not imported for {importer} in the test run (tests/child_site)",
                                      name=name)
        return None


sys.meta_path.insert(0, _OptionalImportsOfTensorFlow())


def _run_the_next_sitecustomize() -> None:
    """Python runs only the first ``sitecustomize`` on the path: run the one this file hides (a host's or a CI's own,
    e.g. coverage's subprocess hook), as Python would have, from the path without this folder."""
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_the_next_sitecustomize()
