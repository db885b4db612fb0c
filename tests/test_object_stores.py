"""Datasets on the stores TensorFlow cannot open (``format/objects.py``): ``s3://`` on moto's S3 server and
``http://`` on a local web server, both on 127.0.0.1. Two small datasets (images in 3 shards, episodes in 2) are
converted locally once for the module and uploaded; every test reads them back through the store and compares
with the local copy: ``tfshard info`` and ``verify``, ``readers.images`` (file order and ``shuffle="global"``),
``readers.episodes``, ``readers.windows`` resident and streamed, with a shard cache and with the default folder. A
tampered object is never cached nor served; an unsupported scheme, a cache too small, a missing dataset are one
clear line each; and no message or log line holds the secret the credentials carry.
"""

from __future__ import annotations

import copy
import functools
import http.server
import logging
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
from helpers import convert_image_tree, convert_obs_episodes, make_tree, write_jpeg
from shard_cache_helpers import assert_same_epochs, copies, epochs, manifest_shards
from tfshard import readers
from tfshard.format import objects

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "tfshard"
SECRET = "FAKE-SECRET-0b5e7c1d"  # what the store's credentials carry: never in a message or a log line
KEY_ID = "AKIAFAKEKEYID0000"
WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1, "batch_size": 4, "seed": 0, "with_keys": True}


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A static web server that answers ``Range: bytes=a-b`` (as S3, nginx and CDNs do), quietly."""

    failures: dict[str, int] = {}  # path -> 503s answered; under /flaky/ the first two of each path are 503s

    def log_message(self, *args):
        pass

    def send_head(self):
        if self.path.startswith("/flaky/") or self.path.startswith("/down/"):
            seen = self.failures[self.path] = self.failures.get(self.path, 0) + 1
            if self.path.startswith("/down/") or seen <= 2:
                self.send_error(503, "Slow Down")
                return None
            self.path = self.path.removeprefix("/flaky")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
        f = open(path, "rb")  # noqa: SIM115 (copyfile reads it, the handler closes it)
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(left))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """``{"local": {...}, "s3": {...}, "http": {...}}`` of the images and episodes datasets, the servers running and
    the environment holding the S3 credentials (the secret among them) and a default shard cache folder."""
    root = tmp_path_factory.mktemp("object-stores")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    make_tree(str(root / "src"), per_class=9)
    convert_image_tree(root / "src", root / "served" / "photos", num_shards=3)
    runs = convert_obs_episodes(root / "ep", [9, 7, 8, 6, 10], seed=0, num_shards=2)
    os.rename(runs, root / "served" / "runs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    web = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_RangeHandler, directory=str(root / "served")))
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        env.setenv("TFSHARD_CACHE", str(root / "default-cache"))
        s3 = s3fs.S3FileSystem(endpoint_url=f"http://{host}:{port}", key=KEY_ID, secret=SECRET)
        s3.mkdir(BUCKET)  # in us-east-1 (AWS_DEFAULT_REGION): no location constraint
        for name in ("photos", "runs"):
            s3.put(str(root / "served" / name), f"{BUCKET}/{name}", recursive=True)
        web_root = f"http://127.0.0.1:{web.server_port}"
        urls = {"local": {n: str(root / "served" / n) for n in ("photos", "runs")},
                "s3": {n: f"s3://{BUCKET}/{n}" for n in ("photos", "runs")},
                "http": {n: f"http://127.0.0.1:{web.server_port}/{n}" for n in ("photos", "runs")},
                "root": root, "s3fs": s3, "web": web_root}
        yield urls
    web.shutdown()
    server.stop()


@pytest.fixture
def no_secret(caplog):
    """Every log line of the test, checked for the secret at its end."""
    caplog.set_level(logging.DEBUG, logger="tfshard")
    yield caplog
    assert SECRET not in caplog.text and KEY_ID not in caplog.text


def _windows(ds) -> list[list[tuple]]:
    """Each epoch's windows as sorted ``(episode, start, window bytes, target bytes)``."""
    return [sorted((int(e), int(t), x.tobytes(), y.tobytes()) for batch in epoch for e, t, x, y in zip(*batch))
            for epoch in epochs(ds)]


def _images(path, **kwargs):
    return readers.images(path, batch_size=4, image_size=(16, 16), seed=0, **kwargs)


@pytest.mark.parametrize("store", ["s3", "http"])
def test_info_and_verify_read_the_store(stores, store, cli, no_secret):
    for name in ("photos", "runs"):
        url, local = stores[store][name], stores["local"][name]
        assert readers.info(url).manifest == readers.info(local).manifest
        shown = cli("info", url)
        assert shown.exit_code == 0, shown.output
        assert shown.output.replace(url, "OUT") == cli("info", local).output.replace(local, "OUT")
        checked = cli("verify", url)
        assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output


@pytest.mark.parametrize("store", ["s3", "http"])
def test_images_read_back_exactly(stores, store, tmp_path, no_secret):
    local, url = stores["local"]["photos"], stores[store]["photos"]
    want = epochs(_images(local))
    assert_same_epochs(epochs(_images(url, shard_cache=str(tmp_path / "cache"))), want)
    assert copies(tmp_path / "cache") == {s.sha256 for s in manifest_shards(local)}
    # records by position in a global shuffle (readers/indexed/): every copy fetched first
    ordered = epochs(_images(local, shuffle="global"))
    assert_same_epochs(epochs(_images(url, shuffle="global", shard_cache=str(tmp_path / "cache"))), ordered)


