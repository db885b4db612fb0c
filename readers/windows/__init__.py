"""Sliding windows over episodes: ``readers.windows``, ``readers.model_windows`` and ``readers.resident_windows``.

``request.py`` holds the arguments the three share (``WindowRequest``: documented and checked once);
``dataset.py`` is ``readers.windows``; ``loader.py`` loads a split's episodes into one array per feature, checked
against the manifest; ``resident.py`` holds them in device memory (one copy per replica) and builds one pipeline per
replica from ``index.py``'s window-start stream and gather; ``streamed.py`` windows episodes read from the shards;
``in_model.py`` (``readers.model_windows``) gathers in the model's step; ``layout.py`` says what to gather and how
to shape it. The window arithmetic they share is ``readers/windowing/`` (plain numpy).
"""
