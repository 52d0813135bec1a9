# statekit — every target bootstraps .venv with the pinned dependencies by itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.statekit-installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: lab demo test test-slow test-native test-cluster test-connect test-browser test-browser-cluster bench java clean venv

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

# root too (--allow-root, said in one line), the first free port from 8888, no browser without a
# display, the URL with its token printed last (scripts/lab.py); LAB_ARGS go to jupyter lab
lab: $(STAMP) java
	@echo "A workshop room on one Spark Connect server: \`.venv/bin/statekit spark serve\` (the teacher), then each participant sets SPARK_REMOTE to the URL it prints (README: A workshop on one server)."
	@$(PY) scripts/lab.py $(LAB_ARGS)

demo: $(STAMP) java
	$(PY) -m statekit.demo

# `make test`: two pytest processes side by side, one per core: the broker, the notebooks (but for
# one notebook-side file) and the state layer's crash property in one, the rest in the other (the
# moved files even out the two halves); the first one's report follows the second's. Slower suites
# have targets of their own.
FAST = not slow and not cluster and not browser and not native and not connect
TO_B = tests/notebook/test_session_mistakes.py
TO_A = tests/state/test_state_property.py tests/connect/test_ownership.py
PART_A = tests/broker $(filter-out $(TO_B),$(wildcard tests/notebook/test_*.py)) $(TO_A)
test: $(STAMP) java
	@log=$$(mktemp); \
	$(PY) -m pytest -m "$(FAST)" -q -p no:cacheprovider --durations=15 $(PART_A) >$$log 2>&1 & a=$$!; trap "kill $$a 2>/dev/null" INT TERM; \
	$(PY) -m pytest -m "$(FAST)" -q -p no:cacheprovider --durations=15 tests $(addprefix --ignore=,$(PART_A)); b=$$?; \
	wait $$a; ra=$$?; echo "== tests/broker, tests/notebook (but $(notdir $(TO_B))) and $(TO_A)"; cat $$log; rm -f $$log; \
	[ $$ra -eq 0 ] && [ $$b -eq 0 ]

test-native: $(STAMP) java
	$(PY) -m pytest -m "native and not cluster" -q

test-cluster: $(STAMP) java
	$(PY) -m pytest -m "cluster and not browser" -q -s

test-connect: $(STAMP) java
	$(PY) -m pytest -m "connect" -q -s tests/connect tests/notebook/test_notebooks.py

test-slow: $(STAMP) java
	$(PY) -m pytest -m "slow" -q

test-browser: $(STAMP) java
	$(PY) -m pytest -m "browser and not cluster" -q

# notebook 13 in JupyterLab, on the standalone cluster it starts (needs both: Chromium and ~2 GB)
test-browser-cluster: $(STAMP) java
	$(PY) -m pytest -m "browser and cluster" -q

# every bench at its defaults, each to its RESULT line; one that fails does not hide the others
bench: $(STAMP) java
	@failed=; for b in bench/*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed"; exit 1; fi

clean:
	rm -rf build .pytest_cache
