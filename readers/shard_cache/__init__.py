"""A bounded, verified local copy of a dataset's shards (``shard_cache=DIR``): fetched ahead, read at disk speed.

``store``: the cache (no TensorFlow): reserve, evict, download, check and rename copies, in that order.
``folder``: the folder's layout and names, its own folders checked, what it holds, files removed without a link.
``budget``: pure: the limit, whether a shard fits, which copies are evicted (least recently used, never pinned).
``verified``: what is wrong with a copy, hashed once per process.
``locks``: its ``flock`` locks, waited for in stoppable slices with a bound, removed when done.
``pins``: a live reader's hold on a copy; pins of other hosts expire unless renewed within a lease.
``holds``: the pins of a tf.data service worker's reads, let go however a read ends.
``ahead``: the threads fetches run in, started ahead of the reads (not tf.data's: a fetch blocks for a download).
``pipeline``: the fetch inside a reader's tf.data pipeline, and the Python ops a tf.data service worker runs.
``tfshard cache OUT DIR`` (``tools/cache.py``) fills the cache ahead of a job.
"""
