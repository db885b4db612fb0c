"""A private Google Cloud Storage for tests and benchmarks: TensorFlow's own GCS client against a local emulator.

TensorFlow's built-in ``gs://`` filesystem talks HTTPS to fixed hosts
(``www.googleapis.com`` for metadata, listings, uploads, copies and deletes;
``storage.googleapis.com`` for ranged reads) and has no endpoint setting. So
``run(command)`` starts ``command`` inside a fresh network and mount namespace
(``unshare -n -m``) where:

* the only network is loopback, brought up here, so nothing can leave the machine;
* a hosts file bind-mounted over ``/etc/hosts`` maps those hosts to 127.0.0.1;
* ``gcp-storage-emulator`` (in memory) serves HTTPS on 127.0.0.1:443 with a
  self-signed certificate that curl trusts through ``CURL_CA_BUNDLE``;
* ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` gives TensorFlow a token without any
  credentials and ``NO_GCE_CHECK=true`` stops it probing for a GCE metadata server.

The emulator's quirks, handled in ``_Handler`` and ``serve``: its stock server is a
single-threaded ``HTTPServer`` (parallel reads would be served one at a time), so a
``ThreadingHTTPServer`` serves it here, each connection doing its TLS handshake in its
own thread, with HTTP/1.1 keep-alive; the ``Location`` of a resumable upload says
``http://`` (it is built from the Host header), so it is rewritten to ``https://``;
TensorFlow's uploads arrive with ``Transfer-Encoding: chunked``, so every request
body is read here (chunked or not) and handed on with a ``Content-Length``; an empty
upload (TensorFlow's ``dir/`` folder marker) reads as None and fails on ``len()``, so
it is handed on as ``b""``; and its metadata, re-serialised whole on every write, is
not kept (storage is in memory and ends with the command).

The network can be made slower: ``latency_ms`` delays every response, and
``stream_mb_per_s`` caps what each connection is sent per second (TensorFlow's
client opens a new connection for every request). ``configure()`` changes both
from inside the namespace, and returns the request counts so far.

Usage (from a test or a benchmark; the command runs with the emulator up):
  reason = gcs_emulator.unavailable_reason()   # None where namespaces are permitted
  done = gcs_emulator.run([sys.executable, "script.py"], buckets=["tfshard"], latency_ms=30)
  done.returncode, done.stdout

This file is also the program that runs inside the namespace (``--inside``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import http.server
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request
from typing import ClassVar

HOSTS = ("storage.googleapis.com", "www.googleapis.com", "oauth2.googleapis.com")
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def _namespace_command() -> list[str]:
    # As root, unshare alone; otherwise a user namespace maps us to root in it, which may mount and set up lo.
    return ["unshare", "-n", "-m"] + ([] if os.getuid() == 0 else ["--map-root-user"])


def unavailable_reason() -> str | None:
    """Why ``run`` cannot work on this machine, or None when it can."""
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError:
        return "gcp-storage-emulator is not installed (pip install -e '.[test]')"
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is not installed; it makes the private network namespace"
    if shutil.which("openssl") is None:
        try:
            import cryptography  # noqa: F401
        except ImportError:
            return "neither `openssl` nor the `cryptography` package is available to make a TLS certificate"
    try:
        probe = subprocess.run(_namespace_command() + ["true"], capture_output=True, text=True, timeout=30,
                               check=False)
    except OSError as e:
        return f"`unshare -n -m` cannot run here ({e})"
    if probe.returncode != 0:
        return f"network and mount namespaces are not permitted here (`unshare -n -m true`: {probe.stderr.strip()})"
    return None


def _make_certificate(folder: str) -> tuple[str, str]:
    """A self-signed certificate for ``HOSTS`` (valid for a day): (certificate path, key path)."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    names = ",".join(f"DNS:{h}" for h in HOSTS)
    if shutil.which("openssl"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", key, "-out", cert,
             "-subj", f"/CN={HOSTS[0]}", "-addext", f"subjectAltName={names}"],
            check=True, capture_output=True,
        )
        return cert, key
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(private.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    with open(cert, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key, "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    return cert, key


def run(
    command: list[str],
    *,
    buckets: list[str] = ("tfshard",),
    latency_ms: float = 0.0,
    stream_mb_per_s: float = 0.0,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess:
    """Runs ``command`` in a private namespace where ``gs://<bucket>`` of each of ``buckets`` is a local emulator.

    Args:
      command: argv of the program to run (e.g. ``[sys.executable, "script.py"]``).
      buckets: buckets that exist, empty, when the command starts; all storage is
        in memory and gone when the command ends.
      latency_ms: added to every response, like the round trip to a distant server.
      stream_mb_per_s: the most each connection (TensorFlow opens one per request)
        is sent per second, in MB (10**6 bytes); 0: as fast as the emulator goes.
      env: extra environment variables for the command.
      timeout: seconds before the whole namespace is killed (``subprocess.TimeoutExpired``).
      capture: capture stdout and stderr as text (else they are inherited).

    Returns:
      The ``CompletedProcess`` of the namespace; its return code is the command's.
    """
    with tempfile.TemporaryDirectory(prefix="tfshard-gcs-") as folder:
        cert, key = _make_certificate(folder)
        hosts = os.path.join(folder, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n" + "".join(f"127.0.0.1 {h}\n" for h in HOSTS))
        inside = [sys.executable, os.path.abspath(__file__), "--inside", "--cert", cert, "--key", key,
                  "--hosts", hosts, "--latency-ms", str(latency_ms), "--stream-mb-per-s", str(stream_mb_per_s)]
        inside += [arg for bucket in buckets for arg in ("--bucket", bucket)]
        argv = _namespace_command() + inside + ["--"] + list(command)
        pipe = subprocess.PIPE if capture else None
        # A session of its own, so a timeout kills the whole namespace: emulator, command and its children.
        with subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=pipe, stderr=pipe, text=True,
                              start_new_session=True) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
                raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from None
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def configure(*, latency_ms: float | None = None, stream_mb_per_s: float | None = None) -> dict:
    """From a command inside the namespace: sets the emulator's network; returns it with the request counts so far.

    Example:
      gcs_emulator.configure(latency_ms=30, stream_mb_per_s=12)  # {"latency_ms": 30.0, ..., "requests": {...}}
    """
    query = {k: v for k, v in (("latency_ms", latency_ms), ("stream_mb_per_s", stream_mb_per_s)) if v is not None}
    request = urllib.request.Request(f"https://{HOSTS[0]}/_emulator/network?{urllib.parse.urlencode(query)}",
                                     method="PUT" if query else "GET")
    context = ssl.create_default_context(cafile=os.environ["CURL_CA_BUNDLE"])
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return json.loads(response.read())


class _Handler:
    """Mixed into the emulator's request handler: see the module docstring for what each part fixes."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: Nagle + delayed ACK would add ~40 ms
    latency_s = 0.0
    stream_bytes_per_s = 0.0
    lock = threading.Lock()  # the emulator's metadata dicts are not thread-safe; reads of object bytes need no lock
    counts: ClassVar[collections.Counter] = collections.Counter()  # requests by method, connections, bytes_sent
    counts_lock = threading.Lock()

    def setup(self):
        super().setup()
        self.wfile = _Paced(self.wfile, type(self))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers, up to the blank line
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            del self.headers["Transfer-Encoding"]
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self, method: str) -> None:
        from gcp_storage_emulator.server import Router

        body = self._read_body()  # always read it all, or a keep-alive connection would parse it as a request
        del self.headers["Content-Length"]
        self.headers["Content-Length"] = str(len(body))
        if self.path.startswith("/_emulator/network"):
            return self._configure(method)
        socket_file, self.rfile = self.rfile, io.BytesIO(body)
        if self.latency_s:
            time.sleep(self.latency_s)
        _Handler.counts[method] += 1
        try:
            if method == "GET" and not self.path.startswith("/storage/"):
                Router(self).handle(method)  # object bytes: concurrent, like real GCS
            else:
                with _Handler.lock:
                    Router(self).handle(method)
        except Exception:  # noqa: BLE001 -- an emulator bug: say so, and fail fast (TF retries a 5xx for minutes)
            traceback.print_exc()
            self.send_error(400, f"gcs_emulator: the emulator failed on {method} {self.path}")
        finally:
            self.rfile = socket_file

    def _configure(self, method: str) -> None:
        """``PUT /_emulator/network?latency_ms=..&stream_mb_per_s=..`` changes the network; any method: the counts."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if method == "PUT":
            if "latency_ms" in query:
                type(self).latency_s = float(query["latency_ms"][0]) / 1000
            if "stream_mb_per_s" in query:
                type(self).stream_bytes_per_s = float(query["stream_mb_per_s"][0]) * 1e6
        body = json.dumps({"latency_ms": self.latency_s * 1000, "stream_mb_per_s": self.stream_bytes_per_s / 1e6,
                           "requests": dict(_Handler.counts)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def do_PATCH(self):
        self._serve("PATCH")

    def do_DELETE(self):
        self._serve("DELETE")

    def send_header(self, keyword, value):
        if keyword.lower() == "location" and str(value).startswith("http://"):
            value = "https://" + value[len("http://"):]
        super().send_header(keyword, value)

    def log_message(self, format, *args):
        pass


class _Paced:
    """A connection's writes, paced to the handler's ``stream_bytes_per_s`` (0: unpaced): one stream's bandwidth."""

    _CHUNK = 64 * 1024

    def __init__(self, raw, settings):
        self.raw, self.settings = raw, settings
        self.started, self.sent = time.monotonic(), 0

    def write(self, data) -> int:
        with self.settings.counts_lock:  # every byte served, for what a reader fetched over the network
            self.settings.counts["bytes_sent"] += len(data)
        rate = self.settings.stream_bytes_per_s
        if not rate:
            return self.raw.write(data)
        view = memoryview(data)
        for start in range(0, len(view), self._CHUNK):
            chunk = view[start:start + self._CHUNK]
            self.raw.write(chunk)
            self.sent += len(chunk)
            ahead = self.started + self.sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -0.005:  # idle since the last write (waiting on a request): restart the clock, no burst
                self.started, self.sent = time.monotonic(), 0
        return len(view)

    def flush(self):
        self.raw.flush()

    def __getattr__(self, name):
        return getattr(self.raw, name)


class _TLSThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, handler, context: ssl.SSLContext):
        self.context = context
        super().__init__(address, handler)

    def finish_request(self, request, client_address):
        # The handshake happens here, in the connection's own thread, not in the accepting loop.
        _Handler.counts["connections"] += 1
        try:
            request = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        super().finish_request(request, client_address)


def serve(host: str, port: int, cert: str, key: str, buckets: list[str], latency_s: float = 0.0,
          stream_bytes_per_s: float = 0.0):
    """Starts the emulator (in memory) on ``host:port`` over TLS in a daemon thread; returns the server.

    ``latency_s`` delays every response; ``stream_bytes_per_s`` (0: no limit) paces what each connection sends.
    """
    from gcp_storage_emulator import server as server_lib
    from gcp_storage_emulator.handlers import buckets as buckets_lib
    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    class _MemoryStorage(Storage):
        def _write_config_to_file(self):  # only persists the metadata, re-serialised whole on every write
            pass

    read_data = server_lib._read_data

    def read_upload_data(request_handler, query):
        # The emulator reads an empty body as None and then fails on len(None): an empty object (TensorFlow's
        # folder marker "dir/") is an upload of b"".
        data = read_data(request_handler, query)
        return b"" if data is None and ("upload_id" in query or query.get("uploadType") == ["media"]) else data

    server_lib._read_data = read_upload_data
    storage = _MemoryStorage(use_memory_fs=True)
    for bucket in buckets:
        buckets_lib.create_bucket(bucket, storage)
        storage.buckets[bucket]["softDeletePolicy"] = {"retentionDurationSeconds": "0"}  # deletes free memory
    handler_class = type("Handler", (_Handler, RequestHandler),
                         {"latency_s": latency_s, "stream_bytes_per_s": stream_bytes_per_s})
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = _TLSThreadingServer((host, port), functools.partial(handler_class, storage), context)
    threading.Thread(target=server.serve_forever, daemon=True, name="gcs-emulator").start()
    return server


def _loopback_up() -> None:
    """``ip link set lo up`` without needing iproute2: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh14s", b"lo", 0, b"")
        flags = struct.unpack("16sh14s", fcntl.ioctl(s, 0x8913, request))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh14s", b"lo", flags | 0x1, b""))


def _inside(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inside", action="store_true")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--stream-mb-per-s", type=float, default=0.0)
    parser.add_argument("--bucket", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    _loopback_up()
    subprocess.run(["mount", "--bind", args.hosts, "/etc/hosts"], check=True)
    server = serve("127.0.0.1", 443, args.cert, args.key, args.bucket, args.latency_ms / 1000,
                   args.stream_mb_per_s * 1e6)
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARIABLES}
    env.update(CURL_CA_BUNDLE=args.cert, GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator-token", NO_GCE_CHECK="true")
    try:
        return subprocess.run(command, env=env, check=False).returncode
    finally:
        server.shutdown()


if __name__ == "__main__":
    if "--inside" not in sys.argv[1:2]:
        sys.exit("gcs_emulator.py: run from tests/test_gcs.py or benchmarks/network.py (it expects --inside)")
    sys.exit(_inside(sys.argv[1:]))
