"""Every inter-token gap of a simulated run, kept per decode segment instead of per token.

Inter-token latency (ITL) percentiles, as ``sglang.bench_serving`` reports them, pool the gaps
between consecutive tokens of every request. In the simulator every request running in a decode
segment gets one token per step, so the segment's gaps are its mean step time, once per step and
running request. A request therefore logs only the segments it joins and leaves (a span), and the
pause before it (re)joins a batch: on a decode instance the wait after its first token (the KV
transfer and the decode queue), after a retraction the time until its recomputation resumes it.
That pause plus the segment's step time replaces its first gap in the span. A token made outside a
segment (vLLM's recomputation samples the next token as it ends) is a gap of its own. The cost is per
event, as the rest of the simulator's, never per token.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

# Pauses shorter than this are float noise of a join at a segment boundary, not a gap of their own.
PAUSE_TOLERANCE_S = 1e-9


class TokenGapLog:
    """Segments per engine (duration, steps), request spans over them and the pauses before spans."""

    def __init__(self, num_engines: int) -> None:
        self.durations: List[List[float]] = [[] for _ in range(num_engines)]
        self.steps: List[List[int]] = [[] for _ in range(num_engines)]
        self.spans: List[Tuple[int, int, int, int]] = []  # (engine, request, first segment, end segment)
        self.pauses: List[Tuple[int, int, int, float]] = []  # (engine, request, segment, pause s)
        self.lone_gaps: List[Tuple[int, float]] = []  # (request, gap s) before a token made outside a segment

    def segment(self, engine: int, duration_s: float, steps: int) -> None:
        """A decode segment of ``engine`` ended: ``steps`` steps in ``duration_s``."""
        self.durations[engine].append(duration_s)
        self.steps[engine].append(steps)

    def joined(self, engine: int, request, now: float) -> None:
        """``request`` joins ``engine``'s batch at ``now``; its next token ends the engine's next segment."""
        request.span_start = len(self.durations[engine])
        request.span_pause = now - request.last_token_time

    def left(self, engine: int, request, now: float) -> None:
        """``request`` leaves the batch at ``now`` (finished, or retracted), at a segment boundary."""
        start, end = request.span_start, len(self.durations[engine])
        if end == start:  # retracted before a step: no token, the pause goes on
            return
        self.spans.append((engine, request.index, start, end))
        if request.span_pause > PAUSE_TOLERANCE_S:
            self.pauses.append((engine, request.index, start, request.span_pause))
        request.last_token_time = now

    def lone_token(self, request, now: float) -> None:
        """``request`` gets a token at ``now`` outside a decode segment, between two spans."""
        self.lone_gaps.append((request.index, now - request.last_token_time))
        request.last_token_time = now

    def gaps(self, selected: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(gap seconds, how many gaps of that length) of the requests ``selected`` (a mask by request index)."""
        values, weights = [], []
        spans = np.array(self.spans, dtype=np.int64).reshape(-1, 4)
        spans = spans[selected[spans[:, 1]]]
        pauses = np.array(self.pauses, dtype=np.float64).reshape(-1, 4)
        pauses = pauses[selected[pauses[:, 1].astype(np.int64)]]
        for engine, (durations, steps) in enumerate(zip(self.durations, self.steps)):
            if not durations:
                continue
            steps_array = np.array(steps, dtype=np.float64)
            step_s = np.array(durations) / np.maximum(steps_array, 1.0)  # [segments]
            mine = spans[spans[:, 0] == engine]
            running = np.zeros(len(durations) + 1)  # selected requests in each segment's batch
            np.add.at(running, mine[:, 2], 1.0)
            np.add.at(running, mine[:, 3], -1.0)
            count = steps_array * np.cumsum(running)[:-1]
            paused = pauses[pauses[:, 0] == engine]
            segments = paused[:, 2].astype(np.int64)
            np.add.at(count, segments, -1.0)  # those requests' first gap there is the pause plus the step
            values += [step_s, paused[:, 3] + step_s[segments]]
            weights += [count, np.ones(len(paused))]
        lone = np.array(self.lone_gaps, dtype=np.float64).reshape(-1, 2)
        lone = lone[selected[lone[:, 0].astype(np.int64)], 1]
        values.append(lone)
        weights.append(np.ones(len(lone)))
        return np.concatenate(values), np.concatenate(weights)
