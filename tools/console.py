"""How ``tfshard`` talks to a terminal: TensorFlow loaded quietly, errors as one line, signals as a clean stop,
and exit codes a shell can read. ``cli.py`` holds the commands; this is what they share. Loads no TensorFlow
at import.

Ctrl-C and SIGTERM are handled from the command's first line (``format/stops.py``, installed by ``run``): both
stop any command, and the exit code is 130 or 143 whichever command it was.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import typer

from ..format import objects, stops
from ..format.errors import Spelled
from ..format.stops import HungUp, Terminated
from ..format.storage import is_url, prefer_small_gcs_blocks
from .report import short_tf_error

EXIT_CODES = {0: "success", 1: "an error (one line on stderr)", 2: "a usage error: a bad flag or argument",
              129: "hung up (SIGHUP: the terminal was closed)", 130: "interrupted (Ctrl-C)",
              143: "terminated (SIGTERM)"}
GLOBAL_FLAGS = ("--debug", "--verbose", "-v")
_STOP_CODES = (128 + signal.SIGHUP, 128 + signal.SIGINT, 128 + signal.SIGTERM)
_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}


def configure(debug: bool, verbose: bool) -> None:
    """What the global flags set before any command: TensorFlow's C++ logs off unless ``debug``, small ``gs://``
    read blocks, and the library's logging at INFO with ``verbose`` or ``debug``."""
    if not debug:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    prefer_small_gcs_blocks()  # before TensorFlow first touches gs://
    logging.basicConfig(level=logging.INFO if verbose or debug else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    for handler in logging.getLogger().handlers:  # other libraries' lines too (botocore, azure-core at INFO)
        handler.addFilter(_redacted)


def _redacted(record: logging.LogRecord) -> bool:
    """A log record with every secret ``objects.redact`` knows replaced (its message formatted first)."""
    try:
        record.msg, record.args = objects.redact(record.getMessage()), None
    except (TypeError, ValueError):  # a record whose arguments do not fit its format: shown without them
        record.msg, record.args = objects.redact(str(record.msg)), None
    return True


def storage_options(pairs: list[str] | None, *urls: str | None) -> None:
    """``--storage-option KEY=VALUE`` (repeated) as fsspec's options for the ``s3://``, ``az://`` and ``https://``
    URLs among ``urls`` (``objects.use_storage_options``). A value is a string; ``KEY:=JSON`` gives any other type
    (``use_ssl:=false``, ``max_concurrency:=4``, ``config_kwargs:='{"read_timeout": 5}'``).

    Raises:
      ValueError: a pair without ``=``, JSON that does not parse, or no such URL among ``urls`` (never naming a
        value: it may be a secret).
    """
    if not pairs:
        return
    options: dict[str, Any] = {}
    for pair in pairs:
        key, typed, value = pair.partition(":=") if ":=" in pair.split("=", 1)[0] + "=" else pair.partition("=")
        if not typed or not key:
            raise ValueError(f"--storage-option: expected KEY=VALUE or KEY:=JSON (got {len(pair)} characters without "
                             "'=' or a key); pass e.g. --storage-option endpoint_url=https://minio.internal:9000")
        if typed == ":=":
            try:
                options[key] = json.loads(value)
            except ValueError:
                raise ValueError(f"--storage-option {key}:=...: the value is not JSON (got {len(value)} characters); "
                                 f"quote it for the shell, e.g. {key}:=true, {key}:=5 or {key}:='{{\"a\": 1}}'"
                                 ) from None
        else:
            options[key] = value
    objects.use_storage_options([url for url in urls if url], options, "--storage-option")


def load_tensorflow(debug: bool) -> None:
    """Imports TensorFlow once, up front; without ``debug`` its C++ start-up chatter is kept off stderr.

    The CUDA-enabled wheel prints "Could not find cuda drivers" on CPU-only hosts
    before TF_CPP_MIN_LOG_LEVEL is read, so only an fd-level redirect hides it.
    """
    if debug or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import tensorflow as tf

            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def reportable() -> tuple[type[BaseException], ...]:
    """What a command reports as one line: bad input, OS errors (a full disk), a missing optional extra (the
    message says what to install) and, once it is loaded, TensorFlow's op errors."""
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return ValueError, OSError, ImportError, tf.errors.OpError
    return ValueError, OSError, ImportError


def flags_of_command() -> dict[str, str]:
    """The running command's flags by their parameters' names (``val_fraction`` -> ``--val-fraction``), which are
    the library's argument names: so a ``Spelled`` error (``OptionError``) names the flag a CLI user typed."""
    ctx = importlib.import_module(_click().__name__ + ".globals").get_current_context(silent=True)
    params = ctx.command.params if ctx is not None else []
    return {param.name: param.opts[0] for param in params if param.opts and param.opts[0].startswith("-")}


def one_line(error: BaseException) -> str:
    """``error: ...``: the error's message on one line (a TensorFlow op error without its graph-function noise; an
    option named by its flag)."""
    message = error.spelled(flags_of_command()) if isinstance(error, Spelled) else str(error)
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        if isinstance(error, tf.errors.OpError):
            message = f"{short_tf_error(error.message) or type(error).__name__} (TensorFlow {type(error).__name__})"
    return f"error: {objects.redact(' '.join(message.split())) or type(error).__name__}"


def stopped(what: str, error: KeyboardInterrupt, resumable: bool = False) -> tuple[str, int]:
    """Ctrl-C, SIGTERM or SIGHUP: the line to print and the exit code, 128 + the signal number, as shells expect."""
    first = stops.requested()  # the stop that arrived first is the one reported
    if first is None:
        first = signal.SIGTERM if isinstance(error, Terminated) else signal.SIGHUP if isinstance(error, HungUp) else \
            signal.SIGINT
    tail = "; run the same command again to resume (committed shards are kept)" if resumable else ""
    return f"{what}: {_STOPPED[first]}{tail}", 128 + first


def reads_through_tensorflow(*paths: str | None) -> bool:
    """Whether any of ``paths`` is a URL only ``tf.io.gfile`` reads (``gs://``): a command that otherwise needs no
    TensorFlow loads it, quietly, for such a path (``s3://``, ``az://``, ``https://`` and local paths need none)."""
    return any(path is not None and is_url(path) and not objects.uses_fsspec(path) for path in paths)


@contextlib.contextmanager
def command(debug: bool, stop: str | None = None, resumable: bool = False,
            tensorflow: bool = True) -> Iterator[None]:
    """A command's body: TensorFlow loaded quietly first (unless ``tensorflow`` is False: a command that needs none
    then answers in a fraction of a second, not the ~3 s TensorFlow takes to import), a ``reportable`` error as one
    line on stderr and exit 1.

    With ``stop`` (what the line names), Ctrl-C or SIGTERM is one line too (``stopped``) and exit 130 or 143;
    without it, ``run`` reports the stop. ``debug`` lets both through, with their tracebacks.
    """
    try:
        if tensorflow:
            load_tensorflow(debug)
        yield
    except reportable() as e:  # called once an error arrives: TensorFlow's op errors count once it is loaded
        if debug:
            raise
        typer.echo(one_line(e), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:
        if debug or stop is None:
            raise
        line, code = stopped(stop, e, resumable)
        typer.echo(line, err=True)
        raise typer.Exit(code) from None


def echo_lines(lines: Iterable[str]) -> None:
    """Prints each line as it comes; a generator's clean-up (say, a temporary cache) runs however the loop ends."""
    try:
        for line in lines:
            typer.echo(line)
    finally:
        if hasattr(lines, "close"):
            lines.close()


def global_flags_first(args: list[str]) -> list[str]:
    """Moves ``--debug``/``-v`` to the front, so they work after the subcommand too (before any ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in GLOBAL_FLAGS]
    return flags + [a for a in args[:end] if a not in GLOBAL_FLAGS] + args[end:]


def _click():
    """The click typer runs on: vendored as ``typer._click`` since typer 0.22, the ``click`` package before."""
    return getattr(typer, "_click", None) or importlib.import_module("click")


def _invoked(command, args: list[str], prog_name: str):
    """What ``command`` returns on ``args`` (an ``Exit``'s code, too). Its context is made and invoked here rather
    than by ``command.main``, so a Ctrl-C or SIGTERM no command caught reaches ``run`` as itself: typer's main
    (0.2x) turns it into a bare exit 130, SIGTERM included, with nothing said; click's into ``Abort``."""
    try:
        with command.make_context(prog_name, args) as ctx:
            return command.invoke(ctx)
    except typer.Exit as e:  # click's own Exit, which typer re-exports (its own class since typer 0.2x)
        return e.exit_code


def run(app: typer.Typer, args: list[str], prog_name: str) -> int:
    """Runs the typer ``app`` on ``args``; returns one of ``EXIT_CODES``. Usage errors are one line too
    (``error: ...``, exit 2), not the boxed panel typer draws by default. Ctrl-C, SIGTERM and SIGHUP stop every
    command (130, 143, 129), from before TensorFlow loads to the last line printed; after it, one ends the process at
    once with the code that line told (``stops.leaving``)."""
    stops.install()
    code = _outcome(app, args, prog_name)
    stops.leaving(code)
    return code


def _outcome(app: typer.Typer, args: list[str], prog_name: str) -> int:
    errors = _click().exceptions
    try:
        stops.check()  # a stop that arrived while the command loaded (``tfshard.__main__``)
        code = _invoked(typer.main.get_command(app), global_flags_first(args), prog_name)
        if code not in _STOP_CODES:  # a stop the command did not report (swallowed on its way) still ends it
            stops.check()
    except errors.NoArgsIsHelpError as e:
        typer.echo(e.format_message())
        code = 2
    except errors.UsageError as e:
        hint = f"; see `{e.ctx.command_path} --help`" if e.ctx is not None else ""
        typer.echo(f"error: {' '.join(e.format_message().split())}{hint}", err=True)
        code = 2
    except errors.ClickException as e:
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt) as e:
        stop = e if isinstance(e, KeyboardInterrupt) else e.__cause__
        if not isinstance(stop, KeyboardInterrupt):
            typer.echo("error: aborted", err=True)
            return 1
        line, code = stopped(prog_name, stop)
        typer.echo(line, err=True)
    return code if isinstance(code, int) else 0


def exiting(code: int) -> int:
    """``code``, once the garbage collector is frozen: the process is about to end, and the interpreter's shutdown then
    frees TensorFlow's objects by their reference counts instead of walking every one of them in its last
    collections. Measured on a busy 2-core machine, a command with TensorFlow loaded took 6-9 s to exit after its
    last line (a stopped one after its stop's line), and 0.3-0.6 s frozen."""
    gc.freeze()
    return code

