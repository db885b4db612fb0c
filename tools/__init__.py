"""What reads a finished dataset for people and other systems: apart from the converter and the readers.

``verify``: every record against the manifest (``tfshard verify``), read once per shard (``shard_read``) and
checked by concern (``record_checks``, ``image_checks``, ``episode_checks``, ``split_checks``); ``report``: the
summaries ``tfshard info`` and a conversion print; ``preview`` (with ``fonts``): contact sheets and episode plots
(``tfshard preview``, ``readers.preview``); ``bench``: the reader timed alone and side by side with its floors and
keras (``tfshard bench``); ``cache``: a shard cache filled ahead (``tfshard cache``); ``demo``: the embedded default
(``tfshard demo``); ``console``: how tfshard talks to a terminal.

Tools import the readers and the format, and of the converter its pure statistics (``FeatureSums``,
``PixelSums``) and, for the demo, its public names. TFDS metadata (``tfshard tfds``) is written by the converter
(``ingest/tfds.py``), which a conversion's ``--tfds`` calls under its lock. Neither the converter nor the readers
import a tool (``ingest.verify`` and ``readers.preview`` stay as names, resolved on first use).
"""
