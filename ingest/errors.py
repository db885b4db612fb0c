"""The project's exceptions. Each subclasses the builtin a caller would catch anyway."""


class InputError(ValueError):
    """Bad input or options: the message names the path, the problem and the fix."""


class OutputExistsError(InputError):
    """The output folder already holds something this run must not overwrite."""


class TfdsMetadataError(ValueError):
    """A conversion asked for TFDS metadata (``tfds=True``) is complete, but the metadata could not be written."""
