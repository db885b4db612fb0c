"""The tf.data service: run a reader's pipeline up to batching on remote CPU workers (``readers.images(service=...)``).

A *dispatcher* hands out work; *workers* (any hosts that can read the shards)
run the part of the pipeline before ``distribute``; the training process, the
*client*, receives finished batches over gRPC. Each pass over a dataset is one
service *job*.

``processing_mode``:

* ``"distributed_epoch"`` (default; TF's ``ShardingPolicy.DYNAMIC``): the
  dispatcher hands out the source's elements (here: shard file names) one at a
  time to whichever worker asks, so each record is read once per epoch across
  all workers. TF promises *at most once*: no record repeats, but the records of
  a file a worker was reading when it died are lost for that epoch.
* ``"parallel_epochs"`` (``ShardingPolicy.OFF``): every worker reads the whole
  split, so with N workers an epoch holds each record N times.

``job_name``: clients that pass the same name share one job, first come first
served (each reads part of one epoch); without it every client gets its own.
Names must not be reused within the lifetime of a dispatcher: a finished job
answers a late reader with an empty epoch.

A stopped worker. The client keeps asking the worker's address for the rest of
its share and waits until a worker is back *at the same address* (TF 2.21 has
no timeout that gives up on it); the restarted worker continues with new files
and the epoch ends. So run workers under a supervisor that restarts them with
the same ``--port``, and do not use port 0 for workers that may restart.

Example:
  # on one host:  tfshard service dispatcher --port 5050
  # on each CPU host:  tfshard service worker --dispatcher head:5050
  ds = readers.images("gs://bucket/photos-tfr", batch_size=256, service="grpc://head:5050")
"""

from __future__ import annotations

import dataclasses
import re
import socket
import time
from collections.abc import Mapping

import tensorflow as tf

from ..format import stops

_SERVE_POLL_S = 0.5
PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
_PROTOCOL = "grpc"
_ADDRESS = re.compile(
    r"^(?:(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$"
)


def parse_address(address: str, where: str = "service", name: str = "service") -> tuple[str, int]:
    """``"grpc://host:port"`` or ``"host:port"`` → ``(host, port)``; a ValueError naming the value otherwise.

    Example:
      parse_address("grpc://head:5050"), parse_address("[::1]:5050")  # (('head', 5050), ('[::1]', 5050))
    """
    match = _ADDRESS.match(address) if isinstance(address, str) else None
    protocol = match and match.group("protocol")
    port = int(match.group("port")) if match else 0
    if match is None or (protocol is not None and protocol != _PROTOCOL) or not 0 < port < 65536:
        raise ValueError(
            f"{where}: not a tf.data service address (got {name}={address!r}); pass 'grpc://HOST:PORT' or 'HOST:PORT', "
            "the address `tfshard service dispatcher` prints"
        )
    return match.group("host"), port


