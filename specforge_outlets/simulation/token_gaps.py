"""Every inter-token gap of a simulated run, kept per decode segment instead of per token.

Inter-token latency (ITL) percentiles, as ``sglang.bench_serving`` reports them, pool the gaps
between consecutive tokens of every request. In the simulator every request running in a decode
segment gets one token per step, so the segment's gaps are its mean step time, once per step and
running request. A request therefore logs only the segments it joins and leaves (a span), and the
pause before it (re)joins a batch: on a decode instance the wait after its first token (the KV
transfer and the decode queue), after a retraction the time until its recomputation resumes it.
That pause plus the segment's step time replaces its first gap in the span. A token made outside a
segment (a recomputation samples the next token as it ends) is a gap of its own. A step that decodes
nothing (SGLang runs a prefill batch alone) is a stall: the batch's next segment's first gap is longer
by it. The cost is per
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
        # per engine and segment: the time of steps that decoded nothing (prefill batches run alone) just before it
        self.stalls: List[List[float]] = [[] for _ in range(num_engines)]
        self._stalled = [0.0] * num_engines  # such time since the engine's last segment

    def segment(self, engine: int, duration_s: float, steps: int) -> None:
        """A decode segment of ``engine`` ended: ``steps`` steps in ``duration_s``."""
        self.durations[engine].append(duration_s)
        self.steps[engine].append(steps)
        self.stalls[engine].append(self._stalled[engine])
        self._stalled[engine] = 0.0

    def stall(self, engine: int, duration_s: float) -> None:
        """``engine`` ran a step that decoded nothing: the first gap of its batch's next segment is longer by it."""
        self._stalled[engine] += duration_s

    def joined(self, engine: int, request, now: float) -> None:
        """``request`` joins ``engine``'s batch at ``now``; its next token ends the engine's next segment."""
        request.span_start = len(self.durations[engine])
        # less what the engine stalled before the request joined: the stall before that segment counts from here
        request.span_pause = now - request.last_token_time - self._stalled[engine]

    def left(self, engine: int, request, now: float) -> None:
        """``request`` leaves the batch at ``now`` (finished, or retracted), at a segment boundary."""
        start, end = request.span_start, len(self.durations[engine])
        if end == start:  # retracted before a step: no token, the pause goes on
            return
        self.spans.append((engine, request.index, start, end))
        pause = request.span_pause + self.stalls[engine][start]  # the wait before its first token here, beyond a step
        if pause > PAUSE_TOLERANCE_S:
            self.pauses.append((engine, request.index, start, pause))
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
            # the first gap of a segment after a stall is stall + step for the requests already in the batch
            # (the pause of one joining there includes the part of the stall after it joined)
            stalled = np.flatnonzero(np.array(self.stalls[engine]) > PAUSE_TOLERANCE_S)
            if stalled.size:
                joining = np.zeros(len(durations) + 1)
                np.add.at(joining, mine[:, 2], 1.0)
                waited = (np.cumsum(running)[:-1] - joining[:-1])[stalled]
                count[stalled] -= waited
                values.append(np.array(self.stalls[engine])[stalled] + step_s[stalled])
                weights.append(waited)
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
