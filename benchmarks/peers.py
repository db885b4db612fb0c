"""Benchmark: tfshard's image reader side by side with its peers, the same work through each loader.

The same generated 500x375 JPEGs (``benchmarks/ingest.py``'s ``image_set``), read by every loader that is
installed, each as its documentation recommends (``benchmarks/peer_loaders.py`` says how): tfshard's
``readers.images`` (training, and evaluation), keras ``image_dataset_from_directory``, TFDS
(``try_autocache=False``: TFDS otherwise keeps a small dataset decoded in RAM and skips the decode the others do),
grain, webdataset, MosaicML Streaming and DALI on the CPU. Each does a random-resized crop + flip to 224x224,
uint8, in batches of ``--batch-size``. A loader that is not installed is listed as such, never stood in for.

Each loader runs in a fresh process, once per round; rounds are interleaved and each starts one loader later
(rotated), so drift on the machine hits every loader alike. In that process, after its imports:

  first batch  from building the loader to its first batch (what every notebook cell and test pays);
  img/s        over ``--batches`` batches after the first;
  CPU ms/img   CPU time of the loader's whole process tree (its worker processes included) over those batches,
               per image, read from /proc at both ends;
  process CPU  CPU-seconds of the whole process tree from start to exit, imports included
               (``os.wait4`` of the child and, as this process is their subreaper, of its orphaned workers);
  other load   the share of the CPUs that other processes took during the timed batches: over ~10%, the
               machine was not idle and the img/s figures are low.

The table shows the median over rounds (first batch, img/s, CPU) and the ratios to tfshard's training reader.
The inputs are made once and not timed: the class folders (keras, grain), tfshard's shards with TFDS metadata and
DALI ``.idx`` files (tfshard, TFDS, DALI), webdataset tars and Streaming's MDS shards.

Run it with ``.venv/bin/python benchmarks/peers.py`` (the peers: ``pip install -e ".[peers]"``), e.g.:
  .venv/bin/python benchmarks/peers.py --rounds 3            # the figures in docs/benchmarks.md
  .venv/bin/python benchmarks/peers.py --quick               # one round of 10 batches, to check it runs
Images are cached in ``--data-dir`` (default ./bench-data); everything else goes to a temporary folder.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import contextlib
import ctypes
import json
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import typing

import peer_loaders as peers

import ingest as bench_ingest  # benchmarks/ingest.py: the images, the page-cache warmer, CPU of a process tree

_PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned grandchildren (a loader's workers) are reparented to us


class Result(typing.NamedTuple):
    first_batch: float  # seconds from building the loader to its first batch
    rate: float  # images per second over the timed batches
    cpu_per_image: float  # CPU-seconds of the process tree per image, over the timed batches
    process_cpu: float  # CPU-seconds of the whole process tree, start to exit
    other: float  # share of the CPUs that other processes took during the timed batches (noise on a shared machine)


def child(name: str, data: dict, batch_size: int, batches: int) -> None:
    """Runs in the loader's own process: imports, then times the first batch and ``batches`` more; prints JSON."""
    peers.imports(name)
    started = time.perf_counter()
    iterator = peers.build(name, data, batch_size)
    images, labels = next(iterator)
    first = time.perf_counter() - started
    check(name, images, labels, batch_size)
    (machine, cpu), started, count = bench_ingest.cpu_seconds(), time.perf_counter(), 0
    for _ in range(batches):
        images, labels = next(iterator)
        count += len(labels)
    seconds = time.perf_counter() - started
    machine, cpu = (a - b for a, b in zip(bench_ingest.cpu_seconds(), (machine, cpu)))
    other = max(machine - cpu, 0) / seconds / len(os.sched_getaffinity(0))
    print(json.dumps({"first_batch": first, "rate": count / seconds, "cpu_per_image": cpu / count, "other": other}),
          flush=True)
    os._exit(0)  # some loaders' iterators hang on in finalizers; the parent reaps what is left


def check(name: str, images, labels, batch_size: int) -> None:
    """Refuses a loader whose batch is not the work the others do (a wrong shape or dtype is not a figure)."""
    shape, dtype = tuple(getattr(images, "shape", ())), str(getattr(images, "dtype", ""))
    if shape != (batch_size, *peers.SIZE, 3) or "uint8" not in dtype or len(labels) != batch_size:
        raise SystemExit(f"{name}: a batch of {shape} {dtype} with {len(labels)} labels; expected "
                         f"({batch_size}, {peers.SIZE[0]}, {peers.SIZE[1]}, 3) uint8")


