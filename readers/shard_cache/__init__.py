"""A bounded, verified local copy of a dataset's shards (``shard_cache=DIR``): fetched ahead, read at disk speed.

``store``: the cache folder (no TensorFlow): verified copies keyed by sha256, reservations, downloads, LRU.
``locks``: its ``flock`` locks, waited for in stoppable slices with a bound, removed when done.
``pins``: a live reader's hold on a copy; pins of other hosts expire unless renewed within a lease.
``holds``: the pins of a tf.data service worker's reads, let go however a read ends.
``ahead``: the threads fetches run in, started ahead of the reads (not tf.data's: a fetch blocks for a download).
``pipeline``: the fetch inside a reader's tf.data pipeline, and the Python ops a tf.data service worker runs.
``fill``: ``tfshard cache OUT DIR``, filling the cache ahead of a job.
"""
