"""A private Azure Blob Storage for tests: Microsoft's Azurite emulator (npm), in memory, on a free loopback port.

``make test`` installs it (``make tests/.azurite``, pinned, ~360 MB under ``tests/.azurite/``, ignored by git) when
``npm`` is on the machine. ``Azurite()`` starts ``azurite-blob`` with in-memory storage and waits until it answers;
``connection_string`` is what adlfs (``storage_options={"connection_string": ...}``) and the Azure SDK take, for
Azurite's well-known development account (its key is public, in Azurite's own documentation).

    with Azurite() as azure:
        fs = adlfs.AzureBlobFileSystem(connection_string=azure.connection_string)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.path.join(HERE, ".azurite", "node_modules", ".bin", "azurite-blob")
ACCOUNT = "devstoreaccount1"
# Azurite's fixed development key (documented by Microsoft for the emulator; not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def unavailable_reason() -> str | None:
    """Why Azurite cannot start here, or None when it can."""
    if shutil.which("node") is None:
        return "`node` is not installed (Azurite is a Node.js program)"
    if not os.path.exists(BINARY):
        return f"Azurite is not installed at {BINARY}: run `make tests/.azurite` (npm)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Azurite:
    """One Azurite blob service, started on enter (or ``start()``) and stopped on exit (or ``stop()``)."""

    def __init__(self, startup_timeout_s: float = 60.0):
        self.port = _free_port()
        self._timeout = startup_timeout_s
        self._process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.endpoint};")

    def start(self) -> Azurite:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self._process = subprocess.Popen(
            [BINARY, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
             "--skipApiVersionCheck", "--silent", "--loose"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Azurite exited with {self._process.returncode}: "
                                   f"{self._process.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Azurite did not answer on port {self.port} within {self._timeout:g} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._process = None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
