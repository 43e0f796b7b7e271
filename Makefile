# Every install step of the project lives here. `make demo` and `make test` build the CPU
# environment in .venv on first use (torch 2.13.0 CPU build, SpecForge 0.2.0 without its CUDA
# pins) and llama.cpp's llama-server, then run; `make test` also builds the serve environment (.venv-serve: SGLang 0.5.23 +
# the sglang_patches plugin, CPU torch 2.13.0) and runs the plugin's tests against real CPU servers.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.outlets-installed
# Serve environment: SGLang 0.5.23 + the plugin (sglang_patches), CPU build of torch. Its own venv:
# SGLang pins torch/transformers versions that differ from the training environment's.
SERVE_VENV ?= .venv-serve
SERVE_PY := $(SERVE_VENV)/bin/python
SERVE_PIP := $(SERVE_PY) -m pip --disable-pip-version-check -q
SERVE_STAMP := $(SERVE_VENV)/.outlets-serve-installed
SERVE_TESTS := tests/test_sglang_plugin.py tests/test_sglang_server.py tests/test_sglang_dp.py tests/test_sglang_predictor.py \
	tests/test_sglang_eagle3_draft.py tests/test_sglang_kernel_reference.py tests/test_sglang_eagle3_mode.py tests/test_sglang_admission.py \
	tests/test_sglang_load_endpoint.py tests/test_sglang_client_predictions.py tests/test_sglang_documented_path.py \
	tests/test_sglang_router.py tests/test_sglang_pd.py tests/test_sglang_quantiles.py tests/test_sglang_quantiles_server.py \
	tests/test_sglang_pd_admission.py

.PHONY: install llama-server serve-env demo test test-serve clean

install: $(STAMP) llama-server

# llama.cpp's server, the `llama` regeneration backend (the CPU default): built from the source
# vendored in the llama-cpp-python sdist into ~/.cache/specforge-outlets, once per machine (~10 min).
llama-server: $(STAMP)
	PYTHON=$(PY) bash scripts/build-llama-server.sh

$(STAMP): setup.py requirements/cpu.txt requirements/cpu-nodeps.txt requirements/constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c requirements/constraints-cpu.txt -r requirements/cpu.txt
	$(PIP) install --no-deps -r requirements/cpu-nodeps.txt
	$(PIP) install --no-deps -e .
	touch $(STAMP)

# The test harness's stand-ins for torchvision and sgl_kernel (tests/sglang_harness/README.md)
# go on the serve venv's path through a .pth file; the plugin itself never needs them.
serve-env: $(SERVE_STAMP)

# Debian's libibverbs1 first: mooncake's transfer engine (serve-nodeps.txt) links it even for TCP.
$(SERVE_STAMP): setup.py requirements/serve-cpu.txt requirements/serve-nodeps.txt requirements/constraints-serve.txt
	ldconfig -p | grep -q libibverbs.so.1 || apt-get install -y -qq --no-install-recommends libibverbs1 \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends libibverbs1)
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_PIP) install -c requirements/constraints-serve.txt -r requirements/serve-cpu.txt
	$(SERVE_PIP) install --no-deps -r requirements/serve-nodeps.txt
	$(SERVE_PIP) install --no-deps -e .
	echo "$(CURDIR)/tests/sglang_harness/stubs" > "$$($(SERVE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outlets-harness-stubs.pth"
	touch $(SERVE_STAMP)

demo: install
	$(VENV)/bin/outlets demo

test: install serve-env
	$(PY) -m pytest -q tests
	$(SERVE_PY) -m pytest -q $(SERVE_TESTS)

# The SGLang plugin's tests alone (real CPU servers; about 5 minutes).
test-serve: serve-env
	$(SERVE_PY) -m pytest -q $(SERVE_TESTS)

clean:
	rm -rf $(VENV) $(SERVE_VENV) runs cache
