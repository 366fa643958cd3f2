# The two commands of the README: `make run` and `make test`. Every install step
# lives here, so a fresh clone needs nothing done by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SRC    := pyproject.toml $(shell find exporter -name '*.py' -o -name '*.yaml' 2>/dev/null)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT    := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get

.PHONY: run test test-fast test-stress lint typecheck system-deps slurm-deps stress-deps bench-deps \
	generate generate-rules generate-golden clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The Dockerfile's `pip install .` (a node's) and [analysis] (numpy), which the simulated
# fleet needs; re-run whenever the package changes.
$(VENV)/.installed-run: $(BIN)/python $(SRC)
	$(BIN)/pip install --disable-pip-version-check '.[analysis]' -q .
	touch $@

# Every wheel the test install takes is kept in $(WHEELHOUSE) first, then installed from it:
# tests/test_docs_blocks.py installs the README's way into a fresh venv from the same wheels,
# with no download (and setuptools and wheel, to build gpufleet there without the index).
# pip 26 first, not the 23.2 a Python 3.11 venv brings: the package index's pages list about
# 100,000 files for these 75 projects, and pip 23.2 matched each file's tags against every tag
# the interpreter supports (about 900, one by one), so `pip wheel` took 34 CPU s; pip 26 takes
# 10 for the same wheels, and 24 instead of 34-49 for the install (the upgrade itself 2).
# An index without that pip only makes the install slower, never fails it.
WHEELHOUSE := $(VENV)/docs-wheelhouse
$(VENV)/.installed-test: $(BIN)/python $(SRC)
	$(BIN)/pip install --disable-pip-version-check -q 'pip==26.2.1' \
		|| echo "pip 26.2.1 is not on this index: the venv's own pip installs (slower)"
	$(BIN)/pip wheel --disable-pip-version-check -q -w $(WHEELHOUSE) '.[all,test]' 'setuptools>=68' wheel
	rm -f $(WHEELHOUSE)/gpufleet-*.whl
	$(BIN)/pip install --disable-pip-version-check -q --no-index --find-links $(WHEELHOUSE) '.[all,test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/gpufleet serve $(ARGS)

# Debian's prometheus, promtool, prometheus-alertmanager and amtool, when missing; and
# prometheus-node-exporter, whose real series the node pressure test reads (issue 20).
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
	    || ! command -v amtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v prometheus-node-exporter >/dev/null; then \
	  echo "installing Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter"; \
	  $(APT) update -q && $(APT) install -y -q --no-install-recommends prometheus prometheus-alertmanager \
	    prometheus-node-exporter; \
	fi

# Debian's Slurm (22.05) and munge, for the real Slurm the slurm source's tests start.
slurm-deps:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
	    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then \
	  echo "installing Debian's slurmctld, slurmd, slurm-client and munge"; \
	  $(APT) update -q && $(APT) install -y -q --no-install-recommends slurmctld slurmd slurm-client munge; \
	fi

# Debian's kubernetes-client (kubectl, with kustomize built in), when missing: the deploy
# tests render deploy/kubernetes with it.
.PHONY: kube-deps
kube-deps:
	@command -v kubectl >/dev/null || { echo "installing Debian's kubernetes-client"; \
	  $(APT) update -q && $(APT) install -y -q --no-install-recommends kubernetes-client; }

# Debian's victoria-metrics (1.79: victoria-metrics, vmagent, vmalert), when missing: the
# VictoriaMetrics tests run the generated rules in a real vmalert (issue 29).
.PHONY: vm-deps
vm-deps:
	@if ! command -v victoria-metrics >/dev/null || ! command -v vmagent >/dev/null \
	    || ! command -v vmalert >/dev/null; then \
	  echo "installing Debian's victoria-metrics"; \
	  $(APT) update -q && $(APT) install -y -q --no-install-recommends victoria-metrics; \
	fi

