"""Test harness: a real SGLang server on the CPU for the tests, on the package's launcher.

Not part of the plugin. ``specforge_outlets.loadgen.sglang_server`` starts and stops the server (in
the serve environment, ``python -m sglang.launch_server`` in its own process group) and sends it
requests; this module adds what the tests need on a CPU-only machine: the stub modules SGLang
imports (``stubs/``) and the checkout on ``PYTHONPATH``, small fixed server settings, an environment
without the caller's ``OUTLETS_*`` variables, a fault switch (``faults/``), and the CPU and timing
plugins the studies use too (``specforge_outlets.studies.sglang_plugins``).
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

from specforge_outlets.loadgen.sglang_server import SGLangServer as _Server
from specforge_outlets.loadgen.sglang_server import omp_bind_groups  # noqa: F401  (the tests' import path)
from specforge_outlets.studies.sglang_plugins import EAGLE3_CPU, PD_CPU, TIMING

HARNESS = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HARNESS, "stubs")
FAULTS = os.path.join(HARNESS, "faults")
REPO = os.path.dirname(os.path.dirname(HARNESS))
START_TIMEOUT_S = float(os.environ.get("OUTLETS_TEST_SERVER_START_TIMEOUT", "300"))
# The tiny targets hold 512 positions, but the tests send predictions of up to 5,000 tokens (the long class, the
# router's loads), and the plugin refuses a prediction above the model's context length: every test server declares
# a longer context (SGLang allows one above the config's with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN; the tests'
# requests stay within 512 positions, so what the model computes does not change).
HARNESS_CONTEXT_LEN = 8192
# small, fixed settings of every test server; an idle scheduler sleeps instead of polling, so servers
# kept for later tests leave the CPU to the one under test
HARNESS_ARGS = ["--max-total-tokens", "4096", "--skip-server-warmup", "--sleep-on-idle",
                "--context-length", str(HARNESS_CONTEXT_LEN)]


def server_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([STUBS, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"  # HARNESS_CONTEXT_LEN
    for key in [key for key in env if key.startswith("OUTLETS_") and key not in ("OUTLETS_TEST_SERVER_START_TIMEOUT",)]:
        del env[key]  # only what the test passes
    env.update(extra or {})
    return env


class SGLangServer(_Server):
    """The package's server with the CPU harness: ``SGLangServer(model, ["--schedule-policy", "outlets"])``.

    ``cwd``: where relative paths in ``args`` resolve (the checkout by default)."""

    def __init__(self, model_path: str, args: List[str] = (), env: Optional[Dict[str, str]] = None,
                 log_path: Optional[str] = None, python: str = sys.executable,
                 fail_prompt: Optional[List[int]] = None, time_rounds: bool = False,
                 eagle3_cpu: bool = False, pd_cpu: bool = False, cwd: str = REPO) -> None:
        env = server_env(env)
        plugins = []
        if fail_prompt:  # the OUTLETS draft raises for prompts starting with these ids (faults/sitecustomize.py)
            env["OUTLETS_HARNESS_FAIL_PROMPT"] = ",".join(str(token) for token in fail_prompt)
            plugins.append(FAULTS)
        if time_rounds:  # a plugin logs the prefill scheduling time per round (timing/)
            plugins.append(TIMING)
        if eagle3_cpu:  # a plugin fills the gaps of SGLang's EAGLE-3 on torch_native (eagle3_cpu/)
            plugins.append(EAGLE3_CPU)
        if pd_cpu:  # a plugin lets a prefill instance send KV over mooncake_tcp on CPU (pd_cpu/)
            plugins.append(PD_CPU)
        super().__init__(model_path, [*HARNESS_ARGS, *args], env=env, log_path=log_path, python=python,
                         pythonpath=plugins[::-1], start_timeout_s=START_TIMEOUT_S, cwd=cwd)
        # The launcher starts from this process's environment, where an in-process parse of the
        # plugin's flags (test_sglang_plugin.py) leaves OUTLETS_* settings: only the test's own count.
        self.env = {key: value for key, value in self.env.items() if not key.startswith("OUTLETS_") or key in env}


def completion_order(results: List[dict]) -> List[int]:
    """Indices in the order the server finished them (its own send timestamp, else arrival here)."""
    def finished(index: int) -> float:
        meta = results[index]["response"]["meta_info"]
        return meta.get("response_sent_to_client_ts") or results[index]["done"]

    return sorted(range(len(results)), key=finished)


def start_server(model_path: str, log_dir: str, args: List[str], env: Optional[Dict[str, str]] = None,
                 **harness) -> SGLangServer:
    """A started :class:`SGLangServer` logging to ``log_dir``; ``harness``: its test-only switches."""
    server = SGLangServer(model_path, args, env=env, log_path=os.path.join(log_dir, "server.log"), **harness).start()
    print(f"server {args} healthy after {server.start_seconds:.1f} s")
    return server
