"""The project's exceptions. Each subclasses the builtin a caller would catch anyway."""


class InputError(ValueError):
    """Bad input or options: the message names the path, the problem and the fix."""


class OutputExistsError(InputError):
    """The output folder already holds something this run must not overwrite."""
