"""Regeneration with llama.cpp's ``llama-server`` on GGUF targets: the fast CPU engine.

The embedded target ships as a Q4_1 GGUF file, and llama.cpp is the engine made for it: on two
cores it generates several times the tokens per second of the ``hf`` backend (docs/data.md, "The two
local engines side by side"). The
pipeline starts its own server (:class:`LlamaServer`) and stops it when the run ends, so a user
runs one command.

Label semantics are the ``hf`` backend's, not llama.cpp's defaults:
- prompts are tokenised here, through the target's chat template, and sent as token ids, so both
  engines see the same prompt tokens;
- the turn ends at the token that closes an assistant turn in the chat template (``<|im_end|>``
  for SmolLM2, whose GGUF metadata names ``<|im_start|>`` as EOS): the server is started with
  that token as its EOS, and a response is finished only when its last token is a stop token;
- a response cut at ``max_new_tokens`` is censored (``finish_reason: "length"``);
- sampling is transformers' ``generate``: repetition penalty over the whole context, then
  temperature, top-k 50 (transformers' default), top-p; llama.cpp's extra samplers (min-p, DRY,
  XTC, typical) are off;
- the seed of each request is derived from ``--seed`` and the prompt itself, so a rerun or a
  resumed run draws the same sample for the same prompt whatever the concurrency, and runs with
  different ``--seed`` values draw independent samples.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import requests

from specforge_outlets.data.chat_tokens import generation_prompt_ids
from specforge_outlets.data.generation import (
    Messages, SamplingSettings, TurnError, TurnResult, complete_each, context_overflow, turn_from_tokens,
)
from specforge_outlets.data.targets import SMOLLM2_ALIAS, cache_root, ensure_smollm2, smollm2_gguf_path, stop_token_ids
from specforge_outlets.errors import OutletsError

# The llama.cpp release whose sources `scripts/build-llama-server.sh` builds (from the
# llama-cpp-python sdist that vendors them).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# transformers' generate() samples from the top 50 tokens unless told otherwise; so do we.
HF_DEFAULT_TOP_K = 50
# Seconds to wait for the server to load the model and answer /health.
STARTUP_TIMEOUT_S = 120.0
# Lines of the server's log quoted in an error.
LOG_TAIL_LINES = 15
# Seconds one request may take before the server is taken to hang: a 2,048-token answer from one
# of 16 slots on a shared CPU core took over 10 minutes here.
REQUEST_TIMEOUT_S = 7200.0
# Cores the server leaves to other processes unless told otherwise: llama.cpp's threads wait for
# each other at every step of the model, spinning, so a thread whose core another process takes
# stalls them all; on two cores one busy process made regeneration over ten times slower
# (benchmarks/data/llama-busy-core/).
SPARE_CORES = 1
# llama-server's --poll: 0, threads sleep while they wait for work instead of spinning (llama.cpp
# polls at 50 by default), so the server takes no core it is not computing on.
POLL_LEVEL = 0


class EngineError(OutletsError):
    """The generation engine is unreachable or died: fatal for the run, which resumes later."""


@dataclass(frozen=True)
class GGUFTarget:
    """A GGUF weight file with the tokenizer that renders its chat template and its stop tokens."""

    gguf: Path
    tokenizer: Any
    stop_ids: List[int]
    context: int  # tokens of prompt + response the model was trained for

    @property
    def end_id(self) -> int:
        return self.stop_ids[0]

    def prompt_ids(self, messages: Messages) -> List[int]:
        return generation_prompt_ids(self.tokenizer, messages)


def load_gguf_target(target: str) -> GGUFTarget:
    """``smollm2-135m`` or a ``.gguf`` file; refused unless its chat template closes a turn.

    The check runs before any prompt is sent: a target without a chat template or an end-of-turn
    token would label every response with the token limit.
    """
    from transformers import AutoTokenizer

    from specforge_outlets.data.targets import fix_chatml_eos

    if target == SMOLLM2_ALIAS:
        gguf = smollm2_gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    elif target.endswith(".gguf") and os.path.isfile(target):
        gguf = Path(target)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if "<|im_end|>" in tokenizer.get_vocab():
            fix_chatml_eos(tokenizer)
    else:
        raise OutletsError(
            f"--target {target}: the llama backend takes a .gguf file or {SMOLLM2_ALIAS}; "
            "for a Hugging Face directory use --backend hf"
        )
    check_chat_template(tokenizer, gguf.name)
    return GGUFTarget(gguf, tokenizer, stop_token_ids(tokenizer), gguf_context_length(gguf))


def check_chat_template(tokenizer: Any, name: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise OutletsError(
            f"--target {name}: no chat template (tokenizer.chat_template in the GGUF metadata); "
            "the end of an assistant turn cannot be told, so every label would be wrong"
        )


def gguf_context_length(gguf: Path) -> int:
    """``<architecture>.context_length`` from the GGUF metadata."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    field = reader.fields.get(f"{arch}.context_length")
    if field is None:
        raise OutletsError(f"{gguf}: no {arch}.context_length in the GGUF metadata")
    return int(field.parts[field.data[0]][0])