def test_without_shard_cache_the_default_folder_is_used_and_said_once(stores, caplog):
    caplog.set_level(logging.INFO, logger="tfshard")
    local, url = stores["local"]["photos"], stores["s3"]["photos"]
    want = epochs(_images(local))
    assert_same_epochs(epochs(_images(url)), want)
    assert_same_epochs(epochs(_images(url, training=True)), epochs(_images(local, training=True)))
    folder = os.environ["TFSHARD_CACHE"]
    assert copies(folder) == {s.sha256 for s in manifest_shards(local)}
    said = [r.getMessage() for r in caplog.records if "verified local copies in" in r.getMessage()]
    assert len(said) == 1 and folder in said[0] and "50 GB" in said[0], said


@pytest.mark.parametrize("store", ["s3", "http"])
def test_episodes_and_windows_read_back_exactly(stores, store, tmp_path, no_secret):
    local, url = stores["local"]["runs"], stores[store]["runs"]
    cache = {"shard_cache": str(tmp_path / "cache")}
    assert_same_epochs(epochs(readers.episodes(url, **cache), 1), epochs(readers.episodes(local), 1))
    assert_same_epochs(epochs(readers.windows(url, **WINDOWS, **cache)), epochs(readers.windows(local, **WINDOWS)))
    # streamed windows come in an order a parallel read decides, also locally: the same windows each epoch
    assert _windows(readers.windows(url, resident=False, **WINDOWS, **cache)) == \
        _windows(readers.windows(local, resident=False, **WINDOWS))
    assert_same_epochs(epochs(readers.episodes(url, shuffle="global", seed=0, **cache), 1),
                       epochs(readers.episodes(local, shuffle="global", seed=0), 1))


def test_a_tampered_object_is_never_cached_nor_served(stores, tmp_path, cli, no_secret):
    s3, local = stores["s3fs"], stores["local"]["photos"]
    s3.put(local, f"{BUCKET}/tampered", recursive=True)
    shard = manifest_shards(local)[1]
    name = os.path.basename(shard.remote)
    data = bytearray(open(shard.remote, "rb").read())
    data[len(data) // 2] ^= 0xFF
    s3.pipe(f"{BUCKET}/tampered/{name}", bytes(data))
    url = f"s3://{BUCKET}/tampered"
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{url}/{name}: could not be cached") +
                       ".*read only from a verified local copy; raise shard_cache_limit"):
        epochs(_images(url, shard_cache=str(tmp_path / "cache")), 1)
    assert shard.sha256 not in copies(tmp_path / "cache")
    assert copies(tmp_path / "cache") <= {s.sha256 for s in manifest_shards(local)}
    checked = cli("verify", url)
    assert checked.exit_code != 0 and f"{url}/{name}: corrupted shard" in checked.output, checked.output
    assert SECRET not in checked.output


def test_a_limit_below_the_pipelines_shards_is_refused_when_built(stores, tmp_path):
    total = sum(s.size for s in manifest_shards(stores["local"]["photos"]))
    url = stores["s3"]["photos"]
    with pytest.raises(ValueError, match=re.escape(f"{url}: shard_cache_limit={total - 1} bytes is below this "
                                                   "pipeline's 3 shards") + f".*raise shard_cache_limit to at least "
                                                                            f"{total} bytes"):
        _images(url, shard_cache=str(tmp_path / "cache"), shard_cache_limit=total - 1)


def test_unsupported_scheme_and_missing_dataset_are_one_line(stores, cli, no_secret):
    with pytest.raises(objects.UnsupportedSchemeError,
                       match=r"^ftp://host/ds: tfshard cannot read ftp:// URLs here \(got scheme 'ftp'\); the ones "
                             r"that work: local paths, gs://, s3://.*https://.*; `pip install 'tfshard\[cloud\]'`"):
        readers.info("ftp://host/ds")
    shown = cli("info", "ftp://host/ds")
    assert shown.exit_code != 0 and "pip install 'tfshard[cloud]'" in shown.output and len(
        shown.output.strip().splitlines()) == 1, shown.output
    missing = f"s3://{BUCKET}/nothing-here"
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        readers.info(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(stores["http"]["photos"] + "x/dataset.json: no manifest")):
        readers.info(stores["http"]["photos"] + "x")


def test_storage_options_reach_the_store_and_their_secret_no_message(stores, no_secret):
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    objects.set_storage_options("s3", {"endpoint_url": endpoint, "key": KEY_ID, "secret": SECRET + "-2"})
    try:
        assert objects.size(stores["s3"]["photos"] + "/dataset.json") > 0
        with pytest.raises(FileNotFoundError) as raised:
            objects.size(f"s3://{BUCKET}/{SECRET}-2/dataset.json")  # a secret in the URL is hidden too
        assert SECRET not in str(raised.value) and "***" in str(raised.value)
        assert objects.redact(f"key {KEY_ID} secret {SECRET}-2 at https://h/x?sig=abc") == \
            "key *** secret *** at https://h/x?***"
    finally:
        objects.set_storage_options("s3", None)


