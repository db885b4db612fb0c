"""What reads a finished dataset for people and other systems: apart from the converter and the readers.

``verify``: every record against the manifest (``tfshard verify``), read once per shard (``shard_read``) and
checked by concern (``record_checks``, ``image_checks``, ``episode_checks``, ``split_checks``); ``report``: the
summaries ``tfshard info`` and a conversion print; ``preview`` (with ``fonts``): contact sheets and episode plots
(``tfshard preview``, ``readers.preview``); ``tfds``: TFDS metadata beside a finished dataset (``tfshard tfds``);
``bench``: the reader timed alone and side by side with its floors and keras (``tfshard bench``); ``cache``: a shard
cache filled ahead (``tfshard cache``); ``service``: tf.data service servers (``tfshard service``); ``demo`` (with
``demo_data``): the embedded default (``tfshard demo``); ``conversion``: what ``tfshard images``/``episodes`` pass
to the converter and print; ``console``: how tfshard talks to a terminal (global flags, one-line errors, stops,
exit codes).

Tools import the readers and the format, and of the converter its lock, pure statistics (``FeatureSums``,
``PixelSums``), options, Beam runner and TFDS metadata writer (``ingest/tfds.py``, which a conversion's ``--tfds``
calls under its own lock) and, for the demo, its public names. Neither the converter nor the readers import a tool
(``ingest.verify`` and ``readers.preview`` stay as names, resolved on first use).
"""
