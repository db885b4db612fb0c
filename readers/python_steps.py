"""Python inside the readers' pipelines (``tf.numpy_function``, ``tf.py_function``), and the iterators open at exit.

A pipeline function that runs Python needs the GIL. When a script ends, Python runs its ``atexit`` hooks, then
stops handing the GIL to other threads (a thread that asks for it from then on exits on the spot) and clears the
modules' globals. An iterator still held there (``it = iter(ds)`` at a script's top level) is destroyed then, while
its pipeline fills its buffers: its destructor waits for a Python step that never returns, and the process hangs.
Seen in 5 of 6 runs of a script that ends after ``next(it)`` on a stream read by position (``shuffle="global"``),
2 of 4 on a mixture; the streams run a Python step for every batch of records they read.

So every Python step of the readers goes through ``numpy_step`` or ``py_step``, and the first one registers an
``atexit`` hook, ``close_open_iterators``, that closes each tf.data iterator still open while Python still runs:
their destructors wait for their Python steps, which can then finish.
"""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops  # tf.data has no public close

_hook_lock = threading.Lock()
_hook_registered = False


def numpy_step(func: Callable, inp: list, Tout, *, stateful: bool) -> tf.Tensor:  # noqa: N803 - tf's own name
    """``tf.numpy_function(func, inp, Tout, stateful=stateful)``, with the exit hook registered."""
    _register_exit_hook()
    return tf.numpy_function(func, inp, Tout, stateful=stateful)


def py_step(func: Callable, inp: list, Tout) -> tf.Tensor:  # noqa: N803
    """``tf.py_function(func, inp, Tout)``, with the exit hook registered."""
    _register_exit_hook()
    return tf.py_function(func, inp, Tout)


def close_open_iterators() -> int:
    """Closes every tf.data iterator of this process still open (a distributed one's per-device iterators too):
    its pipeline stops and frees what it holds, and the iterator fails on its next use. Returns how many. Run at
    exit (module docstring); the iterators are found in the garbage collector's list, walked once (~30 ms with
    TensorFlow loaded)."""
    kinds, closed = _subclasses(iterator_ops.OwnedIterator), 0
    for obj in gc.get_objects():
        if type(obj) in kinds:  # isinstance on each of ~400k objects: 3x the walk
            closed += obj.__dict__.pop("_iterator_resource", None) is not None
    return closed


def _subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def _register_exit_hook() -> None:
    global _hook_registered
    with _hook_lock:
        if not _hook_registered:
            atexit.register(close_open_iterators)
            _hook_registered = True