@dataclasses.dataclass(frozen=True)
class ServiceOptions:
    """Where and how a reader hands its pipeline to the tf.data service; checks itself.

    Example:
      ServiceOptions("head:5050").target  # 'grpc://head:5050'
    """

    address: str
    processing_mode: str = "distributed_epoch"
    job_name: str | None = None
    where: str = "service"

    def __post_init__(self):
        parse_address(self.address, self.where)
        if self.processing_mode not in PROCESSING_MODES:
            raise ValueError(
                f"{self.where}: processing_mode must be one of {PROCESSING_MODES} "
                f"(got processing_mode={self.processing_mode!r}); 'distributed_epoch' reads each record once per epoch"
            )
        if self.job_name is not None and (not isinstance(self.job_name, str) or not self.job_name):
            raise ValueError(
                f"{self.where}: service_job_name must be a non-empty string or None (got {self.job_name!r})"
            )

    @property
    def target(self) -> str:
        host, port = parse_address(self.address, self.where)
        return f"{_PROTOCOL}://{host}:{port}"

    @property
    def sharding_policy(self) -> tf.data.experimental.service.ShardingPolicy:
        policy = tf.data.experimental.service.ShardingPolicy
        return policy.DYNAMIC if self.processing_mode == "distributed_epoch" else policy.OFF

    def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Everything built into ``dataset`` runs on the workers; what is applied to the result runs here."""
        return dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=self.sharding_policy, service=self.target, job_name=self.job_name
            )
        )


def service_options(
    service: str | None,
    processing_mode: str,
    job_name: str | None,
    *,
    where: str,
    input_context: tf.distribute.InputContext | None = None,
) -> ServiceOptions | None:
    """A reader's ``service=``, ``processing_mode=``, ``service_job_name=`` checked together, up front.

    Returns None without a service. Several input pipelines (``input_context``)
    must share one job, or each would read the whole epoch.
    """
    if service is None:
        if job_name is not None:
            raise ValueError(f"{where}: service_job_name is for service= (got service_job_name={job_name!r}); "
                             "pass service='grpc://HOST:PORT' too, or drop service_job_name")
        if processing_mode not in PROCESSING_MODES:
            raise ValueError(f"{where}: processing_mode must be one of {PROCESSING_MODES} "
                             f"(got processing_mode={processing_mode!r})")
        return None
    options = ServiceOptions(service, processing_mode, job_name, where)
    if input_context is not None and input_context.num_input_pipelines > 1 and job_name is None:
        raise ValueError(
            f"{where}: {input_context.num_input_pipelines} input pipelines read through the service without a "
            "shared job (got service_job_name=None), so each would read the whole epoch; pass one "
            "service_job_name for all of them (the service then splits the epoch, instead of input_context)"
        )
    return options


def distribute(
    dataset: tf.data.Dataset,
    service: str,
    *,
    processing_mode: str = "distributed_epoch",
    job_name: str | None = None,
) -> tf.data.Dataset:
    """``dataset`` run by the tf.data service at ``service``: ``tf.data.experimental.service.distribute``, checked.

    ``distributed_epoch`` needs a splittable source (``from_tensor_slices`` of
    file names, then ``interleave``/``flat_map``, as the readers build it).

    Raises:
      ValueError: a malformed address, an unknown processing mode or an empty job name, naming the value.

    Example:
      ds = distribute(tf.data.Dataset.range(10), "localhost:5050")
      sorted(ds.as_numpy_iterator())  # [0, 1, ..., 9], whatever the number of workers
    """
    return ServiceOptions(service, processing_mode, job_name).distribute(dataset)


def check_storage_options(path, service: str | None, storage_options) -> None:
    """Refuses ``storage_options=`` with ``service=``: the workers fetch a store's shards in their own processes
    (into the shard cache on their hosts), where options given to this one never arrive; they find the store
    through their own environment, as this process then must too."""
    if service is not None and storage_options is not None:
        shown = path if isinstance(path, str) else " + ".join(path)
        keys = sorted(map(str, storage_options)) if isinstance(storage_options, Mapping) else storage_options
        raise ValueError(
            f"{shown}: storage_options do not reach tf.data service workers, which read the store themselves (got "
            f"service={service!r} and storage_options {keys!r}); drop storage_options and give the "
            "store's endpoint and credentials to the workers and this process through the environment "
            "(AWS_ENDPOINT_URL, AWS_PROFILE, AZURE_STORAGE_CONNECTION_STRING...)")


def _check_port(port: int, where: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"{where}: port must be an integer in 0..65535, 0 for any free port (got {port!r})")


def start_dispatcher(
    port: int = 5050, work_dir: str | None = None, fault_tolerant: bool = False
) -> tf.data.experimental.service.DispatchServer:
    """Starts a dispatcher in this process and returns it (``.target`` is the address clients pass).

    Args:
      port: port to listen on; 0 picks a free one.
      work_dir: a folder (local or ``gs://``) for the registered datasets; with
        ``fault_tolerant``, also a journal from which a restarted dispatcher
        resumes its jobs.
      fault_tolerant: journal every state change before answering (needs ``work_dir``).

    Example:
      dispatcher = start_dispatcher(0)
      dispatcher.target  # 'grpc://localhost:41234'
    """
    _check_port(port, "dispatcher")
    if fault_tolerant and work_dir is None:
        raise ValueError("dispatcher: fault_tolerant needs a work_dir for its journal (got work_dir=None); pass one")
    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=fault_tolerant
    )
    return tf.data.experimental.service.DispatchServer(config)


def start_worker(
    dispatcher: str, port: int = 0, worker_address: str | None = None
) -> tf.data.experimental.service.WorkerServer:
    """Starts a worker in this process, registered with ``dispatcher``, and returns it.

    Args:
      dispatcher: ``"HOST:PORT"`` or ``"grpc://HOST:PORT"`` of the dispatcher.
      port: port to listen on; 0 picks a free one (then a restarted worker comes
        back at a new address, and a client waiting for the old one keeps waiting).
      worker_address: the address clients are told to use, ``%port%`` standing
        for the bound port; None: ``<this host's name>:%port%``, so clients on
        other hosts can reach it (``"localhost:%port%"`` for one-host setups).

    Example:
      worker = start_worker("head:5050", port=5051)
    """
    host, dispatcher_port = parse_address(dispatcher, "worker", name="dispatcher")
    _check_port(port, "worker")
    if worker_address is None:
        worker_address = f"{socket.gethostname()}:%port%"
    elif not re.match(r"^\S+:(%port%|[0-9]{1,5})$", worker_address):
        raise ValueError(
            f"worker_address: must be HOST:PORT or HOST:%port% (got {worker_address!r}); e.g. 'node7:%port%'"
        )
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"{host}:{dispatcher_port}", worker_address=worker_address, port=port
    )
    return tf.data.experimental.service.WorkerServer(config)


def bound_port(server) -> int:
    """The port a started dispatcher or worker listens on (the one port 0 picked)."""
    # Both servers expose it only as the private "localhost:PORT" string; dispatchers also as .target.
    return int(server._address.rsplit(":", 1)[1])


def serve_until_stopped(server) -> None:
    """Serves until Ctrl-C or SIGTERM raises in this thread (the main one), then stops ``server`` and lets the stop
    through: under the ``tfshard`` command, ``KeyboardInterrupt`` or SIGTERM's ``Terminated`` (``format/stops.py``),
    which the command reports as exit 130 or 143.

    Not ``server.join()``: it blocks inside C++ and never lets Python see Ctrl-C. Nor handlers of its own: a stop
    that arrived before they were set (as the server started) went to the command's and exited 130, one that
    arrived after exited 0.
    """
    try:
        while True:
            stops.check()  # a stop raised where it was swallowed (a finalizer) still ends the wait
            time.sleep(_SERVE_POLL_S)
    finally:
        server.stop()
