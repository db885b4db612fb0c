"""The import rules of docs/design.md, read from the source: no cycle, and each layer imports only the ones below.

format ← ingest ← tools, format ← readers ← tools, cli on top of everything and imported by nothing. Every import
counts, the ones inside functions too. Two names stay where they were for the code that uses them, resolved on first
use: ``tfshard.ingest.verify`` (now ``tfshard.tools.verify``) and ``tfshard.readers.preview`` (now
``tfshard.tools.preview``); those two edges are the only exceptions, and they are listed here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("format", "ingest", "readers", "tools")
COMPATIBILITY = {("tfshard.ingest", "tfshard.tools.verify"), ("tfshard.readers", "tfshard.tools.preview")}


def _modules() -> dict[str, str]:
    """tfshard module name → its file, for the package's own code (the repository root is the package)."""
    found = {"tfshard": os.path.join(ROOT, "__init__.py"), "tfshard.cli": os.path.join(ROOT, "cli.py"),
             "tfshard.__main__": os.path.join(ROOT, "__main__.py")}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                    found["tfshard." + rel.removesuffix(".__init__")] = os.path.join(folder, name)
    return found


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The tfshard modules ``module`` imports anywhere in its file (a package where no module of the name exists)."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("tfshard"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("tfshard"):
                continue
            for alias in node.names:  # `from . import files` names a module; `from .x import f` names x
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {m for m in found if m in modules and m != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, path, modules) for m, path in modules.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else module


def test_no_import_cycle():
    graph = {m: {t for t in targets if (m, t) not in COMPATIBILITY} for m, targets in _graph().items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


# layer → the layers it may import (besides its own)
ALLOWED = {"format": set(), "ingest": {"format"}, "readers": {"format"}, "tools": {"format", "readers", "ingest"}}


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, targets in _graph().items():
        layer = _layer(module)
        if layer not in ALLOWED:
            continue
        for target in targets:
            other = _layer(target)
            if other != layer and other not in ALLOWED[layer] and (module, target) not in COMPATIBILITY:
                wrong.append(f"{module} imports {target}")
    assert wrong == [], wrong


def test_nothing_imports_the_cli():
    importers = sorted(m for m, targets in _graph().items() if "tfshard.cli" in targets and m != "tfshard.__main__")
    assert importers == []


def test_the_compatibility_names_still_resolve_to_the_tools():
    code = ("import tfshard.ingest as ingest, tfshard.readers as readers, tfshard.tools.verify as v, "
            "tfshard.tools.preview as p; print(ingest.verify is v.verify, ingest.VerifyError is v.VerifyError, "
            "readers.preview is p.preview)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split() == ["True", "True", "True"]


def test_the_command_line_starts_without_tensorflow():
    """``tfshard --help`` and a usage error answer at once: TensorFlow loads only in the commands that need it."""
    code = "import sys, tfshard.cli; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_commands_that_need_no_tensorflow_never_import_it(converted_images_copy):
    """``tfshard info OUT`` (and ``--json``), ``--version`` and ``--help`` read no data, and ``tfshard push OUT URL``
    only sends files (here to moto's S3 server, in the same process): they run without importing TensorFlow (~3 s of
    a ~3.7 s ``info`` before), checked in the process that ran them (a structural check)."""
    out = converted_images_copy.out
    code = textwrap.dedent(f"""
        import logging, os, sys
        import s3fs
        from moto.server import ThreadedMotoServer
        from tfshard.cli import main

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        endpoint = "http://%s:%d" % server.get_host_and_port()
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL=endpoint)
        s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test").mkdir("bucket")
        for args in (['info', {out!r}], ['info', '--json', {out!r}], ['push', {out!r}, 's3://bucket/pushed'],
                     ['--version'], ['--help']):
            try:
                main(args)
            except SystemExit as e:
                assert not e.code, (args, e.code)
        server.stop()
        print('tensorflow loaded:', 'tensorflow' in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{out}: images" in done.stdout  # info ran and printed the dataset
    assert "s3://bucket/pushed: uploaded " in done.stdout, done.stdout  # push ran and uploaded it
    assert done.stdout.strip().endswith("tensorflow loaded: False")
