"""Requests as they reach SGLang's waiting list, and the timer every part measures with."""

from __future__ import annotations

import gc
import random
import time
from typing import Callable

CHURN = 0.01  # share of the queue admitted and arriving between two rounds
ARRIVAL_RATE = 50.0  # requests per second into the stand-in queue
ROUNDS = 20  # steady rounds per repetition


class RequestFactory:
    """Requests as they reach SGLang's waiting list: arrival order, ShareGPT-like lengths, 10% predicted long.

    Arrivals come at ``ARRIVAL_RATE`` per second, as in a saturated server whose queue grew to
    ``backlog``, and each round's batch after the last one. They are stamped on the monotonic clock
    that the plugin orders by, and all of them in its past, as SGLang stamps them: the stream starts
    twice its expected length before the factory is made. The tail-safe order's work depends on
    these ages: the long class's hold-back is a share of the time waited.
    """

    def __init__(self, seed: int, backlog: int) -> None:
        self.rng = random.Random(seed)
        self.count = 0
        expected_s = (backlog + ROUNDS * churn(backlog)) / ARRIVAL_RATE
        self.clock = time.monotonic() - 2 * expected_s

    def make(self):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        from sglang_patches import predictions as P

        rng = self.rng
        self.count += 1
        self.clock += rng.expovariate(ARRIVAL_RATE)
        output_len = min(int(rng.lognormvariate(5.3, 1.0)) + 1, 4096)
        predicted = output_len * rng.lognormvariate(0.0, 0.4)
        req = Req(f"r{self.count}", "", [0] * rng.randint(16, 1024), SamplingParams(max_new_tokens=output_len))
        req.time_stats.wait_queue_entry_time = self.clock
        req.arrival_processed_tokens = self.count * 300
        req.outlets_arrival_time = self.clock
        P.set_predicted_output_len(req, predicted, "external")
        return req

    def queue(self, n: int) -> list:
        return [self.make() for _ in range(n)]


def churn(waiting: int) -> int:
    """Requests admitted from the front, and arriving at the end, between two rounds."""
    return max(1, int(CHURN * waiting))


def timed(function: Callable, *args) -> float:
    """Seconds one call takes, with the garbage collector off during it, as ``timeit`` times."""
    gc.disable()
    try:
        start = time.perf_counter()
        function(*args)
        return time.perf_counter() - start
    finally:
        gc.enable()
