"""A conversion into a store (``s3://``, ``az://``, ``abfs://``): staged in a local folder with all of a local
conversion's machinery, then uploaded (``ingest/push.py``; an append by ``ingest/push_append.py``).

The staging folder is ``<default cache folder>/staging/<the URL's sha256, 16 digits>``: the same for the same URL,
so a rerun of a killed command resumes the conversion and the upload. While the conversion runs, the push journal
waits beside the staging folder (``<folder>.push.json``: a conversion's rerun clears its state folder, an append
refuses one it did not write), and goes back before the upload.

``--append`` starts from the dataset in the store, never from a staging copy alone: when the staging folder's
manifest is not the store's, nor an append on top of it not uploaded yet (another machine appended since, the
folder was removed, or another dataset is there), the folder is emptied and seeded from the store:
``dataset.json``, ``inputs.json`` and TFDS metadata, each read bounded and validated by the loaders that read them
locally. Old shards are never downloaded: an append reads only the manifest and the inputs file.

Example:
  convert_to_store(convert, "photos/", "s3://bucket/photos-tfr", ConvertOptions(), append=True, ...)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Callable

from ..format import objects
from ..format.dataset import load_manifest, read_small_file
from ..format.errors import InputError
from ..format.manifest import MANIFEST_NAME
from ..format.names import INPUTS_NAME, LOCK_NAME, STATE_DIR, TFDS_FILES
from ..format.storage import default_cache_folder, write_atomic
from .lock import output_lock
from .push import JOURNAL, PushReport, check_folder_url, push
from .push_append import extends, push_append, store_manifest

log = logging.getLogger(__name__)


def staging_folder(url: str) -> str:
    """Where a conversion into the store folder ``url`` is staged: ``<default cache folder>/staging/<key>``, the
    key the sha256 of the URL (the same folder each time the same command runs, so a rerun resumes it).

    Example:
      staging_folder("s3://bucket/photos-tfr")  # "/home/me/.cache/tfshard/staging/5d0c0d1c6a1f3e2b"
    """
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(default_cache_folder(), "staging", key)


def convert_to_store(convert: Callable, src: str, url: str, options, *, append: bool, runner,
                     on_upload: Callable[[PushReport], None] | None, **run):
    """``convert(src, staging, options, append=append, **run)`` into the URL's staging folder, then its upload.

    Args:
      convert: the local conversion (``ingest/convert.py``'s, of either kind).
      src, options, append, run: as the converters take them (``run``: ``overwrite``, ``tfds``, ``workers``...).
      url: the store folder to write (``s3://``, ``az://``, ``abfs://``).
      runner: None (the Beam runner writes local and ``gs://`` folders only).
      on_upload: called with the upload's ``PushReport``.

    Returns:
      The manifest, as uploaded.

    Raises:
      ValueError: a store tfshard does not write, a Beam runner, or what the conversion or the upload refuse.
      InputError: ``append`` and no dataset at ``url``.
    """
    shown = objects.redact(url)
    if not objects.writes(url):
        raise ValueError(f"{shown}: tfshard writes datasets to s3://, az:// and abfs:// (got a "
                         f"{objects.scheme_of(url)}:// OUT); pass one of those, or a local folder")
    if runner is not None:
        raise ValueError(f"{shown}: --runner beam writes local and gs:// folders only (got an "
                         f"{objects.scheme_of(url)}:// OUT); use --runner local, or convert locally and "
                         "`tfshard push OUT URL`")
    check_folder_url(url)
    url = url.rstrip("/")
    staging = staging_folder(url)
    log.info("%s: staging the conversion in %s", shown, staging)
    os.makedirs(staging, exist_ok=True)
    if append:
        _seed(staging, url)
    journal, parked = os.path.join(staging, STATE_DIR, JOURNAL), staging + ".push.json"
    if os.path.isfile(journal) and not os.path.islink(journal):
        os.replace(journal, parked)
        with contextlib.suppress(OSError):  # the state folder, when the journal was all it held
            os.rmdir(os.path.dirname(journal))
    manifest = convert(src, staging, options, append=append, runner=None, **run)
    if os.path.isfile(parked):
        os.makedirs(os.path.dirname(journal), exist_ok=True)
        os.replace(parked, journal)
    report = push_append(staging, url) if append else push(staging, url, overwrite=bool(run.get("overwrite")))
    if on_upload is not None:
        on_upload(report)
    return manifest


def _seed(staging: str, url: str) -> None:
    """Makes the staging folder's dataset the store's, unless it is an append on top of it not uploaded yet.

    Raises:
      InputError: no dataset at ``url`` to append to.
    """
    found = store_manifest(url)
    if found is None:
        raise InputError(f"{objects.redact(url)}: --append: no dataset to append to (got no {MANIFEST_NAME} there); "
                         "convert SRC into it first (drop --append), or pass the dataset's URL")
    text, base = found
    path = os.path.join(staging, MANIFEST_NAME)
    if os.path.isfile(path):
        if read_small_file(path, "manifest") == text:
            return
        with contextlib.suppress(ValueError):  # a damaged staging copy is replaced like a stale one
            if extends(load_manifest(staging), base):
                return
    log.info("%s: the staging folder %s does not hold the store's dataset; seeding it from the store (dataset.json, "
             "inputs.json, TFDS metadata; no shard)", objects.redact(url), staging)
    with output_lock(staging):
        for name in os.listdir(staging):
            if name == LOCK_NAME:
                continue
            path = os.path.join(staging, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(staging + ".push.json")
        for name in (INPUTS_NAME, *TFDS_FILES):
            try:
                data = read_small_file(f"{url}/{name}", name)
            except FileNotFoundError:
                continue
            write_atomic(os.path.join(staging, name), data)
        write_atomic(os.path.join(staging, MANIFEST_NAME), text)  # last: a kill before it leaves no dataset here