def test_reading_a_local_dataset_imports_no_cloud_library(stores):
    code = ("import sys; from tfshard import readers; "
            f"ds = readers.images({stores['local']['photos']!r}, batch_size=4, image_size=(16, 16), seed=0); "
            "list(ds.take(1)); readers.info(sys.argv[1]); "
            "print(sorted(m for m in ('fsspec', 's3fs', 'adlfs', 'aiohttp', 'botocore', 'aiobotocore') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, stores["local"]["runs"]], capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_the_store_is_asked_again_after_a_503_a_bounded_number_of_times(stores, caplog, no_secret):
    caplog.set_level(logging.INFO, logger="tfshard")
    flaky = f"{stores['web']}/flaky/photos"
    assert readers.info(flaky).manifest == readers.info(stores["local"]["photos"]).manifest
    assert "Slow Down" in caplog.text and "trying again" in caplog.text
    down = f"{stores['web']}/down/photos/dataset.json"
    with pytest.raises(OSError, match=re.escape(down) + r": reading its metadata failed after 5 attempts \(.*503.*\); "
                                      "check the URL, the endpoint and the network, or try again later"):
        objects.size(down)


def test_writing_over_http_is_refused_and_tfshard_cache_fills_from_it(stores, cli, tmp_path, no_secret):
    shown = cli("images", str(stores["root"] / "src"), f"{stores['web']}/new")
    assert shown.exit_code != 0 and "tfshard writes datasets to s3://, az:// and abfs:// (got a http:// OUT)" in \
        shown.output, shown.output
    filled = cli("cache", stores["s3"]["photos"], str(tmp_path / "cache"))
    assert filled.exit_code == 0, filled.output
    assert copies(tmp_path / "cache") == {s.sha256 for s in manifest_shards(stores["local"]["photos"])}


def test_preview_and_bench_read_the_store(stores, cli, tmp_path, no_secret):
    """``tfshard preview`` draws from the store what it draws locally (all but the footer naming the path), shard by
    shard through the default cache; ``bench`` times the store's dataset, ``--compare`` its floors too."""
    import numpy as np
    from PIL import Image
    from tfshard.tools.preview import CAPTION_HEIGHT

    pictures = {}
    for where in ("local", "s3"):
        for name in ("photos", "runs"):
            drawn = cli("preview", stores[where][name], "-o", tmp_path / f"{where}-{name}.png", "-n", "2")
            assert drawn.exit_code == 0, drawn.output
            pictures[where, name] = np.asarray(Image.open(tmp_path / f"{where}-{name}.png"))
    sheet = pictures["s3", "photos"]
    assert np.array_equal(sheet[:-CAPTION_HEIGHT], pictures["local", "photos"][:-CAPTION_HEIGHT])
    assert pictures["s3", "runs"].shape == pictures["local", "runs"].shape
    url = stores["s3"]["photos"]
    timed = cli("bench", url, "--image-size", "16", "--batch-size", "4", "--compare")
    assert timed.exit_code == 0 and "tfshard cache: cached epoch" in timed.output, timed.output
    assert "floors over 18 JPEGs in RAM" in timed.output, timed.output
    timed = cli("bench", stores["s3"]["runs"], "--window", "4", "--batch-size", "4", "--streamed", "--epochs", "1")
    assert timed.exit_code == 0 and "25 windows of 4" in timed.output, timed.output
    assert "epoch 1: 24 windows" in timed.output, timed.output


def test_a_tf_data_service_reads_the_store_through_its_workers_cache(stores, tmp_path):
    """A worker fetches the store's shards into the shard cache on its host (here in this process, finding the store
    through the environment as a worker would); storage_options, which could not reach a worker, are refused."""
    from tfshard.readers import service as service_lib

    def keys(path, **kwargs):
        ds = _images(path, training=False, drop_remainder=False, **kwargs)
        return sorted((int(label), image.tobytes()) for pixels, labels in ds
                      for image, label in zip(pixels.numpy(), labels.numpy()))

    url = stores["s3"]["photos"]
    dispatcher = service_lib.start_dispatcher(0)
    worker = service_lib.start_worker(dispatcher.target, 0, "localhost:%port%")
    try:
        assert keys(url, service=dispatcher.target, shard_cache=str(tmp_path / "cache")) == \
            keys(stores["local"]["photos"])
    finally:
        worker.stop()
        dispatcher.stop()
    assert copies(tmp_path / "cache") == {s.sha256 for s in manifest_shards(stores["local"]["photos"])}
    with pytest.raises(ValueError, match=re.escape(f"{url}: storage_options do not reach tf.data service workers, "
                                                   "which read the store themselves (got service='localhost:5050' "
                                                   "and storage_options ['endpoint_url']); drop storage_options")):
        readers.windows(url, **WINDOWS, service="localhost:5050", storage_options={"endpoint_url": "http://x"})


def test_tls_trusts_the_bundle_ssl_cert_file_or_aws_ca_bundle_names(stores, cli, tmp_path, monkeypatch, no_secret):
    """The store behind TLS with a certificate of a private CA (tests/tls.py; a proxy in front of moto and of the web
    server): read with SSL_CERT_FILE (S3 and HTTPS) or AWS_CA_BUNDLE (S3) naming the CA; without, one line naming
    the URL, the untrusted certificate and the fix, at once (no retry can help)."""
    from fault_proxy import FaultProxy
    from tls import private_ca

    ca, context = private_ca(tmp_path)
    stores["s3fs"].put(stores["local"]["photos"], f"{BUCKET}/tls", recursive=True)
    s3_front, web_front = (FaultProxy(upstream, ssl_context=context)
                           for upstream in (os.environ["AWS_ENDPOINT_URL"], stores["web"]))
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_front.url)
    urls = {"s3": f"s3://{BUCKET}/tls", "https": f"{web_front.url}/photos"}
    want = readers.info(stores["local"]["photos"]).manifest
    try:
        for url in urls.values():
            # one try inside botocore too: it retries a failed handshake as any failed connection
            once = {"config_kwargs": {"retries": {"max_attempts": 1}}} if url.startswith("s3") else None
            with pytest.raises(OSError, match=re.escape(f"{url}/dataset.json: reading its metadata failed: its TLS "
                                                        "certificate is not trusted here (") +
                               r".*CERTIFICATE_VERIFY_FAILED.*\); set SSL_CERT_FILE to the CA bundle that signed the "
                               r"store's certificate \(for s3://, AWS_CA_BUNDLE too, which wins over it\)$"):
                readers.info(url, storage_options=once)
        monkeypatch.setenv("SSL_CERT_FILE", ca)
        for url in urls.values():
            assert readers.info(url).manifest == want
        checked = cli("verify", urls["s3"])
        assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
        monkeypatch.delenv("SSL_CERT_FILE")
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        assert readers.info(urls["s3"]).manifest == want
    finally:
        s3_front.close()
        web_front.close()


