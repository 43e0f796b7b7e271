"""Start a real SGLang server, wait until it serves, send it requests on 127.0.0.1, stop it.

The one launcher of the tests (``tests/sglang_harness/server.py`` adds the CPU test harness on top)
and of the benchmarks that drive real servers. The server is ``python -m sglang.launch_server`` run
by ``python``, the serving environment's interpreter (SGLang is not in the training environment),
in its own process group, so that stopping it ends its scheduler, detokenizer and data-parallel
controller processes too. It imports nothing from SGLang itself.

On ``device="cpu"`` the server gets SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu
--attention-backend torch_native``); on a GPU, SGLang's own defaults. ``pythonpath`` puts directories
ahead on the server's path, e.g. a test-only SGLang plugin.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence

CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native"]
DEFAULT_START_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def omp_bind_groups(ranks: int) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for ``ranks`` CPU ranks: the cores split evenly (``0|1`` on 2 cores)."""
    cores = list(range(os.cpu_count() or 1))
    if len(cores) < ranks:
        cores = cores * ranks
    size = len(cores) // ranks
    groups = [cores[i * size:(i + 1) * size] for i in range(ranks)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


class SGLangServer:
    """``with SGLangServer(model, ["--schedule-policy", "outlets"]) as server: server.generate(...)``"""

    def __init__(self, model_path: str, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                 log_path: Optional[str] = None, python: str = sys.executable, device: str = "cpu",
                 pythonpath: Sequence[str] = (), start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 cwd: Optional[str] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [python, "-m", "sglang.launch_server", "--model-path", model_path,
                        *(CPU_ARGS if device == "cpu" else []), "--host", "127.0.0.1", "--port", str(self.port),
                        *args]
        self.env = dict(os.environ)
        if device == "cpu":
            self.env["SGLANG_USE_CPU_ENGINE"] = "1"
        self.env.update(env or {})
        if pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(
                [*pythonpath] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else []))
        self.log_path = log_path or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sglang-{self.port}.log")
        self.start_timeout_s = start_timeout_s
        self.cwd = cwd
        self.process: Optional[subprocess.Popen] = None
        self.start_seconds: Optional[float] = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "SGLangServer":
        started = time.monotonic()
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=self.cwd)
        deadline = started + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health_generate", timeout=5) as response:
                    if response.status == 200:
                        self.start_seconds = time.monotonic() - started
                        return self
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"SGLang server not healthy after {self.start_timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            pgid = self.process.pid  # start_new_session: the server leads its own process group
            try:
                os.killpg(pgid, signal.SIGTERM)
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        self._log.close()
        self.process = None

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    # -- requests --------------------------------------------------------------------------
    def post(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def get(self, path: str, timeout: float = 30) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as response:
            return response.read().decode()

    def stream(self, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> List[dict]:
        """POST a ``/generate`` body with ``stream: true``; every chunk the server sent, in order."""
        request = urllib.request.Request(f"{self.url}/generate", data=json.dumps({**body, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        chunks = []
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for line in response:
                line = line.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data:"):]))
        return chunks

    def generate(self, text=None, *, input_ids=None, max_new_tokens: int = 4, predicted_output_len=None,
                 timeout: float = REQUEST_TIMEOUT_S, **sampling) -> dict:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, **sampling}
        if predicted_output_len is not None:
            params["custom_params"] = {"outlets_predicted_output_len": predicted_output_len}
        body = {"sampling_params": params}
        if input_ids is not None:
            body["input_ids"] = input_ids
        else:
            body["text"] = text
        return self.post("/generate", body, timeout=timeout)

    def burst(self, requests: List[dict], gap_s: float = 0.1, timeout: float = REQUEST_TIMEOUT_S) -> List[dict]:
        """Send requests concurrently, ``gap_s`` apart (arrival order = list order).

        Each item: kwargs of :meth:`generate`. Returns, per request, its response and the
        monotonic times it was sent (``sent``) and its response arrived (``done``)."""
        results: List[Optional[dict]] = [None] * len(requests)
        errors: List[BaseException] = []

        sent: List[float] = [0.0] * len(requests)

        def run(index: int, kwargs: dict) -> None:
            try:
                sent[index] = time.monotonic()
                response = self.generate(timeout=timeout, **kwargs)
                results[index] = {"response": response, "done": time.monotonic(), "sent": sent[index]}
            except BaseException as error:  # reported below
                errors.append(error)

        threads = []
        for index, kwargs in enumerate(requests):
            thread = threading.Thread(target=run, args=(index, kwargs), daemon=True)
            thread.start()
            threads.append(thread)
            time.sleep(gap_s)
        for thread in threads:
            thread.join(timeout)
        if errors:
            raise errors[0]
        assert all(result is not None for result in results), "a request of the burst did not finish"
        return results
