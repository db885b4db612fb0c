"""The index-driven stream every mixture, class balance, global shuffle and elastic resume shares: plain numpy, no
TensorFlow.

Element ``k`` of epoch ``e`` is a pure function of ``(seed, e, k)`` mapping to ``(source, record)``, so the whole
input state of a reader is one counter. ``plan.py``: ``StreamSpec``, the sources' shares of an epoch, their passes
and an epoch's order. ``classes.py``: class balance as a stream whose sources are the classes, and the weights
``model.fit(class_weight=)`` takes. ``slicing.py``: which global elements each replica takes at each global step.
This package imports nothing of ``readers`` (nor anything here), so each module loads on its own.
"""
