# `make run` and `make test` work on a machine with only python3 (>= 3.11) and make:
# each creates .venv and installs what it needs the first time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test lint pytest tools bench crash failover history clean openrpc

# tidal is installed into .venv, not linked to the sources (pip install -e): setup.py
# compiles the hot modules with mypyc where a C compiler is found (pure Python where not),
# so what `make run` serves and `make test` tests is what ships. A changed source
# rebuilds it (about a minute).
SOURCES := $(shell find server protocol client cli testing -name '*.py') setup.py

# `make run` installs what serving needs (SERVE_STAMP); `make test` that and the test tools
# (STAMP), which serves too.
SERVE_STAMP := $(VENV)/.serve-stamp
INSTALL = $(PYTHON) -c 'import sys; sys.exit("tidal needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None' \
	&& (test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)) \
	&& rm -rf build/lib.* build/bdist.* \
	&& $(BIN)/python -m pip install --quiet --upgrade pip \
	&& $(BIN)/python -m pip install --quiet

$(STAMP): pyproject.toml $(SOURCES)
	$(INSTALL) '.[dev]'  # build/: a module moved or removed must not ship from there
	touch $@ $(SERVE_STAMP)

$(SERVE_STAMP): pyproject.toml $(SOURCES)
	$(INSTALL) .
	touch $@

run: $(SERVE_STAMP)
	$(BIN)/tidal serve --metrics-port 7412 --http 127.0.0.1:7480

test: lint pytest

pytest: $(STAMP) tools
	$(BIN)/python -m pytest

# From Debian, installed here when we are root with apt (as CI is); otherwise the tests
# that need them fail and say what is missing. docker-compose checks the compose file
# (tests/test_deploy.py); postgresql-15 is the real PostgreSQL the tests start themselves;
# podman and debootstrap build and run the image for real (tests/test_image.py), with runc
# beside podman: its default runtime, crun, cannot start containers where cgroups are v1 or
# hybrid, and deploy/oci-runtime.sh picks runc there. iptables drops a relay's packets: a
# network to PostgreSQL that goes silent (tests/test_pg_wedge.py). patroni and etcd-server
# run PostgreSQL failing over under load (tests/test_failover.py). prometheus (with promtool)
# tests the alerts and scrapes a loaded tidal (tests/test_monitoring.py). chromium loads the
# console in a real browser (tests/test_console.py); node and npm are the HTTP edge's
# clients that share no code with tidal (tests/test_http_node.py).
APT_TOOLS := $(if $(shell command -v docker-compose),,docker-compose) \
             $(if $(wildcard /usr/lib/postgresql/15/bin/initdb),,postgresql-15) \
             $(if $(shell command -v podman),,podman) \
             $(if $(wildcard /usr/sbin/runc /usr/bin/runc),,runc) \
             $(if $(wildcard /usr/sbin/iptables),,iptables) \
             $(if $(shell command -v debootstrap),,debootstrap) \
             $(if $(shell command -v patroni),,patroni) \
             $(if $(shell command -v etcd),,etcd-server) \
             $(if $(shell command -v promtool),,prometheus) \
             $(if $(wildcard /usr/lib/chromium/chromium),,chromium) \
             $(if $(shell command -v npm),,nodejs npm)
tools:
	@if [ -n "$(strip $(APT_TOOLS))" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TOOLS) >/dev/null; \
	  else echo "missing $(APT_TOOLS): the tests that need them will fail and say so"; fi; fi

# mypy cannot follow setuptools' package-dir mapping, so it reads the sources
# through a tree of links laid out as they are imported (tidal/server -> server).
lint: $(STAMP)
	$(BIN)/ruff check server protocol client cli testing tests bench setup.py
	$(BIN)/ruff format --check server protocol client cli testing tests bench setup.py
	rm -rf .lint && mkdir -p .lint/tidal
	ln -s ../../server .lint/tidal/server
	ln -s ../../protocol .lint/tidal/protocol
	ln -s ../../client .lint/tidal/client
	ln -s ../../cli .lint/tidal/cli
	ln -s ../../testing .lint/tidal/testing
	ln -s ../tests .lint/tests
	ln -s ../bench .lint/bench
	cd .lint && ../$(BIN)/mypy --config-file ../pyproject.toml --explicit-package-bases tidal tests bench
	cd .lint && PYTHONPATH=. ../$(BIN)/lint-imports --config ../pyproject.toml --no-cache

# The long kill -9 run: 200 cycles instead of the 20 that `make test` runs.
crash: $(STAMP)
	TIDAL_CRASH_CYCLES=200 $(BIN)/python -m pytest tests/test_crash.py -s --timeout 1800

# The fault-history checker run long: 200 faults per backend and 120 on three nodes instead
# of 25 and 12, the same
# kinds (tests/history/, docs/RELIABILITY.md).
history: $(STAMP) tools
	TIDAL_HISTORY_FAULTS=$(or $(FAULTS),200) \
	TIDAL_HISTORY_CLUSTER_FAULTS=$(or $(CLUSTER_FAULTS),120) \
	  $(BIN)/python -m pytest tests/test_history.py -s

# The long failover run: 10 faults in a row, each test, instead of 1.
failover: $(STAMP) tools
	TIDAL_FAILOVER_ROUNDS=10 $(BIN)/python -m pytest tests/test_failover.py -s

# Not part of `make test`: a tool, whose figures go to docs/BENCHMARKS.md.
# Installs Redis from Debian if missing (needs root and apt).
# docs/openrpc.json, from the method table (tests/test_openrpc.py checks it is current)
openrpc: $(STAMP)
	$(BIN)/python -m tidal.protocol.openrpc > docs/openrpc.json

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet '.[dev,bench]'
	$(BIN)/python bench/run.py $(if $(SCALE),--scale $(SCALE))

clean:
	rm -rf $(VENV) .lint .pytest_cache .mypy_cache .ruff_cache build *.egg-info
