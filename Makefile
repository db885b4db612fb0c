# Two commands from a fresh clone: `make demo` and `make test`. Each sets up .venv itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test bench clean docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamp files: reinstall only when pyproject.toml changes. The repository root is the `tfshard` package, so
# setuptools warns (in a box) that a folder named like a package may shadow it; it cannot here, as the root
# holds no `tfshard/` folder. PYTHONWARNINGS reaches pip's build subprocess and keeps the install quiet.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet -e ".[preview]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/tfshard demo

# The suite on one worker process per core, at most 4 (pytest-xdist; a test file stays on one worker, so its
# golden datasets are built once). `make test PYTEST_WORKERS=0` runs it in this process.
PYTEST_WORKERS ?= auto
AZURITE := tests/.azurite/node_modules/.bin/azurite-blob
test: $(VENV)/.installed-test $(AZURITE)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile $(PYTEST_ARGS)

# Azurite, Microsoft's Azure Blob Storage emulator (npm, pinned), for the az:// tests (tests/azurite.py); without
# npm the target says so and those tests skip (and fail under TFSHARD_CI=1, where npm must be present). `make test`
# installs it first (~25 s, once).
$(AZURITE):
	@if command -v npm >/dev/null; then \
		npm install --prefix tests/.azurite --no-audit --no-fund --loglevel=error azurite@3.37.0; \
	else echo "npm not found: the Azure tests cannot run (install Node.js and npm)"; fi

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/images.py
	$(BIN)/python benchmarks/windows.py
	$(BIN)/python benchmarks/network.py

clean:
	rm -rf tfshard-demo .pytest_cache

# The generated reference pages (docs/reference/cli.md, api.md); tests/test_docs.py checks they are current.
docs: $(VENV)/.installed
	$(BIN)/python docs/make_reference.py
