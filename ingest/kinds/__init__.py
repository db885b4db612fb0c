"""The kinds of input the converter takes, one home each: ``images.py``, ``episodes.py``, and ``protocol.py``,
what every kind brings to the shared engine (``ingest/engine.py``). Pure: no TensorFlow.
"""
