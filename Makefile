# The README's two commands: `make demo` and `make test`. Both set up everything they need on a
# fresh machine (virtualenv, control-plane binaries in ~/.cache/vkprovider) and are idempotent.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB ?= .lab
# Offline stacks the demo's front end runs, e.g. `make demo WITH=jobset,kueue,volcano` (e2e.stacks).
WITH ?=

.PHONY: all venv binaries browser lint test test-unit test-e2e demo down bench clean proto image docs

all: venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vkprovider needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kwok, metrics-server,
# helm, promtool, Prometheus, JobSet, Kueue and Volcano from the pinned modules under e2e/tools
# (minutes when cold, instant when cached).
binaries: $(STAMP)
	$(BIN)/python -m e2e build

# Debian's Chromium for the dashboard's browser test (tests/e2e/test_dashboard.py), installed
# with apt-get when missing; where that cannot be done, the test says what is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "could not install chromium; the dashboard's browser test will fail saying so"

# An OCI image of the provider (e2e/image), without a container daemon or a registry base image:
# Debian bookworm from the Debian archive (mmdebstrap, installed with apt-get when missing), the
# provider's wheel and its dependencies. Needs root. About a minute when cold, seconds when cached
# (~/.cache/vkprovider/image); the archive's path is the last line printed.
image: $(STAMP)
	$(BIN)/python -m e2e.image

LINT = $(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy && $(BIN)/lint-imports

lint: $(STAMP)
	$(LINT)

# The lint runs beside the tests (its minute overlaps the lab's start); either failing fails the
# target, and the lint's output follows the tests'. Three workers on two cores: the tests mostly
# wait on the lab's timers (the machine was 51 % busy on average with two workers), and turns at
# the lab (e2e.turns) keep apart those that cannot share it.
test: $(STAMP) binaries browser
	@log=$$(mktemp); ( $(LINT) ) > $$log 2>&1 & linting=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider -n 3 --dist loadscope --no-loadscope-reorder --durations=0 --durations-min=15 tests; \
	tested=$$?; wait $$linting; linted=$$?; cat $$log; rm -f $$log; \
	if [ $$linted -ne 0 ]; then echo "make test: the lint failed"; exit 1; fi; exit $$tested

# The documentation site (mkdocs.yml, docs/): the reference pages regenerated from the code, then
# built strictly (a broken link or a page left out of the navigation fails) into .site/.
# tests/unit/test_docs.py builds it too, so `make test` (and CI) fails on either.
docs: $(STAMP)
	$(BIN)/python docs/generate.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

demo: $(STAMP) binaries
	$(BIN)/python -m e2e.demo --state $(LAB) --with "$(WITH)"

down: $(STAMP)
	-$(BIN)/python -m e2e.demo --stop --state $(LAB)

bench: $(STAMP) binaries
	$(BIN)/python -m bench.lab_up
	$(BIN)/python -m bench.runtime_pods
	$(BIN)/python -m bench.capacity_scale
	$(BIN)/python -m bench.dispatch
	$(BIN)/python -m bench.steady
	$(BIN)/python -m bench.reaction
	$(BIN)/python -m bench.planner_scale
	$(BIN)/python -m bench.kubelet_stress
	$(BIN)/python -m bench.reclaim_latency
	$(BIN)/python -m bench.streams
	$(BIN)/python -m bench.history_memory
	$(BIN)/python -m bench.dashboard_scale

clean: down
	rm -rf $(VENV) $(LAB) *.egg-info .site

# Regenerates the capacity agent's gRPC code from federation/agent/capacity.proto (committed).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. federation/agent/capacity.proto
