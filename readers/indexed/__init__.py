"""The index-driven stream of ``readers.images``: records read by position in an order ``readers/sampling`` computes
(mixtures, class balance, a global shuffle, elastic resume).

``request.py``: the arguments that ask for it, checked. ``sources.py``: each dataset located record by record and
the labels merged. ``records.py``: where each record is, and reading one by position. ``stream.py``: which global
elements a pipeline reads, chunk by chunk. ``images.py``: the pipeline.
"""
