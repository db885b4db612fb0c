"""Python inside the readers' pipelines (``tf.numpy_function``, ``tf.py_function``), and the iterators open at exit.

A pipeline function that runs Python needs the GIL. When a script ends, Python runs its ``atexit`` hooks, then
stops handing the GIL to other threads (a thread that asks for it from then on exits on the spot) and clears the
modules' globals. An iterator still held there (``it = iter(ds)`` at a script's top level) is destroyed then, while
its pipeline fills its buffers: its destructor waits for a Python step that never returns, and the process hangs.
Seen in 5 of 6 runs of a script that ends after ``next(it)`` on a stream read by position (``shuffle="global"``),
2 of 4 on a mixture; the streams run a Python step for every batch of records they read.

So every Python step of the readers goes through ``numpy_step`` or ``py_step`` (the shard cache's registered Python
ops call ``register_exit_hook``), and the first registers an ``atexit`` hook, ``keep_open_iterators``, that leaves
each tf.data iterator still open to the process's end, never destroyed: the operating system frees it. Closing them
in the hook instead (their destructors then wait for Python steps that can finish) missed an iterator a
``tf.function`` captured and a distributed one's multi-device iterator (both still hung), and broke an exit hook
registered before it that saved or read an iterator. The cost of leaving them: a ``cache(filename)`` of a
user's own still writing its first epoch at exit keeps TensorFlow's lockfile (TensorFlow's message on the next
run says to delete it, as after a killed process); the readers' ``cache=`` clears what a process that is gone
left (``cache.py``).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import threading
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops, multi_device_iterator_ops  # no public handle

_hook_lock = threading.Lock()
_hook_registered = False
_kept: set[int] = set()  # ids of the resources kept alive: each once


def numpy_step(func: Callable, inp: list, Tout, *, stateful: bool) -> tf.Tensor:  # noqa: N803 - tf's own name
    """``tf.numpy_function(func, inp, Tout, stateful=stateful)``, with the exit hook registered."""
    register_exit_hook()
    return tf.numpy_function(func, inp, Tout, stateful=stateful)


def py_step(func: Callable, inp: list, Tout) -> tf.Tensor:  # noqa: N803
    """``tf.py_function(func, inp, Tout)``, with the exit hook registered."""
    register_exit_hook()
    return tf.py_function(func, inp, Tout)


def problem_step(func: Callable, inp: list) -> tf.Tensor:
    """``py_step`` of a check that returns ``""`` or what is wrong: a scalar string (its shape set, not checked by
    an op: each op kind costs an iterator's setup, see ``no_problem``)."""
    problem = py_step(func, inp, tf.string)
    problem.set_shape([])
    return problem


def no_problem(problem: tf.Tensor) -> tf.Tensor:
    """``problem == ""``, as a regex match: an op without a ``T`` attribute. Setting up a function with a new pair
    of op and ``T`` costs ~1.5 ms on the first iterator of a process (oneDNN's graph pass, on by default on x86,
    scans every registered kernel for it; see docs/design.md), and the readers' checks are in every pipeline."""
    return tf.strings.regex_full_match(problem, "")


def assert_no_problem(problem: tf.Tensor) -> tf.Operation:
    """An op failing, with ``problem`` as its message, unless ``problem`` is ``""``."""
    return tf.debugging.Assert(no_problem(problem), [problem])


def keep_open_iterators() -> int:
    """Leaves every tf.data iterator still open, single- or multi-device, to the process's end: its resource gets a
    reference never dropped, so Python's finalization never destroys it (module docstring) and the operating system
    frees it with the process. Until then it works as before: an exit hook that runs later may still read or save it.
    Returns how many. Run at exit; the iterators are found in the garbage collector's list, after a collection
    (~0.1 s in all with TensorFlow and Keras loaded, ~400k objects), or frozen objects included (``gc.freeze()``)."""
    single = _subclasses(iterator_ops.OwnedIterator)
    multi = _subclasses(multi_device_iterator_ops.OwnedMultiDeviceIterator)
    frozen = gc.get_freeze_count() > 0  # gc.freeze() (the CLI's exit, console.exiting): get_objects leaves them out
    if frozen:
        gc.unfreeze()
    else:
        gc.collect()  # the iterators no longer reachable, destroyed now, while their Python steps can still finish
    kept = 0
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: 3x the walk
        name = ("_iterator_resource" if kind in single else "_multi_device_iterator_resource" if kind in multi
                else None)
        resource = None if name is None else obj.__dict__.get(name)
        if resource is not None and id(resource) not in _kept:
            _kept.add(id(resource))
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(resource))
            kept += 1
    if frozen:
        gc.freeze()  # as they were: the collection at exit skips them
    return kept


def _subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def register_exit_hook() -> None:
    global _hook_registered
    with _hook_lock:
        if not _hook_registered:
            atexit.register(keep_open_iterators)
            _hook_registered = True
