"""SGLang's router (sglang-router, ``python -m sglang_router.launch_router``) in its own process, on loopback.

The router of docs/serving.md step 7, started the same way by the tests that run the plugin behind it
and by the PD benchmark: free ports for it and its Prometheus exporter (the exporter's fixed default
port makes a second router on one machine panic), a log file, and a wait for ``GET /health``. It
imports nothing from the router; the serve environment has it installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional, Sequence

from specforge_outlets.loadgen.sglang_server import free_port

DEFAULT_START_TIMEOUT_S = 60.0
LOAD_POLL_INTERVAL_S = 1  # --worker-startup-check-interval: how often power_of_two re-reads /get_load (its minimum)


class SGLangRouter:
    """``with SGLangRouter(["--worker-urls", url, "--policy", "power_of_two"]) as router: post(router.url, ...)``"""

    def __init__(self, args: Sequence[str], python: str = sys.executable, log_path: Optional[str] = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self.python, self.args = python, list(args)
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.url: Optional[str] = None  # known once started
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "SGLangRouter":
        # Ports taken now, not at construction: servers started in between pick ports of their own.
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.command = [self.python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                        "--prometheus-port", str(free_port()), *self.args]
        self.log_path = self.log_path or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sglang-router-{port}.log")
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=5).read()
                return self
            except (urllib.error.URLError, ConnectionError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    with open(self.log_path, errors="replace") as handle:
                        raise RuntimeError(f"sglang-router did not start ({' '.join(self.command)}):\n"
                                           f"{handle.read()[-3000:]}") from None
                time.sleep(0.5)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        self.process = None

    def __enter__(self) -> "SGLangRouter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def pd_router_args(prefill_url: str, bootstrap_port: int, decode_urls: Sequence[str], decode_policy: str,
                   poll_s: int = LOAD_POLL_INTERVAL_S) -> list:
    """The router's arguments for one prefill and several decode instances (PD mode)."""
    return ["--pd-disaggregation", "--prefill", prefill_url, str(bootstrap_port),
            *[arg for url in decode_urls for arg in ("--decode", url)],
            "--decode-policy", decode_policy, "--worker-startup-check-interval", str(poll_s)]
