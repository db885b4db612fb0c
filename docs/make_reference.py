"""Writes the generated reference pages: ``docs/reference/cli.md`` from the typer app, ``docs/reference/api.md``
from the public names' signatures and docstrings.

    .venv/bin/python docs/make_reference.py          # rewrite both pages (make docs)
    .venv/bin/python docs/make_reference.py --check  # exit 1 if either is out of date (tests/test_docs.py runs it)
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

HERE = os.path.dirname(os.path.abspath(__file__))
PAGES = {"cli": os.path.join(HERE, "reference", "cli.md"), "api": os.path.join(HERE, "reference", "api.md")}

# The public Python API, by module, in the order a reader meets it.
API = {
    "tfshard.ingest": ["convert_images", "convert_episodes", "ConversionResult", "ConvertOptions", "ImageOptions",
                       "EpisodeOptions", "parse_size", "load_manifest", "Manifest", "InputError", "OptionError",
                       "OutputExistsError", "TfdsMetadataError"],
    "tfshard.readers": ["images", "info", "DatasetInfo", "class_weights", "normalization", "episodes", "windows",
                        "resident_windows", "model_windows", "ModelWindows", "WindowGather", "BackupAndRestore",
                        "as_numpy", "NumpyBatches"],
    "tfshard.readers.windows.request": ["WindowRequest"],
    "tfshard.readers.service": ["start_dispatcher", "start_worker", "bound_port"],
    "tfshard.format.objects": ["set_storage_options", "storage_options", "UnsupportedSchemeError"],
    "tfshard.tools.verify": ["verify", "VerifyError"],
    "tfshard.tools.preview": ["preview", "save_picture"],
    "tfshard.tools.tfds": ["write_tfds_metadata"],
    "tfshard.tools.bench": ["run", "time_epochs"],
    "tfshard.tools.demo": ["run_demo"],
}


def _type_name(param) -> str:
    """``int``, ``str``, or an enum's choices, from the parameter's annotation (Optional unwrapped)."""
    import enum
    import typing

    annotation = param.type_descriptor.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    annotation = args[0] if args else annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "\\|".join(member.value for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _option_row(param) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *(param.secondary_opts or [])])
    if param.param_type_name == "argument":
        kind = "argument"
    elif getattr(param, "is_flag", False):
        kind = "flag"
    else:
        kind = f"`{_type_name(param)}`"
    default = param.default.value if hasattr(param.default, "value") else param.default
    if param.required:
        shown = "required"
    elif getattr(param, "is_flag", False) and param.secondary_opts:
        shown = f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    elif default is None or default is False:
        shown = ""
    else:
        shown = f"`{default}`"
    text = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
    return f"| {names} | {kind} | {shown} | {text} |"


def _command_section(path: str, command) -> list[str]:
    lines = [f"## `{path}`", "", inspect.cleandoc(command.help or ""), ""]
    params = [p for p in command.params if p.name not in ("help",)]
    if params:
        lines += ["| name | kind | default | meaning |", "|---|---|---|---|"]
        lines += [_option_row(p) for p in params]
        lines.append("")
    return lines


def cli_page() -> str:
    """The reference of every command and flag, read from the typer app itself."""
    import typer
    from tfshard import cli

    root = typer.main.get_command(cli.app)
    lines = ["# Command-line reference", "",
             "Generated from the typer app by `docs/make_reference.py`; `tests/test_docs.py` checks it is current.",
             "Global flags (anywhere on the line): `--debug` (tracebacks and TensorFlow's logs), `-v`/`--verbose` "
             "(what the library does), `--version`.", "",
             "Exit codes: " + "; ".join(f"`{code}` {what}" for code, what in cli.EXIT_CODES.items()) + ".", ""]
    for name, command in sorted(root.commands.items()):
        if hasattr(command, "commands"):  # a group: `tfshard service ...`
            for sub, subcommand in sorted(command.commands.items()):
                lines += _command_section(f"tfshard {name} {sub}", subcommand)
        else:
            lines += _command_section(f"tfshard {name}", command)
    return "\n".join(lines).rstrip() + "\n"


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def api_page() -> str:
    """The public names' signatures and docstrings, as they are in the code."""
    import importlib

    lines = ["# Python API reference", "",
             "Generated from the docstrings by `docs/make_reference.py`; `tests/test_docs.py` checks it is "
             "current.", ""]
    for module_name, names in API.items():
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", ""]
        for name in names:
            obj = getattr(module, name)
            kind = "class" if inspect.isclass(obj) else "def"
            lines += [f"### `{name}`", "", "```python", f"{kind} {name}{_signature(obj)}", "```", "",
                      inspect.getdoc(obj) or "", ""]
    return "\n".join(lines).rstrip() + "\n"


def generate() -> dict[str, str]:
    return {"cli": cli_page(), "api": api_page()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is out of date; write nothing")
    args = parser.parse_args()
    stale = []
    for name, text in generate().items():
        path = PAGES[name]
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current != text:
            stale.append(path)
            if not args.check:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
