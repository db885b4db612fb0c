"""tests/fault_proxy.py's slow network (``latency_ms``, ``stream_mb_per_s``, what benchmarks/network.py's S3 section
stands on): bodies paced in many writes still arrive whole, uploads paced in many reads too, keep-alive connections
carry one request after another, ``bytes_sent`` counts what was served, and the fault rules act as without them
(``alter_sent`` changes what the store keeps of an upload). One local web server for the module.
"""

from __future__ import annotations

import functools
import http.client
import http.server
import os
import threading

import pytest
from fault_proxy import FaultProxy

BODY = os.urandom(300_000)  # several of the proxy's 64 KiB paced writes


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """``http://127.0.0.1:PORT`` of a quiet web server holding ``/blob`` (BODY)."""
    root = tmp_path_factory.mktemp("served")
    (root / "blob").write_bytes(BODY)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_PUT(self):  # keeps the body as the file of that name
            (root / self.path.strip("/")).write_bytes(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", root
    server.shutdown()
    server.server_close()


@pytest.fixture
def slow(upstream):
    proxy = FaultProxy(upstream[0], latency_ms=5, stream_mb_per_s=50)
    yield proxy
    proxy.close()


def _gets(proxy: FaultProxy, count: int) -> list[tuple[int, bytes]]:
    """``count`` GETs of /blob on one keep-alive connection: (status, body) of each."""
    connection = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=30)
    try:
        answers = []
        for _ in range(count):
            connection.request("GET", "/blob")
            response = connection.getresponse()
            answers.append((response.status, response.read()))
        return answers
    finally:
        connection.close()


def test_a_paced_connection_serves_every_body_whole_and_counts_it(slow):
    assert _gets(slow, 3) == [(200, BODY)] * 3
    assert slow.bytes_sent == 3 * len(BODY)
    assert [what for _, _, what in slow.seen] == ["passed"] * 3


def test_the_fault_rules_act_the_same_on_a_slow_network(slow):
    slow.add("503", path="/blob")
    slow.add("alter", path="/blob")
    (status, throttled), (_, altered), (_, whole) = _gets(slow, 3)
    assert status == 503 and b"SlowDown" in throttled
    assert len(altered) == len(BODY) and altered != BODY
    assert whole == BODY
    assert [what for _, _, what in slow.seen] == ["503", "alter", "passed"]


def test_the_network_can_change_while_it_runs(slow):
    slow.latency_ms = slow.stream_mb_per_s = 0  # back to the plain proxy, on the same connection pool
    assert _gets(slow, 1) == [(200, BODY)]
    with pytest.raises(ValueError, match="kind: must be one of"):
        slow.add("slow")


def test_uploads_are_paced_and_arrive_whole_unless_altered(slow, upstream):
    connection = http.client.HTTPConnection(slow.url.removeprefix("http://"), timeout=30)
    slow.add("alter_sent", method="PUT", path="/altered")
    try:
        for name in ("sent", "altered"):
            connection.request("PUT", f"/{name}", body=BODY)
            assert connection.getresponse().read() == b""
    finally:
        connection.close()
    sent, altered = (upstream[1] / "sent").read_bytes(), (upstream[1] / "altered").read_bytes()
    assert sent == BODY and len(altered) == len(BODY) and altered != BODY
    assert [what for _, _, what in slow.seen] == ["passed", "alter_sent"]