def run_once(name: str, data_file: str, args) -> Result:
    """One fresh process for loader ``name``; its result and the CPU of its whole process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, os.path.abspath(__file__), "--child", name, "--data", data_file,
               "--batch-size", str(args.batch_size), "--batches", str(args.batches)]
    # Files, not pipes: a loader's orphaned workers inherit its stdout and would hold a pipe open.
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        returncode = subprocess.call(command, stdout=out_file, stderr=err_file)
        reap_orphans()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read().decode(errors="replace"), err_file.read().decode(errors="replace")
    if returncode != 0:
        raise SystemExit(f"{name}: the loader's process failed (exit {returncode}):\n{err[-3000:]}")
    measured = json.loads(out.strip().splitlines()[-1])
    process_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Result(measured["first_batch"], measured["rate"], measured["cpu_per_image"], process_cpu,
                  measured["other"])


def reap_orphans(grace: float = 2.0) -> None:
    """Waits for the loader's orphaned workers (reparented to us), so RUSAGE_CHILDREN holds the whole tree.

    A worker still running ``grace`` seconds after its loader's process ended (grain's do not stop by themselves)
    is sent SIGKILL by its PID; all of them are this run's.
    """
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _, _ = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for orphan in bench_ingest._descendants(os.getpid())[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(orphan, signal.SIGKILL)
        time.sleep(0.02)


def prepare(tmp: str, args, available: list[str]) -> dict:
    """The inputs every loader reads, made once (not timed); returns their paths."""
    from tfshard.ingest import ConvertOptions, convert_images

    src = bench_ingest.image_set(args.data_dir, args.images)
    bench_ingest.warm(src)
    data = {"src": src, "tfr": os.path.join(tmp, "tfr")}
    convert_images(src, data["tfr"], ConvertOptions(index=True), progress=False, tfds="tfds" in available)
    if "webdataset" in available:
        data["tars"] = os.path.join(tmp, "tars")
        peers.write_tars(src, data["tars"], shards=8)
    if "streaming" in available:
        data["mds"] = os.path.join(tmp, "mds")
        subprocess.check_call([sys.executable, os.path.abspath(__file__), "--write-mds", src, data["mds"]])
    for root, _, files in os.walk(tmp):  # warm the page cache for every form
        for name in files:
            bench_ingest._read(os.path.join(root, name))
    return data


def table(results: dict[str, list[Result]], absent: dict[str, list[str]], args) -> list[str]:
    """The side-by-side rows: medians over rounds, and ratios to tfshard's training reader."""
    med = {name: Result(*(statistics.median(field) for field in zip(*runs))) for name, runs in results.items()}
    base = med.get("tfshard")
    lines = [f"{'loader':<14} {'first batch s':>13} {'img/s':>6} {'CPU ms/img':>10} {'process CPU-s':>13} "
             f"{'other load':>10} {'img/s vs tfshard':>16} {'first batch vs tfshard':>22}"]
    for name in peers.LOADERS:
        if name not in med and name not in absent:  # left out by --only
            continue
        if name in absent:
            lines.append(f"{name:<14} not installed (pip install {' '.join(absent[name])})")
            continue
        r = med[name]
        ratio = f"{r.rate / base.rate:15.2f}x" if base else f"{'':>16}"
        first = f"{r.first_batch / base.first_batch:21.2f}x" if base else ""
        lines.append(f"{name:<14} {r.first_batch:13.2f} {r.rate:6.0f} {r.cpu_per_image * 1e3:10.2f} "
                     f"{r.process_cpu:13.1f} {r.other:10.0%} {ratio} {first}")
    spread = {name: (min(r.rate for r in runs), max(r.rate for r in runs)) for name, runs in results.items()}
    lines.append("")
    lines.append("img/s range over rounds: " + ", ".join(f"{n} {lo:.0f}-{hi:.0f}" for n, (lo, hi) in spread.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="generated JPEGs (default 1000)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated images")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--batches", type=int, default=45, help="batches timed after the first (default 45)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, one process per loader each")
    parser.add_argument("--quick", action="store_true", help="one round of 10 batches: checks that it runs")
    parser.add_argument("--only", nargs="+", choices=peers.LOADERS, help="these loaders only (default all)")
    parser.add_argument("--child", choices=peers.LOADERS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--write-mds", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_mds:
        return peers.write_mds(*args.write_mds)
    if args.child:
        with open(args.data, encoding="utf-8") as f:
            return child(args.child, json.load(f), args.batch_size, args.batches)
    if args.quick:
        args.rounds, args.batches = 1, 10
    if args.images < args.batch_size or min(args.batch_size, args.batches, args.rounds) < 1:
        parser.error("--batch-size, --batches and --rounds must be at least 1, --images at least --batch-size")

    chosen = args.only or list(peers.LOADERS)
    absent = {name: peers.missing(name) for name in chosen if peers.missing(name)}
    available = [name for name in chosen if name not in absent]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("note: could not become the subreaper; process CPU-s may miss orphaned workers", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-peers-") as tmp:
        data = prepare(tmp, args, available)
        data_file = os.path.join(tmp, "data.json")
        with open(data_file, "w", encoding="utf-8") as f:
            json.dump(data, f)
        cpus = len(os.sched_getaffinity(0))
        print(f"{args.images} JPEGs {bench_ingest.WIDTH}x{bench_ingest.HEIGHT}; {cpus} CPUs; batch {args.batch_size}, "
              f"{peers.SIZE[0]}x{peers.SIZE[1]} uint8, random-resized crop + flip; {args.batches} batches timed after "
              f"the first; {args.rounds} interleaved round(s), one fresh process per loader per round\n", flush=True)
        results: dict[str, list[Result]] = {name: [] for name in available}
        for round_ in range(args.rounds):
            shift = round_ % len(available)
            for name in available[shift:] + available[:shift]:
                result = run_once(name, data_file, args)
                results[name].append(result)
                print(f"  round {round_ + 1}: {name:<14} first batch {result.first_batch:5.2f} s, "
                      f"{result.rate:6.0f} img/s, {result.cpu_per_image * 1e3:5.2f} CPU ms/img, "
                      f"other load {result.other:.0%}", flush=True)
    print()
    print("\n".join(table(results, absent, args)))
    print("\nfirst batch: building the loader (imports done) to its first batch. CPU ms/img: the loader's whole\n"
          "process tree over the timed batches. process CPU-s: the whole tree from start to exit, imports included.\n"
          "other load: share of the CPUs that other processes took during the timed batches (over ~10%: img/s low).")


if __name__ == "__main__":
    main()
