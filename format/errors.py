"""tfshard's exceptions, the ones a caller may catch: one home that every layer may import (it imports nothing).

Each subclasses the builtin a caller would catch anyway, and its message names the path, the problem and the fix.
The packages export the ones their users meet: ``tfshard.ingest.InputError``, ``OutputExistsError``,
``TfdsMetadataError`` and ``VerifyError``. Exceptions that never leave the module raising them (a worker's
``_CorruptJpeg``, ``npy.BadFile``, the shard cache's ``Stopped``) stay beside the code that raises and catches them;
the shard cache's folder errors are the readers' own (``readers/shard_cache/``); ``Terminated`` is a signal
(``format/stops.py``), not an error.

    try:
        convert_images("photos/", "photos-tfr/")
    except OutputExistsError as e:  # an InputError too; OutputLockedError when another conversion holds OUT
        print(e)
"""

from __future__ import annotations

import functools
import string


class ManifestError(ValueError):
    """A manifest or state file that is not what tfshard wrote: the message names the file and the field."""


class NotRegularFileError(ValueError):
    """A path that must be a regular file is a folder, FIFO, device or socket (reading it could hang or never end)."""


class InputError(ValueError):
    """Bad input or options: the message names the path, the problem and the fix."""


class OutputExistsError(InputError):
    """The output folder already holds something this run must not overwrite."""


class OutputLockedError(OutputExistsError):
    """Another live conversion holds the output folder's lock."""


class TfdsMetadataError(ValueError):
    """A conversion asked for TFDS metadata (``tfds=True``) is complete, but the metadata could not be written."""


class VerifyError(ValueError):
    """A written dataset does not match its manifest; ``problems`` lists every finding."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


class Spelled(Exception):
    """An error naming options as the caller spelled them: the argument (``val_fraction``) from Python, the flag
    (``--val-fraction``) for a CLI run, which prints ``spelled(flags)``.

    ``template`` is a ``str.format`` template whose fields are the options it names (``{val_fraction}``) and the
    ``values`` (``{got!r}``); a value is never parsed as a template. ``{append:set}`` is a switch turned on:
    ``append=True`` from Python, ``--append`` from the CLI.

        e = OptionError("{val_fraction}: must be in [0, 1) (got {got!r})", got=1.5)
        str(e), e.spelled({"val_fraction": "--val-fraction"})
        # ("val_fraction: must be in [0, 1) (got 1.5)", "--val-fraction: must be in [0, 1) (got 1.5)")
    """

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        self.names = [field for _, field, _, _ in string.Formatter().parse(template) if field and field not in values]
        super().__init__(self.spelled({}))

    def spelled(self, flags: dict[str, str]) -> str:
        """The message with each option named by ``flags`` (argument name -> flag), else by its argument name."""
        return self.template.format(**{name: _Name(flags.get(name, name)) for name in self.names}, **self.values)

    def __reduce__(self):
        return functools.partial(type(self), **self.values), (self.template,)


class _Name(str):
    """An option's name in a ``Spelled`` message; ``:set`` spells it turned on (``append=True``, ``--append``)."""

    def __format__(self, spec: str) -> str:
        if spec == "set":
            return str(self) if self.startswith("-") else f"{self}=True"
        return format(str(self), spec)


class OptionError(Spelled, InputError):
    """A bad conversion option, named as the caller spelled it (``Spelled``): ``val_fraction`` from Python,
    ``--val-fraction`` from the CLI."""


class InputsGrownError(Spelled, OutputExistsError):
    """OUT holds a dataset of the same options whose inputs SRC has grown past: an append adds the new ones, which
    the message says as the caller spells it (``append=True`` is ``--append``)."""
