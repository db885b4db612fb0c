"""``python -m tfshard`` and the ``tfshard`` command (its entry point): Ctrl-C and SIGTERM are handled from here
on, before typer, the commands and TensorFlow load (``format/stops.py``), so a stop while the command still starts
is one line and exit 130 or 143 like any other, not a traceback or a silent death."""

from __future__ import annotations

import contextlib

from .format import stops


def main(args: list[str] | None = None) -> None:
    stops.install()
    with contextlib.suppress(KeyboardInterrupt), stops.deferred():  # noted while the command loads, raised as it runs
        from .cli import main as command
    command(args)


if __name__ == "__main__":
    main()
