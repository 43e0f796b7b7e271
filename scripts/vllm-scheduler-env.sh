#!/usr/bin/env bash
# Builds a throwaway environment in which vLLM 0.34.0's own Scheduler imports on the CPU, and runs
# tests/test_vllm_admission_against_vllm.py in it (kv_admission: vllm against vLLM's code, step by
# step). vLLM is no dependency of the project: the environment sits over the training one (.venv,
# torch 2.13.0 CPU, through a .pth file) and adds vLLM's wheel without its dependencies (torch 2.14,
# CUDA) plus the small packages its scheduler's imports need. About 630 MB in DEST (default
# /tmp/vllm-scheduler-env); the test takes about 20 s on one core.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-/tmp/vllm-scheduler-env}"
TRAINING_PY="${REPO}/.venv/bin/python"
if [ ! -x "${DEST}/bin/python" ]; then
  "${TRAINING_PY}" -m venv "${DEST}"
  "${TRAINING_PY}" -c 'import site; print(site.getsitepackages()[0])' \
    > "$("${DEST}/bin/python" -c 'import site; print(site.getsitepackages()[0])')/outlets-training-env.pth"
  "${DEST}/bin/python" -m pip --disable-pip-version-check -q install --no-deps vllm==0.34.0 \
    pyzmq==27.3.0 msgspec==0.23.0 cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 pybase64==1.5.1 \
    py-cpuinfo==9.0.0 prometheus_client==0.26.0 uvloop==0.23.0 einops==0.8.2 llguidance==1.9.1 \
    xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 \
    attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1
fi
cd "${REPO}"
VLLM_TARGET_DEVICE=cpu "${DEST}/bin/python" -m pytest -q -p no:cacheprovider tests/test_vllm_admission_against_vllm.py
