"""Faults on the read path of ``s3://``: ``tests/fault_proxy.py`` in front of moto's S3 server (one of each for the
module), reached through the proxy by the readers' own ``storage_options={"endpoint_url": proxy.url}``.

A connection dropped mid-shard and a ``503 SlowDown`` are retried and the read is exact; a shard cut short or
altered on every try (the shard cache reads ranges, which botocore does not checksum) is never cached nor served,
and the error names the URL, the problem and the fix; an upload altered on its way is caught by its ETag, refused,
and sent again by the rerun; an answer that stalls ends at the read timeout the options
set, with one clear error; and reading never lists the store (an eventually consistent listing cannot mislead it:
listings that all fail leave every read intact).
"""

from __future__ import annotations

import logging
import os
import re
import shutil

import pytest
import tensorflow as tf
from fault_proxy import FaultProxy
from helpers import convert_image_tree, make_tree
from shard_cache_helpers import assert_same_epochs, copies, epochs, manifest_shards
from tfshard import readers

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "faults"
SECRET = "FAKE-SECRET-7d3f9a21"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The images dataset (3 shards) local and on S3, moto and the proxy in front of it."""
    root = tmp_path_factory.mktemp("faults")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    make_tree(str(root / "src"), per_class=9)
    convert_image_tree(root / "src", root / "photos", num_shards=3)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    proxy = FaultProxy(f"http://{host}:{port}")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAULTS0000")
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        s3 = s3fs.S3FileSystem(endpoint_url=f"http://{host}:{port}")
        s3.mkdir(BUCKET)
        for name in ("photos", "stalls", "no-listing"):
            s3.put(str(root / "photos"), f"{BUCKET}/{name}", recursive=True)
        yield {"local": str(root / "photos"), "url": f"s3://{BUCKET}/photos", "proxy": proxy,
               "options": {"endpoint_url": proxy.url}}
    proxy.close()
    server.stop()


@pytest.fixture
def proxy(store, caplog):
    """The proxy with no rule, and every log line of the test checked for the secret at its end."""
    caplog.set_level(logging.INFO, logger="tfshard")
    store["proxy"].clear()
    yield store["proxy"]
    store["proxy"].clear()
    assert SECRET not in caplog.text


def _images(store, cache, **kwargs):
    return readers.images(store["url"], batch_size=4, image_size=(16, 16), seed=0, shard_cache=str(cache),
                          storage_options=store["options"], **kwargs)


def _shard(store, index: int) -> str:
    return os.path.basename(manifest_shards(store["local"])[index].remote)


def _faults(proxy) -> list[tuple[str, str]]:
    return [(path, what) for _, path, what in proxy.seen if what != "passed"]


def test_a_dropped_connection_and_a_slow_down_are_retried(store, proxy, tmp_path):
    first, second = _shard(store, 0), _shard(store, 2)
    proxy.add("drop", method="GET", path=f"/{BUCKET}/photos/{first}")
    proxy.add("503", method="GET", path=f"/{BUCKET}/photos/{second}")
    want = epochs(readers.images(store["local"], batch_size=4, image_size=(16, 16), seed=0))
    assert_same_epochs(epochs(_images(store, tmp_path / "cache")), want)
    assert [what for _, what in _faults(proxy)] == ["drop", "503"] or \
        sorted(what for _, what in _faults(proxy)) == ["503", "drop"], proxy.seen
    assert copies(tmp_path / "cache") == {s.sha256 for s in manifest_shards(store["local"])}


@pytest.mark.parametrize("fault", ["truncate", "alter"])
def test_a_shard_cut_short_or_altered_is_never_cached_nor_served(store, proxy, tmp_path, fault, caplog):
    name = _shard(store, 1)
    proxy.add(fault, method="GET", path=f"/{BUCKET}/photos/{name}", times=100)
    url = f"{store['url']}/{name}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{url}: could not be cached") +
                       ".*did not match the manifest.*fix what the log names"):
        epochs(_images(store, tmp_path / "cache"), 1)
    assert manifest_shards(store["local"])[1].sha256 not in copies(tmp_path / "cache")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{url}: could not cache it")]
    assert said and ("the manifest says" in said[0] or "Error" in said[0]), said


def test_a_shard_altered_once_is_fetched_again_and_read_exactly(store, proxy, tmp_path):
    proxy.add("alter", method="GET", path=f"/{BUCKET}/photos/{_shard(store, 0)}")
    want = epochs(readers.images(store["local"], batch_size=4, image_size=(16, 16), seed=0))
    assert_same_epochs(epochs(_images(store, tmp_path / "cache")), want)
    assert ("alter" in [what for _, what in _faults(proxy)]), proxy.seen


def test_a_stalled_answer_ends_at_the_read_timeout(store, proxy):
    url = f"s3://{BUCKET}/stalls"
    proxy.add("stall", method="GET", path=f"/{BUCKET}/stalls/dataset.json", times=1000, stall_s=5)
    quick = {**store["options"], "config_kwargs": {"read_timeout": 0.2, "retries": {"max_attempts": 1}}}
    with pytest.raises(OSError, match=re.escape(url) + r"/dataset.json: .* failed after 5 attempts \(.*[Tt]imeout.*\); "
                                      "check the URL, the endpoint and the network, or try again later"):
        readers.info(url, storage_options=quick)


def test_reading_never_lists_the_store(store, proxy, tmp_path):
    """An eventually consistent listing cannot mislead a read: the manifest names every shard, so no listing is
    made. Every listing here fails, and info, a reader and its epoch checks still read everything."""
    url = f"s3://{BUCKET}/no-listing"
    proxy.add("500", method="GET", path="list-type=2", times=10_000)
    proxy.add("500", method="GET", path="delimiter=", times=10_000)
    assert readers.info(url, storage_options=store["options"]).manifest == readers.info(store["local"]).manifest
    got = readers.images(url, batch_size=4, image_size=(16, 16), seed=0, shard_cache=str(tmp_path / "cache"),
                         storage_options=store["options"])
    assert_same_epochs(epochs(got), epochs(readers.images(store["local"], batch_size=4, image_size=(16, 16), seed=0)))
    assert _faults(proxy) == [], proxy.seen


def test_an_upload_altered_on_its_way_is_refused_and_the_rerun_sends_it_again(store, proxy, tmp_path):
    from tfshard.format import objects
    from tfshard.tools.push import push

    local, url, name = str(tmp_path / "photos"), f"s3://{BUCKET}/pushed", _shard(store, 1)
    shutil.copytree(store["local"], local)
    objects.use_storage_options(url, store["options"])
    proxy.add("alter_sent", method="PUT", path=f"/{BUCKET}/pushed/{name}")
    with pytest.raises(OSError, match=re.escape(f"{url}/{name}: did not land whole (got ") + ".*ETag.*; run the same "
                       "command again"):
        push(local, url, uploads=1)
    assert "dataset.json" not in [p.rsplit("/", 1)[-1] for _, p, _ in proxy.seen]  # no manifest over a bad shard
    report = push(local, url)
    assert (report.kept, report.uploaded) == (1, len(os.listdir(store["local"])) - 1), report
    assert readers.info(url).manifest == readers.info(local).manifest
    want = epochs(readers.images(local, batch_size=4, image_size=(16, 16), seed=0))
    assert_same_epochs(epochs(_images({**store, "url": url}, tmp_path / "cache")), want)