# Three pytest workers (pytest-xdist), each test file on one of them (--dist loadfile: a module's
# tests share its fixtures and run in order), and beside them the tests marked `alone` in one
# process: their waits (Alertmanager's inhibition, a 3 s source deadline, every dashboard query,
# two rule engines evaluating every second) were written for an otherwise idle machine, so
# everything else runs at nice 10 and yields the cores to them when they want them (the recipe
# runs in one session, so one autogroup, where nice orders the processes). The `alone` part
# mostly waits on its servers (about 60 CPU s in 225 s): run after the rest it left a core idle
# that long. At nice 19 a Prometheus started by an xdist test starved while the `alone` part's
# servers ran (samples aged past a source's max_sample_age): a nice-19 process weighs 1/68 of a
# nice-0 one, a nice-10 one about 1/9.
# Whole files go to the workers longest first (tests/helpers/make_parts.py's LONGEST_FIRST,
# with --no-loadscope-reorder: xdist's own order, most tests first, left the long files of few
# tests for last, and the run ended with one worker on one of them).
# TEST_WORKERS=0 runs the first part in one process too. Two more processes run beside:
# mypy (15 s of one core from a clean clone), and the tests marked `serial` (schemathesis':
# one process, not xdist, for their shared node ids; they make no timing wait and pass on a
# loaded machine). Every part's report follows the first part's; any failing fails make test.
TEST_WORKERS ?= 3
# The files holding the `serial` and `alone` tests, which their parts collect instead of all
# 2,700 tests (19 s of CPU each time); unless PYTEST_ARGS names tests. tests/conftest.py fails
# any run that collects a test carrying either mark in a file whose text does not name it.
# pytest's exit 5 (no test collected) is a PYTEST_ARGS that selects none of a part's tests.
MARKED = $(if $(filter tests/%,$(PYTEST_ARGS)),,$(shell grep -l 'mark\.$(1)\b' tests/test_*.py))
# The files whose module mark (`pytestmark = ...`) names `alone` or `serial`, all of whose tests
# the first part would deselect: it does not collect them (--ignore). Collecting
# test_schemathesis.py builds its coverage cases, 3 s of each worker's 7 s collection.
# tests/conftest.py fails any run that collects an unmarked test in such a file.
WHOLLY_MARKED = $(if $(filter tests/%,$(PYTEST_ARGS)),,$(shell grep -l '^pytestmark = .*mark\.\(alone\|serial\)\b' tests/test_*.py))

# Python's default, bytecode written, even where the environment says otherwise (the
# Dockerfile's PYTHONDONTWRITEBYTECODE=1, set in some CI images too): without it every pytest
# process compiles and rewrites the whole suite again (17 s of CPU per collection instead of
# 6 s), and every `python -m exporter` a test starts compiles the package again.
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: $(VENV)/.installed-test system-deps slurm-deps kube-deps stress-deps vm-deps
	$(BIN)/ruff check exporter tests bench deploy
	@$(BIN)/pytest -q -p no:cacheprovider -m alone $(PYTEST_ARGS) $(call MARKED,alone) \
	  > $(VENV)/alone.log 2>&1 & \
	alone=$$!; \
	nice -n 10 $(BIN)/mypy > $(VENV)/mypy.log 2>&1 & typing=$$!; \
	nice -n 10 $(BIN)/pytest -q -p no:cacheprovider -m serial $(PYTEST_ARGS) $(call MARKED,serial) \
	  > $(VENV)/serial.log 2>&1 & \
	serial=$$!; \
	nice -n 10 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not alone and not serial" $(addprefix --ignore=,$(WHOLLY_MARKED)) $(PYTEST_ARGS); \
	tests=$$?; \
	wait $$serial; serialized=$$?; echo "$(BIN)/pytest -q -m serial"; cat $(VENV)/serial.log; \
	wait $$typing; typed=$$?; echo "$(BIN)/mypy"; cat $(VENV)/mypy.log; \
	wait $$alone; alone=$$?; echo "$(BIN)/pytest -q -m alone"; cat $(VENV)/alone.log; \
	[ $$tests -eq 0 ] && [ $$serialized -eq 0 -o $$serialized -eq 5 ] && [ $$typed -eq 0 ] \
	  && [ $$alone -eq 0 -o $$alone -eq 5 ]

