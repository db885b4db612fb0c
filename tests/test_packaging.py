"""The installed library lives under one name, ``tfshard``, and nothing generic.

Builds the wheel from a copy of the repository, checks it holds the library only,
installs it into a fresh virtual environment beside another distribution that owns
a top-level ``cli`` package, and uses it from a folder that holds ``readers.py``,
``ingest.py`` and ``cli.py`` of its own — the collisions a top-level layout had.
The fresh environment borrows the test environment's dependencies (TensorFlow is
not installed twice) through a ``.pth`` line, which adds their folder to
``sys.path`` without activating this checkout's editable install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest
import tfshard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
_SKIP_COPY = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "tfshard-demo", "bench-data")


def _run(*command, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _wheel(source: str, out: str) -> str:
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", out, source)
    (name,) = [n for n in os.listdir(out) if n.endswith(".whl")]
    return os.path.join(out, name)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The tfshard wheel, a wheel of another project owning a top-level ``cli``, and a fresh venv with both."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "tfshard-src"
    shutil.copytree(REPO, source, ignore=_SKIP_COPY)  # tests/ and benchmarks/ come along: the wheel must leave them
    wheels = root / "wheels"
    wheel = _wheel(str(source), str(wheels / "tfshard"))

    other = root / "othercli"
    (other / "cli").mkdir(parents=True)
    (other / "cli" / "__init__.py").write_text('OWNER = "othercli"\n\ndef main():\n    print("the other cli")\n')
    (other / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "othercli"
        version = "1.0"
        [tool.setuptools]
        packages = ["cli"]
    """))
    other_wheel = _wheel(str(other), str(wheels / "othercli"))

    venv = root / "fresh"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    with open(os.path.join(site, "borrowed-dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
         other_wheel, wheel)

    work = root / "user-project"  # a user's folder with modules named like the old top-level ones
    work.mkdir()
    for name in ("readers", "ingest", "cli"):
        (work / f"{name}.py").write_text(f'raise SystemExit("the user\'s own {name}.py was imported")\n')
    return {"wheel": wheel, "venv": venv, "python": python, "site": site, "work": work}


def test_wheel_holds_the_library_under_tfshard_only(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"tfshard", f"tfshard-{tfshard.__version__}.dist-info"}, sorted(top)
    assert "tfshard/ingest/convert.py" in names and "tfshard/readers/windows/dataset.py" in names
    assert "tfshard/tools/verify.py" in names
    assert "tfshard/format/manifest.py" in names
    assert "tfshard/cli.py" in names and "tfshard/__main__.py" in names and "tfshard/py.typed" in names
    assert not [n for n in names if "/tests/" in n or "/benchmarks/" in n or "conftest" in n], names
    with zipfile.ZipFile(built["wheel"]) as wheel:
        entry_points = wheel.read(f"tfshard-{tfshard.__version__}.dist-info/entry_points.txt").decode()
    assert "tfshard = tfshard.__main__:main" in entry_points


def test_installed_beside_another_top_level_cli_both_work(built):
    bin_ = built["venv"] / "bin"
    assert _run(bin_ / "tfshard", "--version", cwd=built["work"]).stdout.strip() == f"tfshard {tfshard.__version__}"
    module = _run(built["python"], "-m", "tfshard", "--version", cwd=built["work"]).stdout.strip()
    assert module == f"tfshard {tfshard.__version__}"
    # The other project's `cli` is untouched by tfshard's install, and stays importable.
    owner = _run(built["python"], "-c", "import cli; print(cli.OWNER)", cwd=built["venv"]).stdout.strip()
    assert owner == "othercli"


def test_library_imports_from_a_folder_with_its_own_readers_py(built):
    code = ("import tfshard, tfshard.ingest as ingest; from tfshard import readers; "
            "print(tfshard.__file__); print(callable(readers.images), callable(ingest.convert_images))")
    out = _run(built["python"], "-c", code, cwd=built["work"], timeout=120).stdout.splitlines()
    assert out[0].startswith(str(built["site"])), out  # the installed wheel, not this checkout
    assert out[1] == "True True"


@pytest.mark.slow
def test_demo_runs_from_the_installed_wheel(built):
    done = _run(built["venv"] / "bin" / "tfshard", "demo", "demo", "--workers", "1", cwd=built["work"], timeout=600)
    assert "verified" in done.stdout and "readers.windows(" in done.stdout, done.stdout
    # Uninstalling the other project leaves tfshard whole (they share no files).
    _run(sys.executable, "-m", "pip", "--python", built["python"], "uninstall", "--quiet", "-y", "othercli")
    assert _run(built["venv"] / "bin" / "tfshard", "--version", cwd=built["work"]).returncode == 0


def test_readers_import_nothing_of_the_converter():
    """The on-disk format has one home, ``tfshard.format``; the readers read through it, never through ``ingest``."""
    code = ("import sys, tfshard.readers, tfshard.tools.bench; "
            "print(sorted(m for m in sys.modules if m.startswith('tfshard.ingest')))")
    assert _run(sys.executable, "-c", code, timeout=120).stdout.strip() == "[]"


def test_format_and_the_converter_core_load_no_tensorflow():
    code = ("import sys, tfshard.format.names, tfshard.format.records, tfshard.format.manifest, "
            "tfshard.format.storage, tfshard.format.dataset, tfshard.format.owners, tfshard.ingest.kinds.protocol, "
            "tfshard.format.duplicates, tfshard.ingest.duplicates, "
            "tfshard.tools.report; print('tensorflow' in sys.modules)")
    assert _run(sys.executable, "-c", code, timeout=120).stdout.strip() == "False"