# --- writing: tfshard push, and a conversion into a store (tools/push.py) -------------------------------------------


def _dataset_copy(stores, name, tmp_path) -> str:
    """A copy of a local dataset (a push journals into its state folder while it runs)."""
    copy = str(tmp_path / name)
    shutil.copytree(stores["local"][name], copy)
    return copy


def _objects(stores, url) -> set[str]:
    return set(objects.list_objects(url))


def _local_files(out) -> set[str]:
    return {n for n in os.listdir(out) if not n.startswith(".")}


def test_push_reads_back_exactly_in_every_mode(stores, cli, tmp_path, no_secret):
    cache = {"shard_cache": str(tmp_path / "cache")}
    for name in ("photos", "runs"):
        local, url = _dataset_copy(stores, name, tmp_path), f"s3://{BUCKET}/pushed-{name}"
        shown = cli("push", local, url)
        assert shown.exit_code == 0 and f"{url}: uploaded " in shown.output, shown.output
        assert _objects(stores, url) == _local_files(local)
        assert not os.path.exists(os.path.join(local, ".tfshard-state"))  # the journal went with the manifest
        again = cli("push", local, url)
        assert again.exit_code == 0 and "already holds this dataset" in again.output, again.output
    local, url = stores["local"]["photos"], f"s3://{BUCKET}/pushed-photos"
    assert readers.info(url).manifest == readers.info(local).manifest
    assert_same_epochs(epochs(_images(url, **cache)), epochs(_images(local)))
    assert_same_epochs(epochs(_images(url, shuffle="global", **cache)), epochs(_images(local, shuffle="global")))
    local, url = stores["local"]["runs"], f"s3://{BUCKET}/pushed-runs"
    assert_same_epochs(epochs(readers.episodes(url, **cache), 1), epochs(readers.episodes(local), 1))
    assert_same_epochs(epochs(readers.windows(url, **WINDOWS, **cache)), epochs(readers.windows(local, **WINDOWS)))
    assert _windows(readers.windows(url, resident=False, **WINDOWS, **cache)) == \
        _windows(readers.windows(local, resident=False, **WINDOWS))
    assert cli("verify", url).exit_code == 0