# The inner loop: everything but the tests that start real servers (marked slow), under 60 s:
# one pytest worker per core (pytest-xdist), since the fast tests are CPU-bound.
test-fast: $(VENV)/.installed-test system-deps kube-deps
	$(BIN)/ruff check exporter tests bench deploy
	$(BIN)/mypy
	$(BIN)/pytest -q -m "not slow" -n "$$(nproc)" $(PYTEST_ARGS)

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# Debian's stress-ng, the CPU hog of test-stress.
stress-deps:
	@command -v stress-ng >/dev/null || { $(APT) update -q && $(APT) install -y -q --no-install-recommends stress-ng; }

# Proof of determinism: the whole suite 3 times in a row while stress-ng keeps every core busy.
# Each run must pass; the times are printed at the end (docs/performance.md has the last figures).
STRESS_RUNS ?= 3
test-stress: $(VENV)/.installed-test system-deps slurm-deps stress-deps
	@hog=; trap 'kill $$hog 2>/dev/null' EXIT; \
	stress-ng --cpu "$$(nproc)" --timeout 3h --quiet & hog=$$!; \
	summary=; \
	for run in $$(seq $(STRESS_RUNS)); do \
	  start=$$(date +%s); \
	  $(BIN)/pytest -q $(PYTEST_ARGS) > .stress-run-$$run.log 2>&1; rc=$$?; \
	  took=$$(( $$(date +%s) - start )); tail -n 1 .stress-run-$$run.log; \
	  summary="$$summary\nrun $$run: exit $$rc in $$took s: $$(tail -n 1 .stress-run-$$run.log)"; \
	  if [ $$rc -ne 0 ]; then printf "$$summary\n"; echo "stress run $$run failed: see .stress-run-$$run.log"; exit 1; fi; \
	done; \
	printf "test-stress, $(STRESS_RUNS) runs under stress-ng --cpu $$(nproc):$$summary\n"

lint: $(VENV)/.installed-test
	$(BIN)/ruff check exporter tests bench deploy
	$(BIN)/hadolint Dockerfile

# wrk is the separate load-generator process bench/scrape.py drives.
bench-deps: $(VENV)/.installed-test
	@command -v wrk >/dev/null || { $(APT) update -q && $(APT) install -y -q wrk; }

# Regenerate every committed generated file; tests fail when one drifts from its source.
generate: generate-rules generate-golden

# tests/golden/metrics.txt: the default simulated fleet's /metrics at a fixed seed and clock
# (tests/test_golden.py checks it byte for byte).
generate-golden: $(VENV)/.installed-test
	$(BIN)/python -m tests.helpers.golden_metrics --update

# docs/metrics.md's tables of families from the catalogue, exporter/metrics.py
# (tests/test_docs.py checks the drift; the prose around the tables is written by hand).
.PHONY: generate-docs
generate: generate-docs
generate-docs: $(VENV)/.installed-test
	$(BIN)/python -m tests.helpers.metrics_doc --update

# rules/*.yaml from rules/thresholds.yaml (tests/test_alerting_rules.py checks the drift).
generate-rules: $(VENV)/.installed-run
	$(BIN)/gpufleet rules
	$(BIN)/gpufleet rules --format prometheusrule

# dashboards/*.json from the dashboard code and rules/thresholds.yaml (tests/test_dashboards.py
# checks the drift). Runs after generate-rules: the dashboards read the same table.
.PHONY: generate-dashboards
generate: generate-dashboards
generate-dashboards: $(VENV)/.installed-run generate-rules
	$(BIN)/gpufleet dashboards

# deploy/kubernetes's copies of the PrometheusRule and the dashboards (as ConfigMaps):
# kustomize reads no file outside its folder (tests/test_deploy_kubernetes.py checks the drift).
.PHONY: generate-kubernetes
generate: generate-kubernetes
generate-kubernetes: $(VENV)/.installed-run generate-dashboards
	$(BIN)/python deploy/kubernetes/generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .stress-run-*.log
