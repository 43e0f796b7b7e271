# Every install step of the project lives here. `make demo` and `make test` build the CPU
# environment in .venv on first use (torch 2.13.0 CPU build, SpecForge 0.2.0 without its CUDA
# pins), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.outlets-installed

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): setup.py requirements/cpu.txt requirements/cpu-nodeps.txt requirements/constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c requirements/constraints-cpu.txt -r requirements/cpu.txt
	$(PIP) install --no-deps -r requirements/cpu-nodeps.txt
	$(PIP) install --no-deps -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/outlets demo

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs cache
