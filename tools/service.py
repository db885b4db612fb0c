"""``tfshard service dispatcher|worker``: a tf.data service server (``readers/service.py``) started in this process,
the address it serves at, and serving until Ctrl-C or SIGTERM, which stop the server and come through as the stop
they are (the command exits 130 or 143, as every command does). Each yields the lines the command prints.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from ..readers import service


def serve_dispatcher(port: int = 5050, work_dir: str | None = None, fault_tolerant: bool = False) -> Iterator[str]:
    """Starts a dispatcher, yields the address readers and workers use, serves until Ctrl-C or SIGTERM.

    Example:
      for line in serve_dispatcher(5050):
          print(line)  # dispatcher: serving at grpc://head:5050; add workers with ...
    """
    server = service.start_dispatcher(port, work_dir=work_dir, fault_tolerant=fault_tolerant)
    address = f"{socket.gethostname()}:{service.bound_port(server)}"
    yield (f"dispatcher: serving at grpc://{address}; add workers with `tfshard service worker --dispatcher "
           f"{address}`, read with service='grpc://{address}'")
    service.serve_until_stopped(server)


def serve_worker(dispatcher: str, port: int = 5051, worker_address: str | None = None) -> Iterator[str]:
    """Starts a worker for ``dispatcher``, yields the address clients reach it at, serves until Ctrl-C or SIGTERM
    (``readers.service.start_worker`` for the arguments).

    Example:
      for line in serve_worker("head:5050"):
          print(line)  # worker: serving at node7:5051 (port 5051) for dispatcher head:5050
    """
    server = service.start_worker(dispatcher, port=port, worker_address=worker_address)
    bound = service.bound_port(server)
    advertised = (worker_address or f"{socket.gethostname()}:%port%").replace("%port%", str(bound))
    yield f"worker: serving at {advertised} (port {bound}) for dispatcher {dispatcher}"
    service.serve_until_stopped(server)
