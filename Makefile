# Two entry points for a fresh machine; each installs what it needs into .venv.
#   make demo      run the example job through preemptions on the simulated market
#   make demo-ddp  the same with a real 2-node x 2-process PyTorch job (installs torch)
#   make test      run the whole test suite (also what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

# torch first, pinned: any other torch from the registry is a CUDA build of several GB,
# while this one is a CPU build these machines keep on disk.
TORCH  ?= torch==2.13.0

.PHONY: demo demo-ddp test lint bench clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "spotd needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.train: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[train]'
	touch $@ $(VENV)/.core

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.core $(VENV)/.train

demo: $(VENV)/.core
	$(BIN)/spotd demo

demo-ddp: $(VENV)/.train
	$(BIN)/spotd demo --example ddp

# Some tests need programs from the system: the container test runs a job in a
# locally built image through podman, the report test renders the HTML report
# in headless Chromium, and the dashboard's browser test drives Chromium through
# Debian's chromedriver (Selenium is told its path: it downloads nothing). Where
# this is root with apt-get, as on CI, the missing ones are installed from
# Debian's packages; elsewhere those tests are skipped with the reason. Failure
# here stops nothing.
$(VENV)/.engine: | $(BIN)/python
	-@want=""; \
	command -v podman >/dev/null 2>&1 || want="$$want podman runc"; \
	command -v chromium >/dev/null 2>&1 || want="$$want chromium"; \
	command -v chromedriver >/dev/null 2>&1 || want="$$want chromium-driver"; \
	if [ -n "$$want" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$want for the container and browser tests"; \
	  apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$want >/dev/null; \
	fi
	touch $@

# Workers: most tests wait on processes and sockets, so more workers than cores pay.
WORKERS ?= 3

test: $(VENV)/.test $(VENV)/.engine
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist worksteal

lint: $(VENV)/.test
	$(BIN)/python -m pytest -q tests/test_quality.py

clean:
	rm -rf $(VENV) build dist *.egg-info
