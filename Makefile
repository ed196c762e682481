# callbox: the two commands a new user runs are `make demo` and `make test`.
# Each sets up what it needs: Python deps (PyPI), a Docker engine (Debian's docker.io,
# only when none answers), and the sandbox image (built offline, idempotent).
# `make docs` builds the documentation site into site/ (offline, strict); `make docs-serve`
# serves it while you edit.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CALLBOX := $(VENV)/bin/callbox

.PHONY: setup npm-tools browser postgresql engine image image-code-interpreter image-desktop runsc test test-runsc unit demo demo-desktop tour bench bench-scale bench-docs proto proto-check lint docs docs-serve

setup:
	@scripts/setup-python.sh

npm-tools:
	@scripts/setup-npm-tools.sh

# Debian's chromium, for the browser tests of the web console and the documentation site (test-only).
browser:
	@scripts/setup-browser.sh

# Debian's postgresql, the server the sql tool's tests start in the test network namespace (test-only).
postgresql:
	@scripts/setup-postgresql.sh

engine:
	@scripts/ensure-docker.sh

image: setup engine
	@$(CALLBOX) image build

# The code interpreter's image variant (the E2B door's code-interpreter-v1 template); its own
# debootstrap base is cached, so a rebuild takes seconds.
image-code-interpreter: setup engine image
	@$(CALLBOX) image build --variant code-interpreter

# The desktop image variant (Xvfb, openbox, Chromium, xdotool, x11vnc, noVNC: the computer tool's
# display); its own debootstrap base is cached, so a rebuild takes seconds.
image-desktop: setup engine image
	@$(CALLBOX) image build --variant desktop

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
	@$(VENV)/bin/ruff check harness sandbox tests docs/hooks images
	@$(VENV)/bin/mypy harness sandbox
	@$(VENV)/bin/mypy -p docs.hooks  # a package (docs/ is no package of its own), so a run of its own

unit: setup
	@$(VENV)/bin/pytest tests/unit -q

test: setup npm-tools browser postgresql proto-check lint engine image image-code-interpreter image-desktop runsc
	@echo "callbox: running the test suite (unit, integration, security, interop) on the real engine"
	@scripts/run-tests.sh

# The security suite under gVisor alone (`make test` runs it too, beside the main run).
test-runsc: setup engine image runsc
	@echo "callbox: the security suite under gVisor (CALLBOX_TEST_RUNTIME=runsc)"
	@CALLBOX_TEST_RUNTIME=runsc $(VENV)/bin/pytest tests/security -q -p no:cacheprovider

demo: setup engine image
	@scripts/demo.sh

demo-desktop: setup engine image-desktop
	@scripts/demo-desktop.sh

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

# make bench-docs: make bench, then its results without the raw samples as docs/bench-results.json,
# the file the site's Benchmarks page is drawn from, and the rows with a target into README.md's
# bench-summary lines (commit both with the code they measured).
bench-docs: bench
	@$(PY) -m docs.hooks.bench_reference bench-results.json docs/bench-results.json README.md

# make docs: the site (mkdocs.yml) built strictly into site/: a broken link or anchor, a page
# left out of the nav, or a generated reference that cannot be made fails it. Nothing is fetched.
# make docs-serve [DOCS_ADDR=HOST:PORT]: the same site, rebuilt on every change (default 127.0.0.1:8000).
DOCS_ADDR ?= 127.0.0.1:8000
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: setup
	@$(MKDOCS) build --strict --site-dir site
	@echo "callbox: the documentation site is in site/ (make docs-serve to browse it)"

docs-serve: setup
	@echo "callbox: serving the documentation on http://$(DOCS_ADDR)/ (Ctrl-C stops)"
	@$(MKDOCS) serve --strict --dev-addr $(DOCS_ADDR)
