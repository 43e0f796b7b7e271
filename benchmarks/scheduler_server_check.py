"""Scheduling-round time of a real SGLang server with a long queue, with and without ``--schedule-policy outlets``.

``benchmarks/scheduler_overhead.py`` times the plugin's functions in isolation; this checks the
whole scheduler loop. A real CPU server (SGLang 0.5.23, the tiny random Llama of
``specforge_outlets.model.tiny_chat_target``, so that the model's forward is short and the
scheduler's own work shows) gets one batch request of
``--requests`` prompts at once, each generating one token, with ``--max-prefill-tokens`` so small
that a round admits one to three prompts: the waiting queue starts near ``--requests`` and drains
over thousands of rounds. Rounds are counted from the scheduler's log lines and timed by the
server's response stamps (``response_sent_to_client_ts``). Reported per policy: the mean round time
while at least ``--min-queue`` requests were waiting, and over the whole drain; and, from a test-only
timing plugin (``specforge_outlets/studies/sglang_plugins/timing/``), the mean time of the scheduler's
``get_new_batch_prefill`` (the order, with the OUTLETS hook inside it, and the admission) at that
queue length, which separates the order's cost from per-request costs elsewhere. Every request carries a predicted length
(``custom_params``), which stock policies ignore.

    .venv-serve/bin/python benchmarks/scheduler_server_check.py --output benchmarks/data/scheduler-overhead
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from typing import Dict, List

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.loadgen.sglang_server import SGLangServer
from specforge_outlets.model.tiny_chat_target import make_chat_target  # the tests' tiny random Llama
from specforge_outlets.studies import sglang_plugins

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

POLICIES: Dict[str, List[str]] = {
    "fcfs": ["--schedule-policy", "fcfs"],
    "lof": ["--schedule-policy", "lof"],
    "outlets tail-safe": ["--schedule-policy", "outlets"],
    "outlets sjf": ["--schedule-policy", "outlets", "--outlets-order", "sjf"],
}
SERVER_ARGS = ["--max-prefill-tokens", "64", "--chunked-prefill-size", "64", "--max-running-requests", "4",
               "--disable-radix-cache", "--max-total-tokens", "8192", "--skip-server-warmup", "--sleep-on-idle"]


def drain(server: SGLangServer, requests: int, seed: int) -> List[float]:
    """Send ``requests`` one-token prompts in one batch; their server-side finish stamps, sorted."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(["hello", "world", "quick", "brown", "fox"]) for _ in range(rng.randint(8, 24)))
             for _ in range(requests)]
    params = [{"max_new_tokens": 1, "ignore_eos": True, "temperature": 0,
               "custom_params": {"outlets_predicted_output_len": round(rng.lognormvariate(5.3, 1.0), 1)}}
              for _ in range(requests)]
    responses = server.post("/generate", {"text": texts, "sampling_params": params}, timeout=1800)
    stamps = [response["meta_info"].get("response_sent_to_client_ts") for response in responses]
    if any(stamp is None for stamp in stamps):
        raise RuntimeError("the server's responses carry no response_sent_to_client_ts")
    return sorted(stamps)


def round_times(stamps: List[float], queue_lengths: List[int], requests: int, min_queue: int) -> Dict[str, float]:
    """Mean round time over the drain and while at least ``min_queue`` requests waited.

    A round's prefill batch can hold pieces of several prompts, so rounds are counted from the
    scheduler's own "Prefill batch" log lines (which print the waiting queue after admission) and
    timed by the server's finish stamps: while the queue held ``min_queue`` or more, about
    ``requests - min_queue`` requests finished.
    """
    long_rounds = sum(1 for length in queue_lengths if length >= min_queue)
    long_window = stamps[requests - min_queue - 1] - stamps[0]
    return {"rounds": len(queue_lengths), "longest queue": max(queue_lengths), "rounds at long queue": long_rounds,
            "ms per round at long queue": 1e3 * long_window / long_rounds if long_rounds else float("nan"),
            "ms per round overall": 1e3 * (stamps[-1] - stamps[0]) / len(queue_lengths),
            "drain s": stamps[-1] - stamps[0]}


def queue_lengths(log_text: str) -> List[int]:
    return [int(match) for match in re.findall(r"Prefill batch.*?#queue-req: (\d+)", log_text)]


def prefill_scheduling_ms(log_text: str, min_queue: int) -> Dict[str, float]:
    """Mean time of SGLang's get_new_batch_prefill (ordering + admission) and of the sort in it (OUTLETS' or lof's), from the harness timer's lines."""
    blocks = [(float(ms), int(queue), float(order)) for ms, queue, order in
              re.findall(r"HARNESS prefill scheduling: calls=\d+ mean_ms=([\d.]+) queue=(\d+) order_ms=([\d.]+)",
                         log_text)]
    long = [(ms, order) for ms, queue, order in blocks if queue >= min_queue]
    return {"prefill scheduling ms at long queue": sum(ms for ms, _ in long) / len(long) if long else float("nan"),
            "sort ms at long queue": sum(order for _, order in long) / len(long) if long else float("nan"),
            "prefill scheduling blocks at long queue": len(long)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "data", "scheduler-overhead"))
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--min-queue", type=int, default=2000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="outlets-server-check-")
    target = make_chat_target(os.path.join(work, "target"))
    rows = []
    for repetition in range(args.repetitions):  # interleaved: a fresh server per policy and repetition
        for name in args.policies:
            log = os.path.join(work, f"{name.replace(' ', '-')}-{repetition}.log")
            with SGLangServer(target, POLICIES[name] + SERVER_ARGS, log_path=log, pythonpath=[sglang_plugins.TIMING],
                              env={"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}, cwd=REPO) as server:
                server.generate("warm up", max_new_tokens=1)
                before = len(server.log_text())
                stamps = drain(server, args.requests, seed=repetition)
                drained = server.log_text()[before:]
            row = {"policy": name, "repetition": repetition,
                   **round_times(stamps, queue_lengths(drained), args.requests, args.min_queue),
                   **prefill_scheduling_ms(drained, args.min_queue)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    # the command as run but for where it wrote: the file says where it is, and a machine's path is not recorded
    given = re.sub(r"\s*--output(=|\s+)\S+", "", " ".join(sys.argv[1:]))
    result = {"command": f"python benchmarks/scheduler_server_check.py {given}".rstrip(),
              "server_args": SERVER_ARGS, "requests": args.requests, "min_queue": args.min_queue, "rows": rows}
    path = write_text_atomic(os.path.join(args.output, "server_check.json"), json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
