"""The window arithmetic every windows reader shares, below them all: plain Python/numpy, no TensorFlow.

``starts.py``: ``WindowSpec`` (length, shift, offset, width, sampling_rate, time_range, padding): which windows
each episode gives, the resident layout's rows of g steps, and the int32 window starts. ``targets.py``: what a
window predicts (``readers.Targets`` and its shortcuts) and the spec of a reader's arguments. ``readers/files.py``
(window counts from the manifest), ``readers/arguments.py`` and ``readers/windows/`` import from here; this
package imports nothing of ``readers``. Nothing is imported here, so ``starts.py`` loads on its own.
"""
