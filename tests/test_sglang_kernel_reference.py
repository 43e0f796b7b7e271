"""The test harness's torch references for SGLang's ``sgl_kernel`` CPU functions of the EAGLE-3 path equal
SGLang's own Triton kernels for the same jobs, run by Triton's CPU interpreter on random inputs
(tests/sglang_harness/kernel_check.py; serve environment). The EAGLE-3 server tests rely on them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang", reason="SGLang tests run in the serve environment (make test)")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_reference_equals_sglangs_kernel_on_random_cases():
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # before Triton is imported: a fresh process
    result = subprocess.run([sys.executable, "-m", "tests.sglang_harness.kernel_check", "24"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for check in ("check_slot_tables", "check_accept_outputs", "check_tree", "check_kv_copy"):
        assert f"{check}: 24 random cases equal" in result.stdout
