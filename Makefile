# Two entry points for a fresh machine; each installs what it needs into .venv.
#   make demo   run the example job through preemptions on the simulated market
#   make test   run the whole test suite (also what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "spotd needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/spotd demo

test: $(VENV)/.test
	$(BIN)/python -m pytest -q

lint: $(VENV)/.test
	$(BIN)/python -m pytest -q tests/test_quality.py

clean:
	rm -rf $(VENV) build dist *.egg-info
