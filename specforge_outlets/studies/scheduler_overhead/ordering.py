"""Ordering, per scheduling round: the plugin's sort of the waiting list against SGLang's own sort helpers."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Dict, List

from specforge_outlets.studies.scheduler_overhead.requests import ROUNDS, RequestFactory, churn, timed

QUEUE_SIZES = (100, 1000, 4000, 16000)


def orderings() -> Dict[str, Callable[[list], None]]:
    """Each policy's per-round work on a waiting list, as SGLang 0.5.23 and the plugin run it."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    from sglang_patches import ordering, state
    from sglang_patches.settings import read_settings
    from specforge_outlets.scheduling import QueuePolicy

    processed = [0]

    def outlets(order: QueuePolicy) -> Callable[[list], None]:
        chosen = dataclasses.replace(read_settings(), order=order)  # the defaults, --outlets-order ORDER

        def run(queue: list) -> None:
            state.use_settings(chosen)  # what the plugin reads once per process; two orders share this one
            ordering.sort_waiting(queue, chosen.scheduling)

        return run

    def hrrn(queue: list) -> None:
        processed[0] += 300_000
        SchedulePolicy._sort_by_hrrn(queue, set(), processed[0])

    return {
        "lof": lambda queue: SchedulePolicy._sort_by_longest_output(queue, False, 1),
        "hrrn": hrrn,
        "shortest-prefill-first": lambda queue: SchedulePolicy._sort_by_shortest_prefill(queue, set()),
        "outlets sjf": outlets(QueuePolicy.SJF),
        "outlets tail-safe": outlets(QueuePolicy.TAIL_SAFE),
    }


def measure_ordering(sizes, repetitions: int) -> List[dict]:
    policies = orderings()
    rows = []
    for n in sizes:
        steady: Dict[str, List[float]] = {name: [] for name in policies}
        first: Dict[str, List[float]] = {name: [] for name in policies}
        for repetition in range(repetitions):
            for name, sort in policies.items():  # interleaved: every policy sees the same machine state
                factory = RequestFactory(seed=repetition, backlog=n)
                queue = factory.queue(n)
                first[name].append(timed(sort, queue))
                for _ in range(ROUNDS):
                    del queue[:churn(n)]
                    queue.extend(factory.queue(churn(n)))
                    steady[name].append(timed(sort, queue))
        row = {"waiting": n}
        for name in policies:
            row[f"{name} steady ms"] = 1e3 * statistics.median(steady[name])
            row[f"{name} first ms"] = 1e3 * statistics.median(first[name])
        rows.append(row)
        print(f"ordering {n:>6}: " + ", ".join(f"{name} {row[f'{name} steady ms']:.3f}" for name in policies)
              + " ms (steady)", flush=True)
    return rows
