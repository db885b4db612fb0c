"""An HTTP proxy that breaks what it is told to: faults injected in front of a real object store (moto's S3 server,
Azurite, a local HTTP file server) for the object-store tests.

Every request is passed on to the one upstream it fronts and its answer passed back, unless a rule picks it. A rule
picks requests by method and a part of the path, a number of times, and does one thing to them:

* ``"500"`` / ``"503"``: answers with that status (503 with S3's ``SlowDown`` error body), upstream untouched;
* ``"drop"``: passes the request on, then sends the answer's headers and half its body and closes the connection
  (a connection dropped mid-object);
* ``"truncate"``: the same half body, but with a ``Content-Length`` that says so (an object cut short that looks
  whole to the client);
* ``"alter"``: the whole body with one byte changed (an object altered in the store or on the way);
* ``"alter_sent"``: the request's body with one byte changed before it is passed on (an upload altered on the way);
* ``"stall"``: holds the answer for ``stall_s`` seconds before sending it (a wait that needs a timeout).

The network can be made slower too, as ``tests/gcs_emulator.py`` does for its emulator: ``latency_ms`` is added to
every response (like the round trip to a distant server), and ``stream_mb_per_s`` paces the bodies each connection
is sent and the uploads it receives (one stream's bandwidth is a small share of what many get together, as on a real
store). Both are
attributes, changeable while it runs; 0 (the default) adds nothing. ``bytes_sent`` counts the body bytes sent.

    proxy = FaultProxy("http://127.0.0.1:5000")
    proxy.add("503", method="GET", path="/bucket/ds/shard-00000", times=2)
    ...  # the client under test talks to proxy.url
    proxy.close()

    slow = FaultProxy("http://127.0.0.1:5000", latency_ms=30, stream_mb_per_s=12)   # benchmarks/network.py

``ssl_context`` (a server ``ssl.SSLContext``, ``tests/tls.py``) makes it an HTTPS front for a plain-HTTP store.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import threading
import time
import urllib.parse

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
KINDS = ("500", "503", "drop", "truncate", "alter", "alter_sent", "stall")
_PACE_CHUNK = 64 * 1024  # bytes written between two checks of a paced connection's clock
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your '
              b"request rate.</Message></Error>")


@dataclasses.dataclass
class Rule:
    kind: str
    method: str | None
    path: str | None
    times: int
    stall_s: float

    def picks(self, method: str, path: str) -> bool:
        return self.times > 0 and (self.method is None or self.method == method) and (
            self.path is None or self.path in urllib.parse.unquote(path))


def _altered(body: bytes) -> bytes:
    """``body`` with its middle byte flipped."""
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]


class FaultProxy:
    """The proxy, serving on ``url`` (``http://127.0.0.1:PORT``) in threads of this process until ``close()``.

    Attributes:
      url: where clients connect instead of the upstream.
      seen: ``(method, path, what happened)`` of every request, in order: ``"passed"`` or the rule's kind.
      latency_ms: added to every response (0: none).
      stream_mb_per_s: the most each connection is sent, or sends, per second, in MB (0: no limit).
      bytes_sent: body bytes sent to clients so far (what crossed the network).
    """

    def __init__(self, upstream: str, timeout_s: float = 30.0, latency_ms: float = 0.0, stream_mb_per_s: float = 0.0,
                 ssl_context=None):
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname, parsed.port or 80)
        self._timeout = timeout_s
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self.seen: list[tuple[str, str, str]] = []
        self.latency_ms, self.stream_mb_per_s = latency_ms, stream_mb_per_s
        self.bytes_sent = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: Nagle + delayed ACK add ~40 ms

            def log_message(self, *args):  # quiet: the tests read `seen`
                pass

            def _body(self) -> bytes:
                pace = proxy._pace()
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(pace(self.rfile.read, size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return pace(self.rfile.read, length) if length else b""

            def _handle(self):
                body = self._body()
                rule = proxy._pick(self.command, self.path)
                proxy._record(self.command, self.path, rule.kind if rule else "passed")
                if rule is not None and rule.kind == "alter_sent" and body:
                    body = _altered(body)
                if proxy.latency_ms:
                    time.sleep(proxy.latency_ms / 1000)
                if rule is not None and rule.kind in ("500", "503"):
                    payload = _SLOW_DOWN if rule.kind == "503" else b"Internal Server Error"
                    self.send_response(int(rule.kind))
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Content-Type", "application/xml")
                    self.end_headers()
                    proxy._send(self.wfile, payload if self.command != "HEAD" else b"")
                    return
                status, reason, headers, answer = proxy._forward(self.command, self.path, self.headers, body)
                if rule is not None and rule.kind == "stall":
                    time.sleep(rule.stall_s)
                if rule is not None and rule.kind == "alter" and answer:
                    answer = _altered(answer)
                cut = rule is not None and rule.kind in ("drop", "truncate") and len(answer) > 1
                sent = answer[:len(answer) // 2] if cut else answer
                self.send_response(status, reason)
                for name, value in headers:
                    if name.lower() in _HOP or (name.lower() == "content-length"):
                        continue
                    self.send_header(name, value)
                length = len(sent) if rule is not None and rule.kind == "truncate" else len(answer)
                if self.command == "HEAD":
                    length = int(dict((k.lower(), v) for k, v in headers).get("content-length", 0))
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if self.command != "HEAD":
                    proxy._send(self.wfile, sent)
                if cut:
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if ssl_context is not None:  # TLS in front (tests/tls.py): each connection's handshake in its own thread
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True,
                                                          do_handshake_on_connect=False)
        scheme = "http" if ssl_context is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def add(self, kind: str, *, method: str | None = None, path: str | None = None, times: int = 1,
            stall_s: float = 60.0) -> None:
        """Breaks the next ``times`` requests of ``method`` (any: None) whose unquoted path holds ``path``."""
        if kind not in KINDS:
            raise ValueError(f"kind: must be one of {KINDS} (got {kind!r})")
        with self._lock:
            self._rules.append(Rule(kind, method, path, times, stall_s))

    def clear(self) -> None:
        """Forgets every rule and what was seen."""
        with self._lock:
            self._rules.clear()
            self.seen.clear()

    def _pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            rule = next((r for r in self._rules if r.picks(method, path)), None)
            if rule is not None:
                rule.times -= 1
            return rule

    def _record(self, method: str, path: str, what: str) -> None:
        with self._lock:
            self.seen.append((method, path, what))

    def _send(self, wfile, body: bytes) -> None:
        """Writes ``body`` to one connection, paced to ``stream_mb_per_s`` (the clock starts with the body, so a
        connection idle between two requests gets no burst)."""
        with self._lock:
            self.bytes_sent += len(body)
        rate = self.stream_mb_per_s * 1e6
        if not rate:
            wfile.write(body)
            return
        started, view = time.monotonic(), memoryview(body)
        for start in range(0, len(view), _PACE_CHUNK):
            wfile.write(view[start:start + _PACE_CHUNK])
            ahead = started + min(start + _PACE_CHUNK, len(view)) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def _pace(self):
        """A reader of an upload's body for one request: ``read(n)`` in chunks, paced to ``stream_mb_per_s``."""
        rate, started = self.stream_mb_per_s * 1e6, time.monotonic()

        def paced(read, size: int) -> bytes:
            if not rate:
                return read(size)
            got = bytearray()
            while len(got) < size:
                chunk = read(min(_PACE_CHUNK, size - len(got)))
                if not chunk:
                    break
                got += chunk
                paced.total += len(chunk)
                ahead = started + paced.total / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            return bytes(got)

        paced.total = 0
        return paced

    def _forward(self, method: str, path: str, headers, body: bytes):
        connection = http.client.HTTPConnection(*self._upstream, timeout=self._timeout)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _HOP and k.lower() != "content-length"}
            if body or method in ("PUT", "POST"):
                sent["Content-Length"] = str(len(body))
            connection.request(method, path, body=body or None, headers=sent)
            response = connection.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
