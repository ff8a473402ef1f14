# The two commands a newcomer runs on a fresh machine:
#   make demo   -> set up, then run the main job on the embedded default (broker, state, synthetic world)
#   make test   -> set up, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned exactly: the CPU wheel of this machine; a looser pin pulls a multi-GB CUDA build
TORCH  ?= torch==2.13.0
# the real Helm library for the chart tests; it declares Python >= 3.12 and runs on 3.11
HELM_SDK ?= helm-sdkpy==0.1.32
WHEELS := $(wildcard /opt/wheels)
PIP    := $(BIN)/pip install -q $(if $(WHEELS),--find-links $(WHEELS))

.PHONY: setup demo test test-all bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) "$(TORCH)"
	$(PIP) -e '.[test]'
	$(PIP) --ignore-requires-python "$(HELM_SDK)"
	touch $@

demo: setup
	$(BIN)/hirflow demo

test: setup
	$(BIN)/python -m pytest

test-all: setup            # includes the slow soak/scale runs
	$(BIN)/python -m pytest -m ''

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf var .pytest_cache .hypothesis
