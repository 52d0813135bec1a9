# statekit — every target bootstraps .venv with the pinned dependencies by itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.statekit-installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: lab demo bytecode test test-suites test-tour test-slow test-native test-cluster test-connect test-browser test-browser-cluster bench java archive clean venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml scripts/spark_workers_pth.py scripts/spark_cds.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "statekit needs Python >= 3.10"' \
	  || { echo "statekit needs Python 3.10 or newer (found $$($(PYTHON) --version))."; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) scripts/spark_workers_pth.py
	$(PY) scripts/spark_cds.py
	@touch $(STAMP)

java:
	@bash scripts/check_java.sh

# statekit's own bytecode, compiled ahead: an editable install leaves it to each import, which
# writes none where PYTHONDONTWRITEBYTECODE is set (then every process compiles what it imports:
# ~0.5 s of a cold launch's CPU); only what changed is compiled again (~0.1 s when none did)
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 statekit kernel_ext

# Java maps the class archive only for the build that wrote it: after a JDK update or with another
# JAVA_HOME, written again for the Java found now (scripts/spark_cds.py), else nothing to do
archive: $(STAMP) java
	@$(PY) scripts/spark_cds.py --if-stale

# root too (--allow-root, said in one line), the first free port from 8888, no browser without a
# display, the URL with its token printed last (scripts/lab.py); LAB_ARGS go to jupyter lab
lab: $(STAMP) java archive bytecode
	@echo "A workshop room on one Spark Connect server: \`.venv/bin/statekit spark serve\` (the teacher), then each participant sets SPARK_REMOTE to the URL it prints (README: A workshop on one server)."
	@$(PY) scripts/lab.py $(LAB_ARGS)

demo: $(STAMP) java archive bytecode
	$(PY) -m statekit.demo

# two pytest processes side by side, one per core; the first one's report follows the second's:
# $(call halves,ARGS OF THE FIRST,ARGS OF THE SECOND,WHAT THE FIRST RAN)
define halves
	@log=$$(mktemp); \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 $(1) >$$log 2>&1 & a=$$!; trap "kill $$a 2>/dev/null" INT TERM; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 $(2); b=$$?; \
	wait $$a; ra=$$?; echo "== $(3)"; cat $$log; rm -f $$log; \
	[ $$ra -eq 0 ] && [ $$b -eq 0 ]
endef

# `make test` = `make test-suites`, then `make test-tour` (both run; either failing fails it).
# test-suites: the broker, the notebook side (but for one file) and the state layer's crash
# property in one half, the rest in the other (the moved files even out the two halves).
FAST = not slow and not cluster and not browser and not native and not connect and not tour
TO_B = tests/notebook/test_session_mistakes.py
TO_A = tests/state/test_state_property.py tests/connect/test_ownership.py tests/runtime/test_topologies_invariant.py \
       tests/runtime/test_invariant.py tests/test_make_lab.py
PART_A = tests/broker $(filter-out $(TO_B),$(wildcard tests/notebook/test_*.py)) $(TO_A)
test:   # (each part bootstraps the venv and checks Java itself)
	@rc=0; $(MAKE) --no-print-directory test-suites || rc=1; $(MAKE) --no-print-directory test-tour || rc=1; exit $$rc

test-suites: $(STAMP) java archive bytecode
	$(call halves,-m "$(FAST)" $(PART_A),-m "$(FAST)" tests $(addprefix --ignore=,$(PART_A)),tests/broker$(comma) tests/notebook (but $(notdir $(TO_B))) and $(TO_A))

# test-tour: every notebook of the tour but 09, 13 and 15 (they have their own targets) top to
# bottom in a real kernel, in two halves of about the same length
comma := ,
TOUR_A = 16_ or 11_ or 02_ or 07_ or 01_ or 14_
test-tour: $(STAMP) java archive bytecode
	$(call halves,-m tour tests/notebook/test_notebooks.py -k "$(TOUR_A)",-m tour tests/notebook/test_notebooks.py -k "not ($(TOUR_A))",notebooks $(TOUR_A))

test-native: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "native and not cluster" -q

test-cluster: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "cluster and not browser" -q -s

test-connect: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "connect" -q -s tests/connect tests/notebook/test_notebooks.py

test-slow: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "slow" -q

test-browser: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "browser and not cluster" -q

# notebook 13 in JupyterLab, on the standalone cluster it starts (needs both: Chromium and ~2 GB)
test-browser-cluster: $(STAMP) java archive bytecode
	$(PY) -m pytest -m "browser and cluster" -q

# every bench at its defaults, each to its RESULT line; one that fails does not hide the others
bench: $(STAMP) java archive bytecode
	@failed=; for b in bench/*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed"; exit 1; fi

clean:
	rm -rf build .pytest_cache
