"""Datasets on Azure Blob Storage (``az://`` through adlfs) on Azurite, the emulator, in memory on 127.0.0.1: one
Azurite for the module (``tests/azurite.py``; ``make test`` installs it). Two small datasets (images in 3 shards,
episodes in 2) are converted locally once and uploaded; the store is reached only through the options of each call
(``storage_options={"connection_string": ...}`` in Python, ``--storage-option connection_string=...`` on the
command line), never the environment. ``info``, ``verify``, ``readers.images`` and ``readers.windows`` read them
back exactly as the local copy; the account key the connection string holds is in no message or log line.
"""

from __future__ import annotations

import logging
import os
import re

import pytest
from azurite import ACCOUNT_KEY, Azurite, unavailable_reason
from helpers import convert_image_tree, convert_obs_episodes, make_tree, skip_unless_ci
from shard_cache_helpers import assert_same_epochs, copies, epochs, manifest_shards
from tfshard import readers

adlfs = pytest.importorskip("adlfs")

CONTAINER = "tfshard"
WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1, "batch_size": 4, "seed": 0, "with_keys": True}


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    """``{"local": {...}, "az": {...}, "options": {...}}``: the datasets' local folders and az:// URLs, and the
    storage options that reach Azurite."""
    reason = unavailable_reason()
    if reason is not None:
        skip_unless_ci(f"Azure tests need Azurite: {reason}")
    root = tmp_path_factory.mktemp("azure")
    make_tree(str(root / "src"), per_class=9)
    convert_image_tree(root / "src", root / "served" / "photos", num_shards=3)
    os.rename(convert_obs_episodes(root / "ep", [9, 7, 8, 6, 10], seed=0, num_shards=2), root / "served" / "runs")
    with Azurite() as server, pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("AZURE_STORAGE")]:
            env.delenv(name)  # only the call's options reach the store
        env.setenv("TFSHARD_CACHE", str(root / "default-cache"))
        fs = adlfs.AzureBlobFileSystem(connection_string=server.connection_string)
        fs.mkdir(CONTAINER)
        for name in ("photos", "runs"):
            fs.put(str(root / "served" / name), f"{CONTAINER}/{name}", recursive=True)
        yield {"local": {n: str(root / "served" / n) for n in ("photos", "runs")},
               "az": {n: f"az://{CONTAINER}/{n}" for n in ("photos", "runs")},
               "options": {"connection_string": server.connection_string}}


@pytest.fixture
def no_key(caplog):
    """Every log line of the test, checked for the account key at its end."""
    caplog.set_level(logging.DEBUG, logger="tfshard")
    yield caplog
    assert ACCOUNT_KEY not in caplog.text


def test_info_and_verify_read_azure(azure, cli, no_key):
    for name in ("photos", "runs"):
        url, local = azure["az"][name], azure["local"][name]
        assert readers.info(url, storage_options=azure["options"]).manifest == readers.info(local).manifest
        option = f"connection_string={azure['options']['connection_string']}"
        shown = cli("info", url, "--storage-option", option)
        assert shown.exit_code == 0, shown.output
        assert shown.output.replace(url, "OUT") == cli("info", local).output.replace(local, "OUT")
        checked = cli("-v", "verify", url, "--storage-option", option)
        assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
        assert ACCOUNT_KEY not in checked.output


def test_images_read_back_exactly(azure, tmp_path, no_key):
    local, url = azure["local"]["photos"], azure["az"]["photos"]
    got = readers.images(url, batch_size=4, image_size=(16, 16), seed=0, shard_cache=str(tmp_path / "cache"),
                         storage_options=azure["options"])
    assert_same_epochs(epochs(got), epochs(readers.images(local, batch_size=4, image_size=(16, 16), seed=0)))
    assert copies(tmp_path / "cache") == {s.sha256 for s in manifest_shards(local)}


def test_windows_read_back_exactly(azure, tmp_path, no_key):
    local, url = azure["local"]["runs"], azure["az"]["runs"]
    got = readers.windows(url, **WINDOWS, shard_cache=str(tmp_path / "cache"), storage_options=azure["options"])
    assert_same_epochs(epochs(got), epochs(readers.windows(local, **WINDOWS)))


def test_a_wrong_account_key_is_refused_without_showing_it(azure, no_key):
    wrong = azure["options"]["connection_string"].replace(ACCOUNT_KEY, "V1JPTkctS0VZLTAxMjM0NTY3ODk=")
    url = f"az://{CONTAINER}/photos-wrong-key"
    with pytest.raises(PermissionError, match=re.escape(url) + r"/dataset.json: reading its metadata refused \("
                       r".*failed to authenticate.*\); check the credentials") as raised:
        readers.info(url, storage_options={"connection_string": wrong})
    assert "V1JPTkctS0VZ" not in str(raised.value), raised.value