def llama_server_binary() -> str:
    """``$OUTLETS_LLAMA_SERVER``, the build of `scripts/build-llama-server.sh`, or ``llama-server`` on PATH."""
    build = cache_root() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"
    candidates = [os.environ.get("OUTLETS_LLAMA_SERVER"), str(build / "bin" / "llama-server"), shutil.which("llama-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    from specforge_outlets.resources import script

    raise EngineError(
        f"llama-server not found: build it once (about 10 minutes; needs cmake and a C++ compiler) with "
        f"`PYTHON={sys.executable} bash {script('build-llama-server.sh')} {build}` "
        "(in a checkout `make install` does it), or set OUTLETS_LLAMA_SERVER to a llama-server binary"
    )


def default_threads() -> int:
    """Threads for the server: the cores this process may run on, less ``SPARE_CORES``, at least one.

    A run that keeps a core free keeps its speed when another process takes one.
    """
    return max(1, len(os.sched_getaffinity(0)) - SPARE_CORES)


class LlamaServer:
    """A ``llama-server`` process of our own: started on a free local port, stopped on exit.

    Each of ``slots`` parallel sequences gets the model's full context, so a prompt that the
    ``hf`` backend accepts is accepted here too.
    """

    def __init__(self, target: GGUFTarget, slots: int, threads: int, log_path: str, poll: int = POLL_LEVEL) -> None:
        self.target, self.slots, self.threads, self.log_path, self.poll = target, slots, threads, log_path, poll
        self.process: Optional[subprocess.Popen] = None
        self.url = ""

    def __enter__(self) -> "LlamaServer":
        port = _free_port()
        command = [
            llama_server_binary(), "-m", str(self.target.gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(self.threads), "--poll", str(self.poll), "-np", str(self.slots), "-c", str(self.slots * self.target.context),
            "--no-kv-unified", "--override-kv", f"tokenizer.ggml.eos_token_id=int:{self.target.end_id}",
            "--cache-ram", "0",  # no host prompt cache (8 GiB by default): prompts here share no prefixes
        ]  # fmt: skip
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a", encoding="utf-8")  # a resumed run keeps the earlier runs' logs
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        log.flush()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + STARTUP_TIMEOUT_S
        while time.time() < deadline:
            self.check_alive()
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.25)
        self.__exit__(None, None, None)
        raise EngineError(f"llama-server did not become ready within {STARTUP_TIMEOUT_S:g} s; {self.log_tail()}")

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise EngineError(
                f"llama-server exited with code {self.process.returncode}; {self.log_tail()}; "
                "rerun with --resume to continue where the run stopped"
            )

    def log_tail(self) -> str:
        try:
            lines = Path(self.log_path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        tail = "\n".join(lines[-LOG_TAIL_LINES:])
        return f"its log is {self.log_path}:\n{tail}"


class LlamaBackend:
    """Answers chat histories through a running :class:`LlamaServer` (one request per history)."""

    def __init__(self, server: LlamaServer, settings: SamplingSettings, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.server, self.settings, self.timeout = server, settings, timeout
        self.target = server.target

    def complete(self, batch: Sequence[Messages]) -> List[Union[TurnResult, TurnError]]:
        return complete_each(self.complete_one, batch)

    def complete_one(self, messages: Messages) -> TurnResult:
        prompt = self.target.prompt_ids(messages)
        overflow = context_overflow(len(prompt), self.settings.max_new_tokens, self.target.context)
        if overflow is not None:
            raise overflow
        try:
            response = requests.post(
                f"{self.server.url}/completion", json=self.request_body(prompt), timeout=self.timeout
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            self.server.check_alive()
            raise EngineError(
                f"llama-server at {self.server.url} did not answer ({exc.__class__.__name__}); "
                f"{self.server.log_tail()}; rerun with --resume"
            ) from exc
        if response.status_code != 200:
            raise TurnError(f"llama-server HTTP {response.status_code}: {response.text[:300]}")
        return self.parse(response.json())

    def request_body(self, prompt: List[int]) -> Dict[str, Any]:
        settings = self.settings
        greedy = settings.temperature <= 0
        return {
            "prompt": prompt,
            "n_predict": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_k": 1 if greedy else HF_DEFAULT_TOP_K,
            "top_p": 1.0 if greedy else settings.top_p,
            "min_p": 0.0,
            "repeat_penalty": settings.repetition_penalty,
            "repeat_last_n": self.target.context,  # the whole context, as transformers does
            "samplers": ["penalties", "temperature", "top_k", "top_p"],
            "seed": request_seed(settings.seed, prompt),
            "return_tokens": True,
            "cache_prompt": True,
        }

    def parse(self, payload: Dict[str, Any]) -> TurnResult:
        try:
            tokens = [int(token) for token in payload["tokens"]]
            stop_type = payload["stop_type"]
        except (KeyError, TypeError, ValueError) as exc:
            raise TurnError(f"malformed llama-server answer ({exc!r}): {str(payload)[:200]}") from exc
        stop_ids, limit = self.target.stop_ids, self.settings.max_new_tokens
        ended = any(token in stop_ids for token in tokens)
        if not ended and (stop_type != "limit" or len(tokens) < limit):
            raise TurnError(
                f"llama-server stopped ({stop_type!r}) after {len(tokens)} tokens without an end-of-turn "
                f"token {stop_ids} and below --max-new-tokens {limit}"
            )
        return turn_from_tokens(tokens, stop_ids, limit,
                                lambda ids: self.target.tokenizer.decode(ids, skip_special_tokens=True))


def request_seed(seed: int, prompt: Sequence[int]) -> int:
    """A 31-bit seed from the run's seed and the prompt: same prompt and seed, same sample."""
    return zlib.crc32(f"{seed}:{','.join(map(str, prompt))}".encode()) & 0x7FFFFFFF


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM when the run dies, even by a signal that skips our cleanup."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
