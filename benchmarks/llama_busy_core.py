"""llama-server's generation speed with one core taken by another process: old flags beside new.

``make demo`` on two cores slowed from seconds to 112 s a conversation while one other process held
a core: llama-server's threads, one per core, spin-wait for each other at every step, so the one
whose core is taken stalls the rest. This runs the same few short responses with the llama backend
under each server configuration, on a quiet machine and beside a busy process (a Python loop
pinned to core 0), in one run, and writes the wall time and tokens per second of each to
``--output`` (JSON and markdown).

    python benchmarks/llama_busy_core.py --output benchmarks/data/llama-busy-core   # minutes: the old flags beside a busy core take most
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

from specforge_outlets.data.generation import SamplingSettings, TurnError
from specforge_outlets.data.jsonl import recover_jsonl
from specforge_outlets.data.sources import builtin_prompts_path
from specforge_outlets.data.llama_backend import (
    LlamaBackend, LlamaServer, POLL_LEVEL, default_threads, load_gguf_target,
)
from specforge_outlets.data.targets import SMOLLM2_ALIAS

# The flags `regenerate` used before: one thread per core, llama.cpp's default polling (spinning).
LLAMA_CPP_DEFAULT_POLL = 50


@dataclass(frozen=True)
class ServerFlags:
    name: str
    threads: int
    poll: int


@dataclass
class Measurement:
    flags: str
    threads: int
    poll: int
    machine: str  # "quiet" or "one core busy"
    seconds: float
    tokens: int
    errors: int
    load_average: float  # the machine's 1-minute load average as the measurement started

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def spin(core: int) -> None:
    """The busy process: a pure-Python loop pinned to ``core``."""
    os.sched_setaffinity(0, {core})
    while True:
        pass


def generate(flags: ServerFlags, prompts: List[str], settings: SamplingSettings, log_dir: str) -> tuple[float, int, int]:
    """Seconds, tokens and failed requests to answer every prompt, all in flight together."""
    target = load_gguf_target(SMOLLM2_ALIAS)
    log = os.path.join(log_dir, f"{flags.name}.log")
    with LlamaServer(target, len(prompts), flags.threads, log, poll=flags.poll) as server:
        backend = LlamaBackend(server, settings)
        backend.complete([[{"role": "user", "content": prompts[0]}]])  # warm-up: model pages, first graph
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            answers = list(pool.map(lambda p: backend.complete([[{"role": "user", "content": p}]])[0], prompts))
        seconds = time.perf_counter() - started
    failed = [a for a in answers if isinstance(a, TurnError)]
    return seconds, sum(a.num_tokens for a in answers if not isinstance(a, TurnError)), len(failed)


def measure(configurations: List[ServerFlags], prompts: List[str], settings: SamplingSettings,
            busy_core: Optional[int], log_dir: str) -> List[Measurement]:
    machine = "quiet" if busy_core is None else f"core {busy_core} busy"
    spinner = None
    if busy_core is not None:
        spinner = multiprocessing.get_context("spawn").Process(target=spin, args=(busy_core,), daemon=True)
        spinner.start()
    try:
        results = []
        for flags in configurations:
            load = round(os.getloadavg()[0], 2)
            seconds, tokens, errors = generate(flags, prompts, settings, log_dir)
            results.append(Measurement(flags.name, flags.threads, flags.poll, machine, round(seconds, 2), tokens, errors, load))
            print(f"{machine:<12} {flags.name:<28} {seconds:7.1f} s  {tokens / seconds:7.1f} tok/s", flush=True)
        return results
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.join()


def markdown(results: List[Measurement], meta: Dict[str, object]) -> str:
    lines = [
        "# llama-server beside a busy core",
        "",
        f"{meta['prompts']} built-in prompts answered together ({meta['max_new_tokens']} new tokens at most, "
        f"greedy), SmolLM2-135M Q4_1, {meta['cpus']} CPUs; the busy process is a Python loop pinned to core 0, "
        "\"quiet\" runs without it. Load: the machine's 1-minute load average as the row started, other jobs on "
        "the machine included (above the CPU count, \"quiet\" is not idle). "
        "Written by `python benchmarks/llama_busy_core.py`.",
        "",
        "| server flags | threads | --poll | machine | load | seconds | tokens/s | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r.flags} | {r.threads} | {r.poll} | {r.machine} | {r.load_average:.2f} | {r.seconds:.1f} | {r.tokens_per_second:.1f} | {r.errors} |"
              for r in results]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="built-in prompts, answered together")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--output", default="runs/llama-busy-core")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    configurations = [
        ServerFlags("old: a thread per core, spinning", cores, LLAMA_CPP_DEFAULT_POLL),
        ServerFlags("a thread per core, no polling", cores, POLL_LEVEL),
        ServerFlags("a core spared, spinning", default_threads(), LLAMA_CPP_DEFAULT_POLL),
        ServerFlags("new: a core spared, no polling", default_threads(), POLL_LEVEL),
    ]
    rows = recover_jsonl(builtin_prompts_path())
    prompts = [row["prompt"] for row in rows[: args.prompts]]
    settings = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=0.0)
    meta = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "cpus": cores}
    with tempfile.TemporaryDirectory() as logs:
        results = measure(configurations, prompts, settings, None, logs)
        results += measure(configurations, prompts, settings, 0, logs)
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "result.json"), "w") as f:
        json.dump({**meta, "results": [{**asdict(r), "tokens_per_second": round(r.tokens_per_second, 1)}
                                       for r in results]}, f, indent=1)
    with open(os.path.join(args.output, "report.md"), "w") as f:
        f.write(markdown(results, meta))
    print(markdown(results, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
