"""A dataset folder as a whole: is it one, and its validated manifest (``load_manifest``).

Used by the readers, ``tfshard info``/``verify`` and the converter alike. The
manifest is untrusted input: its size is checked before it is read, it must be a
regular file, and it is validated field by field (``format/manifest.py``).
"""

from __future__ import annotations

import hashlib
import os

from . import manifest as manifest_lib
from . import objects, untrusted
from .errors import ManifestError, NotRegularFileError
from .names import LOCK_NAME, STATE_DIR
from .objects import uses_fsspec
from .storage import can_list, exists, file_identity, is_url, isdir, join, listdir, open_for_reading, stat_regular


def read_small_file(path: str, what: str, limit: int = manifest_lib.MAX_MANIFEST_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a manifest or state file), size checked first.

    Raises:
      FileNotFoundError: nothing there.
      ValueError: not a regular file, or larger than ``limit``.
    """
    size, _ = stat_regular(path)
    if size > limit:
        raise ManifestError(
            f"{path}: {what} of {size:,} bytes, over the {limit:,}-byte limit; this is not a file tfshard wrote"
        )
    if uses_fsspec(path):  # read whole and retried: a read that fails midway (a drop, a timeout) is tried again
        data = objects.read_bytes(path, limit + 1)
    else:
        with open_for_reading(path) as f:
            data = f.read(limit + 1)
    if len(data) > limit:
        raise ManifestError(f"{path}: {what} grew past the {limit:,}-byte limit while being read")
    return data


def check_output_folder(out: str) -> None:
    """OUT, when it exists, must be a folder (a file there gives one clear error, not a traceback later)."""
    if is_url(out):
        if can_list(out) and exists(out) and not isdir(out):
            raise NotADirectoryError(f"{out}: a file, not a folder; pass a dataset folder")
        return
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"{out}: a file, not a folder; pass a dataset folder")


_CONVERT = "tfshard images|episodes SRC OUT"


def _no_manifest(out: str, path: str) -> FileNotFoundError:
    """What is at ``out`` instead of a dataset, and what to do about it (its folder exists, its manifest does not)."""
    if not can_list(out):  # a web server: its folder cannot be seen, only the manifest's URL
        return FileNotFoundError(
            f"{path}: no manifest at this URL; pass the URL of a dataset's folder (the one holding "
            f"{manifest_lib.MANIFEST_NAME}), or check that the server serves it")
    names = sorted(listdir(out))
    if STATE_DIR in names:
        return FileNotFoundError(
            f"{path}: no manifest; a conversion into {out} has not finished (it holds {STATE_DIR}/ but no "
            f"{manifest_lib.MANIFEST_NAME}); rerun the same `{_CONVERT}` command to finish it"
        )
    others = [n for n in names if n != LOCK_NAME]
    if not others:
        return FileNotFoundError(
            f"{path}: no manifest; {out} is an empty folder, not a tfshard dataset; pass the OUT folder of a "
            f"conversion, or convert into it with `{_CONVERT}`"
        )
    shards = sum(manifest_lib.is_shard_name(n) for n in others)
    if shards:
        hint = (f"it holds {shards} shard file(s) but no {manifest_lib.MANIFEST_NAME}: rerun the conversion with "
                "--overwrite")
    else:
        hint = f"pass the OUT folder of a conversion, or convert into another folder with `{_CONVERT}`"
    shown = others[:3] + ([f"... {len(others) - 3} more"] if len(others) > 3 else [])
    return FileNotFoundError(f"{path}: no manifest; {out} is not a tfshard dataset (got {shown!r}); {hint}")


def load_manifest(out: str, consistency: bool = True) -> manifest_lib.Manifest:
    """Reads and validates ``out/dataset.json`` (``consistency``: see ``untrusted.manifest_from_dict``).

    Raises:
      FileNotFoundError: ``out`` does not exist, or holds no manifest; the message says which, and whether
        it is an unfinished conversion (rerun it), an empty folder or some other folder (not a dataset).
      NotADirectoryError: ``out`` is a file.
      ValueError: the manifest is not a valid tfshard manifest (the message names the field).
    """
    if not is_url(out) and os.path.basename(out) == manifest_lib.MANIFEST_NAME and os.path.isfile(out):
        raise NotADirectoryError(
            f"{out}: the manifest file, not its dataset folder; pass the folder that holds it "
            f"({os.path.dirname(out) or '.'})"
        )
    path = join(out, manifest_lib.MANIFEST_NAME)
    # A store's folder is seen only in a listing, which may lag the writes (eventual consistency): its manifest,
    # looked up by name, decides; the folder is looked at only to say what is wrong when there is none.
    if not (uses_fsspec(out) and exists(path)):
        check_output_folder(out)
        if can_list(out) and not exists(out):
            raise FileNotFoundError(
                f"{out}: no such folder; pass the OUT folder of a conversion (`{_CONVERT}`), or check the path"
            )
        if not exists(path):
            raise _no_manifest(out, path)
    try:
        data = read_small_file(path, "manifest")
    except NotRegularFileError as e:
        raise ManifestError(f"{e}; {manifest_lib.MANIFEST_NAME} must be the file tfshard wrote") from None
    return untrusted.from_json(data, path, consistency)


def manifest_identity(path: str) -> tuple:
    """What tells ``path/dataset.json`` apart from another written in its place: its ``file_identity``, and on a
    URL its sha256 too (TensorFlow's GCS client may answer a stat from its cache); ``()`` when it cannot be read.

    A reader takes it before loading the manifest and compares it each epoch (``readers/epoch_guard.py``).
    """
    manifest = join(path, manifest_lib.MANIFEST_NAME)
    try:
        found = file_identity(manifest)
        if is_url(manifest):
            found = (*found, hashlib.sha256(read_small_file(manifest, "manifest")).hexdigest())
    except (OSError, ValueError):  # NotRegularFileError and an over-large manifest are ValueErrors
        return ()
    return found
