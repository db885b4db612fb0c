"""Sliding windows over episodes: ``readers.windows`` and ``readers.model_windows``.

``dataset.py`` is ``readers.windows``; ``resident.py`` holds the episodes in device
memory (one copy per replica) and builds one pipeline per replica from ``index.py``'s
window-start stream and gather; ``streamed.py`` windows episodes read from the shards;
``in_model.py`` (``readers.model_windows``) gathers in the model's step; ``layout.py``
says what to gather and how to shape it; ``starts.py`` is the window-start arithmetic
(plain numpy). Nothing is imported here, so ``starts.py`` loads without TensorFlow.
"""
