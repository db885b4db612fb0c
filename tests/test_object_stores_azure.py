"""Datasets on Azure Blob Storage (``az://`` through adlfs) on Azurite, the emulator, in memory on 127.0.0.1: one
Azurite for the module (``tests/azurite.py``; ``make test`` installs it). Two small datasets (images in 3 shards,
episodes in 2) are converted locally once and uploaded; the store is reached only through the options of each call
(``storage_options={"connection_string": ...}`` in Python, ``--storage-option connection_string=...`` on the
command line), never the environment. ``info``, ``verify``, ``readers.images`` and ``readers.windows`` read them
back exactly as the local copy; the account key the connection string holds is in no message or log line.
"""

from __future__ import annotations

import hashlib
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
               "options": {"connection_string": server.connection_string}, "src": str(root / "src")}


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


def test_push_and_a_conversion_into_azure_read_back_exactly(azure, cli, tmp_path, no_key):
    """``tfshard push OUT az://...`` and ``tfshard images SRC az://... --tfds`` land every file, checked: the size and
    the MD5 Azure keeps of each blob (its ETag is no checksum); what they wrote reads back as the local copy."""
    import shutil

    from tfshard.format import objects
    from tfshard.ingest.to_store import staging_folder

    option = ["--storage-option", f"connection_string={azure['options']['connection_string']}"]
    local, url = str(tmp_path / "photos"), f"az://{CONTAINER}/pushed"
    shutil.copytree(azure["local"]["photos"], local)
    shown = cli("push", local, url, *option)
    assert shown.exit_code == 0 and f"{url}: uploaded 5 files" in shown.output, shown.output
    landed = objects.stat(f"{url}/dataset.json")
    assert landed[2] == hashlib.md5(open(f"{local}/dataset.json", "rb").read()).hexdigest()
    assert "already holds this dataset" in cli("push", local, url, *option).output
    got = readers.images(url, batch_size=4, image_size=(16, 16), seed=0, shard_cache=str(tmp_path / "cache"),
                         storage_options=azure["options"])
    assert_same_epochs(epochs(got), epochs(readers.images(local, batch_size=4, image_size=(16, 16), seed=0)))
    url = f"az://{CONTAINER}/converted"
    shown = cli("images", azure["src"], url, "--num-shards", "2", "--workers", "0", "--tfds", *option)
    assert shown.exit_code == 0, shown.output
    staging = staging_folder(url)
    assert set(objects.list_objects(url)) == {n for n in os.listdir(staging) if not n.startswith(".")}
    assert "dataset_info.json" in objects.list_objects(url)
    checked = cli("verify", url, *option)
    assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
    got = readers.images(url, batch_size=4, image_size=(16, 16), seed=0, shard_cache=str(tmp_path / "cache"),
                         storage_options=azure["options"])
    assert_same_epochs(epochs(got), epochs(readers.images(staging, batch_size=4, image_size=(16, 16), seed=0)))


def test_a_blob_altered_on_its_way_up_is_caught_by_its_md5(azure, cli, tmp_path, no_key):
    """A byte changed in an upload (by a proxy in front of Azurite) lands a blob of the right size: its MD5 says it
    is not what was sent; the push stops before the manifest, and the same command then finishes it."""
    import shutil

    from fault_proxy import FaultProxy
    from tfshard.format import objects

    local, url = str(tmp_path / "photos"), f"az://{CONTAINER}/altered"
    shutil.copytree(azure["local"]["photos"], local)
    shard = os.path.basename(manifest_shards(local)[1].remote)
    endpoint = re.search(r"BlobEndpoint=(http://[^/;]+)", azure["options"]["connection_string"])[1]
    proxy = FaultProxy(endpoint)
    try:
        proxy.add("alter_sent", method="PUT", path=shard)
        through = azure["options"]["connection_string"].replace(endpoint, proxy.url)
        refused = cli("push", local, url, "--uploads", "1", "--storage-option", f"connection_string={through}")
    finally:
        proxy.close()
    assert refused.exit_code != 0 and re.search(
        re.escape(f"{url}/{shard}: did not land whole (got ") + r"\d+ bytes, ETag '[0-9a-f]{32}'; sent \d+ bytes, "
        r"ETag '[0-9a-f]{32}'\); run the same command again", refused.output), refused.output
    assert ACCOUNT_KEY not in refused.output
    assert "dataset.json" not in objects.list_objects(url)
    option = ["--storage-option", f"connection_string={azure['options']['connection_string']}"]
    finished = cli("push", local, url, *option)
    assert finished.exit_code == 0, finished.output
    checked = cli("verify", url, *option)
    assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