def test_a_killed_push_resumes_uploading_only_the_rest_manifest_last(stores, tmp_path, no_secret):
    from fault_proxy import FaultProxy
    from stop_point import kill_group, start_held

    local, url = _dataset_copy(stores, "photos", tmp_path), f"s3://{BUCKET}/killed"
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"])
    env = {"AWS_ENDPOINT_URL": proxy.url}
    try:
        ready = str(tmp_path / "held")
        proc = start_held(["push", local, url, "--uploads", "1"], "_send#3", ready, env=env)
        kill_group(proc)  # SIGKILL before the third file is sent: two landed
        first = [path for method, path, _ in proxy.seen if method == "PUT"]
        assert len(first) == 2, proxy.seen
        assert "dataset.json" not in _objects(stores, url)  # no manifest while shards are missing
        proxy.clear()
        rerun = subprocess.run([sys.executable, "-m", "tfshard", "push", local, url], capture_output=True, text=True,
                               env={**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert rerun.returncode == 0, rerun.stderr
        second = [path for method, path, _ in proxy.seen if method == "PUT"]
    finally:
        proxy.close()
    files = _local_files(local)
    assert sorted(p.rsplit("/", 1)[-1] for p in first + second) == sorted(files)  # each sent once
    assert second[-1].endswith("/dataset.json") and "kept 2 already there" in rerun.stdout, rerun.stdout
    assert _objects(stores, url) == files
    assert readers.info(url).manifest == readers.info(local).manifest


def test_a_conversion_into_s3_killed_as_its_manifest_goes_up_resumes_with_the_same_command(stores, tmp_path):
    from fault_proxy import FaultProxy
    from stop_point import kill_group, start_held
    from tfshard.ingest.to_store import staging_folder

    url = f"s3://{BUCKET}/converted-killed"
    args = ["images", str(stores["root"] / "src"), url, "--num-shards", "2", "--workers", "0", "-q"]
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"])
    env = {"AWS_ENDPOINT_URL": proxy.url, "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        # the manifest's upload is the one on the main thread (the other files go up in threads)
        kill_group(start_held(args, "_put", str(tmp_path / "held"), env=env))
        first = [path for method, path, _ in proxy.seen if method == "PUT"]
        assert "dataset.json" not in _objects(stores, url)
        proxy.clear()
        rerun = subprocess.run([sys.executable, "-m", "tfshard", *args], capture_output=True, text=True,
                               env={**os.environ, **env}, timeout=300,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert rerun.returncode == 0, rerun.stderr
        second = [path for method, path, _ in proxy.seen if method == "PUT"]
    finally:
        proxy.close()
    assert len(first) == 3 and [p.rsplit("/", 1)[-1] for p in second] == ["dataset.json"], (first, second)
    assert _objects(stores, url) == _local_files(staging_folder(url))


def test_a_local_file_that_does_not_match_its_manifest_is_never_uploaded(stores, cli, tmp_path, no_secret):
    photos, url = _dataset_copy(stores, "photos", tmp_path), f"s3://{BUCKET}/damaged"
    shard = os.path.basename(manifest_shards(photos)[0].remote)
    with open(os.path.join(photos, shard), "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    refused = cli("push", photos, url, "--uploads", "1")
    assert refused.exit_code != 0 and re.search(
        re.escape(os.path.join(photos, shard)) + r": does not match dataset.json \(got sha256 [0-9a-f]{12}\.\.\., "
        r"\d+ bytes; the manifest says [0-9a-f]{12}\.\.\.\); nothing of it was uploaded", refused.output), \
        refused.output
    assert shard not in _objects(stores, url) and "dataset.json" not in _objects(stores, url)
    # inputs.json is sent unhashed: a symlink planted under its name would upload what it points to
    linked, secret = str(tmp_path / "linked"), tmp_path / "credentials"
    shutil.copytree(stores["local"]["photos"], linked)
    secret.write_text(SECRET)
    os.remove(os.path.join(linked, "inputs.json"))
    os.symlink(secret, os.path.join(linked, "inputs.json"))
    refused = cli("push", linked, url)
    assert refused.exit_code != 0 and f"{linked}/inputs.json: not a file tfshard wrote (got a symlink); nothing was " \
        "uploaded" in refused.output, refused.output
    assert _objects(stores, url) == set()


def test_overwrite_removes_only_what_the_old_manifest_lists(stores, cli, tmp_path, no_secret):
    s3, url = stores["s3fs"], f"s3://{BUCKET}/replaced"
    photos, runs = _dataset_copy(stores, "photos", tmp_path), _dataset_copy(stores, "runs", tmp_path)
    assert cli("push", photos, url).exit_code == 0
    s3.pipe(f"{BUCKET}/replaced/notes/README.txt", b"someone else's")
    refused = cli("push", runs, url)
    assert refused.exit_code != 0 and f"{url}: holds another dataset (got a dataset.json that differs from " \
        f"{runs}'s); pass --overwrite" in refused.output, refused.output
    replaced = cli("push", runs, url, "--overwrite")
    assert replaced.exit_code == 0 and "removed 4 objects of the old dataset" in replaced.output, replaced.output
    assert _objects(stores, url) == _local_files(runs) | {"notes/README.txt"}
    assert s3.cat(f"{BUCKET}/replaced/notes/README.txt") == b"someone else's"
    assert readers.info(url).manifest == readers.info(runs).manifest


def test_an_overwrite_killed_after_the_old_manifest_went_finishes_with_the_same_command(stores, cli, tmp_path):
    from stop_point import kill_group, start_held

    s3, url = stores["s3fs"], f"s3://{BUCKET}/replaced-killed"
    photos, runs = _dataset_copy(stores, "photos", tmp_path), _dataset_copy(stores, "runs", tmp_path)
    assert cli("push", photos, url).exit_code == 0
    s3.pipe(f"{BUCKET}/replaced-killed/notes.txt", b"someone else's")
    args = ["push", runs, url, "--overwrite", "--uploads", "1"]
    kill_group(start_held(args, "_send#2", str(tmp_path / "held")))  # old manifest gone, one new shard landed
    assert "dataset.json" not in _objects(stores, url)
    finished = cli(*args)
    assert finished.exit_code == 0 and "kept 1 already there, removed 4 objects of the old dataset" in \
        finished.output, finished.output
    assert _objects(stores, url) == _local_files(runs) | {"notes.txt"}
    assert readers.info(url).manifest == readers.info(runs).manifest
    # stopped while removing the old objects, once the new manifest landed: the same command removes the rest
    from tfshard.ingest.push import push

    removing = objects.delete
    calls = []

    def stopped(target):
        calls.append(target)
        if len(calls) == 3:  # the old manifest, one old object, then Ctrl-C
            raise KeyboardInterrupt
        removing(target)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(objects, "delete", stopped)
        with pytest.raises(KeyboardInterrupt):
            push(photos, url, overwrite=True)
    assert readers.info(url).manifest == readers.info(photos).manifest
    finished = cli("push", photos, url, "--overwrite")
    assert finished.exit_code == 0 and "already holds this dataset (5 files); nothing to upload, removed 1 objects " \
        "of the old dataset" in finished.output, finished.output
    assert _objects(stores, url) == _local_files(photos) | {"notes.txt"}


def test_a_folder_holding_other_objects_is_refused(stores, cli, tmp_path, no_secret):
    s3, url = stores["s3fs"], f"s3://{BUCKET}/taken"
    s3.pipe(f"{BUCKET}/taken/train-00000-of-00003.tfrecord", b"not ours")
    photos = _dataset_copy(stores, "photos", tmp_path)
    refused = cli("push", photos, url)
    assert refused.exit_code != 0 and f"{url}: not an empty folder (got 1 objects: " \
        "['train-00000-of-00003.tfrecord']); pass --overwrite" in refused.output, refused.output
    refused = cli("push", photos, url, "--overwrite")  # beside others, yes; in their place, never
    assert refused.exit_code != 0 and "no manifest there lists under names this dataset writes" in refused.output
    assert _objects(stores, url) == {"train-00000-of-00003.tfrecord"}
    assert s3.cat(f"{BUCKET}/taken/train-00000-of-00003.tfrecord") == b"not ours"
    # S3 would keep a query or a '..' in the objects' names (and a SAS token in a query would be shown)
    for odd, got in ((f"{url}?sig={SECRET}", "a query: ?***"), (f"{url}/../x", "a '..' part"),
                     (f"s3://{BUCKET}//x", "an empty part: //")):
        for args in (["push", photos, odd], ["images", stores["root"] / "src", odd]):
            refused = cli(*args)
            assert refused.exit_code != 0 and f"{odd.split('?')[0]}: not a folder URL tfshard writes to (got " \
                f"{got}); pass the folder's plain URL" in refused.output, refused.output
            assert SECRET not in refused.output
    assert not [n for n in objects.list_objects(f"s3://{BUCKET}") if "?" in n or "/../" in n or n.startswith("/")]


def test_converting_into_s3_stages_locally_then_pushes(stores, cli, tmp_path, no_secret):
    from tfshard.ingest.to_store import staging_folder

    url = f"s3://{BUCKET}/converted"
    src = str(stores["root"] / "src")
    args = ["images", src, url, "--num-shards", "2", "--workers", "0", "--tfds"]
    shown = cli(*args)
    staging = staging_folder(url)
    assert shown.exit_code == 0 and f"converting into the local staging folder {staging}" in shown.output, \
        shown.output
    assert _objects(stores, url) == _local_files(staging) and "dataset_info.json" in _objects(stores, url)
    for name in ("dataset_info.json", "features.json"):  # TFDS's metadata, as written beside the staged shards
        assert stores["s3fs"].cat(f"{BUCKET}/converted/{name}") == open(os.path.join(staging, name), "rb").read()
    # TFDS (TensorFlow's file systems) opens the local copy: the line says which
    assert f"open it with tfds.builder_from_directory({staging!r})" in shown.output, shown.output
    checked = cli("verify", url)
    assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
    assert_same_epochs(epochs(_images(url, shard_cache=str(tmp_path / "cache"))), epochs(_images(staging)))
    again = cli(*args)
    assert again.exit_code == 0 and "already holds this dataset" in again.output, again.output
    refused = cli(*args[:-1], "--runner", "beam")
    assert refused.exit_code != 0 and f"{url}: --runner beam writes local and gs:// folders only" in refused.output


def _new_images(src, seed: int) -> None:
    """One new image in each class of each split of ``src``."""
    for i, folder in enumerate(sorted(os.path.dirname(p) for p in _jpegs(src))):
        write_jpeg(os.path.join(folder, f"new-{seed}.jpg"), seed + i)


def _jpegs(src) -> set[str]:
    return {os.path.join(d, n) for d, _, names in os.walk(src) for n in names if n.endswith(".jpg")}


def test_append_into_s3_reads_back_exactly_and_starts_from_the_store(stores, cli, tmp_path, monkeypatch,
                                                                      no_secret):
    """Three appends into the store, each beside the same append to a local copy: the store then reads back exactly
    as the local dataset, every split. The first from this machine's staging folder; the second from another
    machine (an empty cache: seeded from the store); the third from this machine again, whose staging folder the
    store has outgrown: seeded again, the other machine's append kept. No old shard is ever downloaded."""
    from tfshard.ingest.to_store import staging_folder

    src, local, url = tmp_path / "src", str(tmp_path / "local"), f"s3://{BUCKET}/appended"
    make_tree(str(src), per_class=3, splits=("train", "val"))
    flags = ["--num-shards", "1", "--workers", "0", "--tfds"]
    assert cli("images", src, url, *flags).exit_code == 0
    assert cli("images", src, local, *flags).exit_code == 0
    here = os.environ["TFSHARD_CACHE"]
    for generation, cache in ((1, here), (2, str(tmp_path / "other-machine")), (3, here)):
        monkeypatch.setenv("TFSHARD_CACHE", cache)
        _new_images(src, 100 * generation)
        shown = cli("images", src, url, *flags, "--append")
        assert shown.exit_code == 0 and f"appended: 4 new images as generation {generation}" in shown.output and \
            f"{url}: uploaded 7 files" in shown.output, shown.output  # a shard a split, TFDS 3, inputs, manifest
        assert cli("images", src, local, *flags, "--append").exit_code == 0
        assert readers.info(url).manifest == readers.info(local).manifest
        staged = {n for n in os.listdir(staging_folder(url)) if n.endswith(".tfrecord")}
        assert all(f"-g{generation:04d}-" in n for n in staged) or generation == 1, staged  # seeded: no old shard
    for split in ("train", "val"):
        got = _images(url, split=split, shard_cache=str(tmp_path / "cache"))
        assert_same_epochs(epochs(got), epochs(_images(local, split=split)))
    assert _objects(stores, url) == _local_files(local)
    again = cli("images", src, url, *flags, "--append")
    assert again.exit_code == 0 and f"{url}: already holds this dataset" in again.output, again.output


def test_an_append_killed_as_its_manifest_goes_up_resumes_with_the_same_command(stores, cli, tmp_path):
    """Killed once its new files landed: the store still holds the old dataset, whole; the same command then
    converts nothing again (the staging folder holds the append) and sends only dataset.json (the journal waited
    beside the staging folder while the append ran again)."""
    from fault_proxy import FaultProxy
    from stop_point import kill_group, start_held

    src, url = tmp_path / "src", f"s3://{BUCKET}/append-killed"
    make_tree(str(src), per_class=3)
    args = ["images", str(src), url, "--num-shards", "1", "--workers", "0", "-q"]
    assert cli(*args).exit_code == 0
    before = readers.info(url).manifest
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"])
    env = {"AWS_ENDPOINT_URL": proxy.url, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = functools.partial(subprocess.run, capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        _new_images(src, 5)
        kill_group(start_held([*args, "--append"], "_put", str(tmp_path / "held"), env=env))  # the manifest's PUT
        first = [path.rsplit("/", 1)[-1] for method, path, _ in proxy.seen if method == "PUT"]
        assert readers.info(url).manifest.fingerprint == before.fingerprint
        proxy.clear()
        rerun = run([sys.executable, "-m", "tfshard", *args, "--append"])
        assert rerun.returncode == 0, rerun.stderr
        second = [path.rsplit("/", 1)[-1] for method, path, _ in proxy.seen if method == "PUT"]
    finally:
        proxy.close()
    assert sorted(first) == ["inputs.json", "train-g0001-00000-of-00001.tfrecord"] and second == ["dataset.json"], \
        (first, second)
    assert readers.info(url).manifest.splits["train"].records == before.splits["train"].records + 2


def _append_locally(src, out) -> None:
    from tfshard.ingest import ConvertOptions, convert_images

    convert_images(str(src), str(out), ConvertOptions(num_shards=1), workers=0, progress=False, append=True)


def test_an_append_never_replaces_one_that_landed_after_it_started(stores, tmp_path, no_secret):
    """Two appends on top of the same dataset: the second to upload finds the store's manifest is no longer its
    base, and replaces nothing (the same command then starts again from the store's dataset)."""
    from tfshard.format.errors import InputError
    from tfshard.ingest.push import push
    from tfshard.ingest.push_append import push_append

    src, base, url = tmp_path / "src", tmp_path / "base", f"s3://{BUCKET}/append-raced"
    make_tree(str(src), per_class=3)
    convert_image_tree(src, base, num_shards=1)
    push(str(base), url)
    mine, theirs = str(tmp_path / "mine"), str(tmp_path / "theirs")
    for folder, seed in ((mine, 1), (theirs, 2)):
        shutil.copytree(base, folder)
        _new_images(src, seed)
        _append_locally(src, folder)
    assert push_append(theirs, url).uploaded == 3  # its shard, inputs.json, dataset.json
    with pytest.raises(InputError, match=re.escape(f"{url}: --append: its dataset changed since this append started "
                                                   "from it (got a dataset.json that ")):
        push_append(mine, url)
    assert readers.info(url).manifest == readers.info(theirs).manifest
    # another writer's manifest landing while files go up is never replaced, by an append or a push
    other, theirs_url = str(tmp_path / "other"), f"{url}-overwritten"
    convert_image_tree(src, other, num_shards=2)
    push(str(base), theirs_url)
    pushed = f"{url}-pushed"
    for target, run, message in (
            (theirs_url, lambda hook: push_append(theirs, theirs_url, uploads=1, on_file=hook),
             "--append: its dataset changed while this append was uploading (got another dataset.json there"),
            (pushed, lambda hook: push(str(base), pushed, uploads=1, on_file=hook),
             "another dataset.json landed there while this push ran (got one it did not write)")):
        landed = []

        def hook(name, target=target, landed=landed):
            if not landed:  # once the first file landed, another writer replaces the dataset there
                landed.append(push(other, target, overwrite=True))
        with pytest.raises((InputError, ValueError), match=re.escape(f"{target}: {message}")):
            run(hook)
        assert readers.info(target).manifest == readers.info(other).manifest


def test_an_append_onto_a_store_missing_an_old_shard_is_refused(stores, cli, tmp_path, no_secret):
    s3, src, url = stores["s3fs"], tmp_path / "src", f"s3://{BUCKET}/append-damaged"
    make_tree(str(src), per_class=3)
    args = ["images", src, url, "--num-shards", "2", "--workers", "0", "-q"]
    assert cli(*args).exit_code == 0
    shard = readers.info(url).manifest.splits["train"].shards[1].file
    s3.rm(f"{BUCKET}/append-damaged/{shard}")
    before = _objects(stores, url)
    _new_images(src, 7)
    refused = cli(*args, "--append")
    assert refused.exit_code != 0 and refused.output == (
        f"error: {url}/{shard}: listed in the store's dataset.json but not there (got no object); the dataset there "
        "is damaged and nothing was appended: restore the object (push the full dataset again with --overwrite), "
        "or convert SRC in full into another URL\n"), refused.output
    assert _objects(stores, url) == before and len(readers.info(url).manifest.appends) == 0


def test_the_python_converter_writes_into_s3_with_its_storage_options(stores, tmp_path, no_secret):
    """``convert_images(src, "s3://...", storage_options=...)``: with moto checking signatures, only the options'
    credentials are accepted (the environment's are refused), for that URL; a wrong secret is refused, unshown."""
    import urllib.request

    import botocore.session
    from tfshard.ingest import ConvertOptions, convert_images
    from tfshard.ingest.to_store import staging_folder

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    iam = botocore.session.get_session().create_client("iam", endpoint_url=endpoint, region_name="us-east-1")
    iam.create_user(UserName="converter")
    iam.put_user_policy(UserName="converter", PolicyName="all", PolicyDocument='{"Version": "2012-10-17", '
                        '"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}')
    made = iam.create_access_key(UserName="converter")["AccessKey"]
    given = {"key": made["AccessKeyId"], "secret": made["SecretAccessKey"]}

    def signatures(checked: bool) -> None:  # moto's switch: every request after it is authenticated, or none
        urllib.request.urlopen(urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0" if checked else b"inf", method="POST",
            headers={"Content-Type": "text/plain"}), timeout=30).close()

    src, url, reports = str(stores["root"] / "src"), f"s3://{BUCKET}/from-python", []
    signatures(True)
    try:
        manifest = convert_images(src, url, ConvertOptions(num_shards=2), workers=0, progress=False,
                                  storage_options=given, on_upload=reports.append)
        assert readers.info(url).manifest == manifest
        with pytest.raises(PermissionError):
            readers.info(stores["s3"]["photos"])  # the environment's credentials: refused
        wrong = f"s3://{BUCKET}/from-python-wrong"
        with pytest.raises(PermissionError) as refused:
            convert_images(src, wrong, ConvertOptions(num_shards=2), workers=0, progress=False,
                           storage_options={**given, "secret": SECRET + "-wrong"})
        assert SECRET not in str(refused.value) and made["SecretAccessKey"] not in str(refused.value)
        assert str(refused.value).startswith(f"{wrong}"), str(refused.value)
    finally:
        signatures(False)
    assert reports[0].lines() == [f"{url}: uploaded 4 files ({reports[0].sent_bytes / 1e6:.1f} MB), kept 0 already "
                                  "there; dataset.json last"]
    assert_same_epochs(epochs(_images(url, shard_cache=str(tmp_path / "cache"))),
                       epochs(_images(staging_folder(url))))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'local'}: storage_options apply to s3://")):
        convert_images(src, str(tmp_path / "local"), storage_options=given)  # before any work
    assert not os.path.exists(tmp_path / "local")


def test_azure_is_wired_and_its_connection_string_never_shown():
    pytest.importorskip("adlfs")
    account_key = "RkFLRS1BWlVSRS1LRVk="
    connection = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={account_key};"
                  "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;")
    objects.set_storage_options("az", {"connection_string": connection})
    try:
        assert type(objects.filesystem("az://container/ds")).__name__ == "AzureBlobFileSystem"
        assert account_key not in objects.redact(f"failed with {connection} and AccountKey={account_key}")
    finally:
        objects.set_storage_options("az", None)
    assert account_key not in objects.redact(f"AccountKey={account_key};")


def test_storage_options_hold_for_their_urls_alone(stores, tmp_path, no_secret):
    """Options given with a reader's URL reach its manifest and its shard cache's fetch threads, and only the URLs
    under it: an endpoint where nothing answers, given for one prefix, leaves the others reading."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    s3, local = stores["s3fs"], stores["local"]["photos"]
    s3.put(local, f"{BUCKET}/photos-opts", recursive=True)
    url = f"s3://{BUCKET}/photos-opts"
    given = {"endpoint_url": endpoint, "key": KEY_ID, "secret": SECRET + "-2"}
    got = _images(url, shard_cache=str(tmp_path / "cache"), storage_options=given)
    assert_same_epochs(epochs(got), epochs(_images(local)))
    nowhere = f"s3://{BUCKET}/photos-nowhere"
    quick = {"endpoint_url": "http://127.0.0.1:9", "key": KEY_ID, "secret": SECRET + "-3",
             "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}
    given_quick = copy.deepcopy(quick)
    with pytest.raises(OSError, match=re.escape(nowhere) + r"\S*: .* failed after 5 attempts \(.*Connect.*\); check "
                                      "the URL, the endpoint and the network") as raised:
        readers.info(nowhere, storage_options=quick)
    assert SECRET not in str(raised.value)
    # as given, after botocore used them (it rewrites a retries dict it is handed: one file system then made two)
    assert objects.options_for(nowhere) == given_quick
    assert objects.filesystem(f"{nowhere}/a") is objects.filesystem(f"{nowhere}/b")
    assert readers.info(stores["s3"]["photos"]).manifest == readers.info(local).manifest  # the environment's endpoint
    assert objects.redact(f"{SECRET}-3 {SECRET}-2") == "*** ***"
    with pytest.raises(ValueError, match=re.escape(f"{local}: storage_options apply to s3://, az://, abfs:// and "
                                                   "https:// URLs (got ['key']); drop them")):
        readers.info(local, storage_options={"key": SECRET})
    with pytest.raises(ValueError, match=r"^storage_options: must be a dict of fsspec's keys \(got a list\)"):
        readers.info(url, storage_options=["endpoint_url"])


def test_the_storage_option_flag_and_its_secret_in_no_output(stores, cli, no_secret):
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    url = f"s3://{BUCKET}/photos"
    flags = ["--storage-option", f"endpoint_url={endpoint}", "--storage-option", f"secret={SECRET}",
             "--storage-option", f"key={KEY_ID}", "--storage-option", "config_kwargs:={\"read_timeout\": 30}"]
    shown = cli("-v", "info", url, *flags)
    assert shown.exit_code == 0 and SECRET not in shown.output, shown.output
    checked = cli("-v", "verify", url, *flags)
    assert checked.exit_code == 0 and "OK" in checked.output.upper(), checked.output
    assert SECRET not in checked.output and KEY_ID not in checked.output
    bad = cli("info", url, "--storage-option", SECRET)
    assert bad.exit_code == 1 and bad.output.startswith("error: --storage-option: expected KEY=VALUE or KEY:=JSON"), \
        bad.output
    assert SECRET not in bad.output
    bad = cli("info", url, "--storage-option", f"use_ssl:={SECRET}")
    assert bad.exit_code == 1 and "error: --storage-option use_ssl:=...: the value is not JSON" in bad.output, \
        bad.output
    assert SECRET not in bad.output


def test_no_secret_with_verbose_and_debug_in_a_failing_command(stores):
    """The CLI's -v --debug prints the library's and botocore's log lines and the traceback: the process is the
    point (what reaches its stderr)."""
    missing = f"s3://{BUCKET}/missing"
    run = subprocess.run(
        [sys.executable, "-m", "tfshard", "-v", "--debug", "info", missing, "--storage-option",
         f"secret={SECRET}-cli", "--storage-option", f"key={KEY_ID}", "--storage-option",
         "config_kwargs:={\"retries\": {\"max_attempts\": 1}}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "AWS_SECRET_ACCESS_KEY": "unused"})
    assert run.returncode != 0 and f"{missing}: no such folder" in run.stderr, run.stderr[-3000:]
    assert "Traceback" in run.stderr, run.stderr[-3000:]  # what --debug adds
    assert SECRET not in run.stdout + run.stderr and KEY_ID not in run.stdout + run.stderr, run.stderr[-3000:]
