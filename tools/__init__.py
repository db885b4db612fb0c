"""What reads a finished dataset for people and other systems: apart from the converter and the readers.

``verify``: every record against the manifest (``tfshard verify``); ``report``: the summaries ``tfshard info`` and a
conversion print; ``tfds``: TFDS metadata beside ``dataset.json`` (``tfshard tfds``); ``preview`` (with ``fonts``):
contact sheets and episode plots (``tfshard preview``, ``readers.preview``); ``bench``: the reader timed alone and
side by side with its floors and keras (``tfshard bench``); ``demo``: the embedded default (``tfshard demo``).

Tools import the readers and the format, and the converter's lock, pure statistics and TFDS writer (``tfds`` is the
command over ``ingest/tfds.py``, which a conversion's ``--tfds`` calls too); neither the converter nor
the readers import a tool (``ingest.verify`` and ``readers.preview`` stay as names, resolved on first use).
"""
