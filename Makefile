# callbox: the two commands a new user runs are `make demo` and `make test`.
# Each sets up what it needs: Python deps (PyPI), a Docker engine (Debian's docker.io,
# only when none answers), and the sandbox image (built offline, idempotent).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CALLBOX := $(VENV)/bin/callbox

.PHONY: setup npm-tools browser engine image runsc test test-runsc unit demo tour bench bench-scale proto proto-check lint

setup:
	@scripts/setup-python.sh

npm-tools:
	@scripts/setup-npm-tools.sh

# Debian's chromium, for the web console's browser tests (test-only).
browser:
	@scripts/setup-browser.sh

engine:
	@scripts/ensure-docker.sh

image: setup engine
	@$(CALLBOX) image build

# gVisor as the Docker runtime "runsc" (sandboxes with runtime = "runsc"); needs root.
runsc: engine
	@scripts/setup_runsc.sh

proto: setup
	@scripts/gen-proto.sh
	@echo "regenerated sandbox/v1 (and harness/v1) from proto/"

proto-check: setup
	@scripts/gen-proto.sh --check

lint: setup
	@echo "callbox: ruff + mypy --strict"
	@$(VENV)/bin/ruff check harness sandbox tests
	@$(VENV)/bin/mypy harness sandbox

unit: setup
	@$(VENV)/bin/pytest tests/unit -q

test: setup npm-tools browser proto-check lint engine image runsc
	@echo "callbox: running the test suite (unit, integration, security, interop) on the real engine"
	@scripts/run-tests.sh

# The security suite under gVisor alone (`make test` runs it too, beside the main run).
test-runsc: setup engine image runsc
	@echo "callbox: the security suite under gVisor (CALLBOX_TEST_RUNTIME=runsc)"
	@CALLBOX_TEST_RUNTIME=runsc $(VENV)/bin/pytest tests/security -q -p no:cacheprovider

demo: setup engine image
	@scripts/demo.sh

tour: setup engine image
	@scripts/tour.sh

# make bench: the table on stdout, bench-results.json (one object per row) where it is started.
# make bench-scale [SANDBOXES=N]: the scale probe alone (N live sandboxes, default 100),
# written to bench-scale-results.json.
SANDBOXES ?= 100

bench: setup engine image
	@$(PY) -m tests.bench.bench_exec

bench-scale: setup engine image
	@$(PY) -m tests.bench.bench_exec --only scale --sandboxes $(SANDBOXES) --json bench-scale-results.json
