"""The event loop of one simulated instance: decode segments, steps with prompts, and the cut of a segment.

A decode segment is a run of steps of an unchanged batch, up to the next request that finishes or the
last step the cache holds; its length comes in closed form from the step-time model
(:meth:`StepTimeModel.decode_steps_time`), so the cost is per event, never per token. A request arriving
at a busy instance with room for it cuts the segment at the end of the step in progress, as continuous
batching admits between steps. A step with prompts runs one step: a mixed one (every running request
decodes a token too), or for an engine that runs prefill batches alone, one that decodes nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Deque, Dict, List, Tuple

from specforge_outlets.simulation.cluster_run import ClusterRun
from specforge_outlets.simulation.hardware import StepTimeModel
from specforge_outlets.simulation.request import SimRequest

# Float slack when deciding whether an arrival falls exactly on a step boundary.
BOUNDARY_TOLERANCE_S = 1e-9


class SegmentLoop(ABC):
    """Runs an instance's steps segment by segment; the scheduler (:class:`~.base.Scheduler`) holds the batch
    (``running``, ``prefilling``, ``steps_done``, ``kv_tokens``) and decides at every step boundary."""

    # the scheduler's, read here
    sim: ClusterRun
    engine_id: int
    model: StepTimeModel
    running: Dict[int, SimRequest]
    prefilling: Deque[SimRequest]
    steps_done: int
    kv_tokens: int

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size  # prompt tokens per step (and per recomputation)
        self.busy = False
        self.segment_start = 0.0
        self.segment_steps = 0
        self.segment_batch = 0
        self.segment_kv = 0
        self.segment_chunk: List[Tuple[SimRequest, int]] = []  # prefill tokens of the step
        self.segment_version = 0
        self.segment_retracted = False  # whether the segment's first step came after a retraction

    @abstractmethod
    def _schedule(self, now: float) -> bool:
        """At a step boundary: admit, and retract where the next step does not fit; whether any was retracted."""

    @abstractmethod
    def _decode_room(self) -> int:
        """Decode steps before the cache would overflow."""

    @abstractmethod
    def _next_finish_step(self) -> int:
        """Step at which the next running request finishes."""

    @abstractmethod
    def _finish_due(self, now: float) -> None:
        """The running requests whose last step has run leave the batch."""

    @abstractmethod
    def _prefilled(self, now: float, request: SimRequest) -> None:
        """``request``'s prompt (or recomputation) is all computed."""

    def _next_step(self, now: float) -> None:
        """At a step boundary: the engine schedules, then the next segment starts."""
        self.segment_retracted = self._schedule(now)
        self._start_segment(now)

    def _segment_steps_done(self, now: float) -> int:
        if not self.busy or self.segment_chunk:
            return 0
        done = self.model.decode_steps_done(now - self.segment_start, self.segment_batch, self.segment_kv)
        return min(done, self.segment_steps)

    def _cut_segment(self, now: float) -> None:
        """End the decode segment after the step in progress, so the new request joins the batch."""
        steps = self._steps_to_next_boundary(now)
        if steps < self.segment_steps:
            self._schedule_segment_end(steps)

    def _steps_to_next_boundary(self, now: float) -> int:
        """Steps of the decode segment in progress done at the end of the step running at ``now``."""
        elapsed = now - self.segment_start - BOUNDARY_TOLERANCE_S  # arriving at a step boundary joins it
        return self.model.decode_steps_done(elapsed, self.segment_batch, self.segment_kv) + 1

    def _prefill_budget(self) -> int:
        """Prompt tokens the next step computes."""
        return self.chunk_size

    def _prefill_chunks(self) -> List[Tuple[SimRequest, int]]:
        """The tokens each request prefilling computes in the next step, in order, within the step's budget."""
        budget = self._prefill_budget()
        chunks = []
        for request in self.prefilling:
            if budget <= 0:
                break
            tokens = min(request.prefill_left, budget)
            chunks.append((request, tokens))
            budget -= tokens
        return chunks

    def _start_segment(self, now: float) -> None:
        self.segment_start, self.segment_batch, self.segment_kv = now, len(self.running), self.kv_tokens
        self.segment_chunk = []
        if self.prefilling:
            self.segment_chunk = self._prefill_chunks()
            self.busy = True
            self._start_prefill_step(now, sum(tokens for _, tokens in self.segment_chunk))
        elif self.running:
            self.busy = True
            # up to the next finish, or to the last step before the cache would overflow
            self._schedule_segment_end(max(min(self._next_finish_step() - self.steps_done, self._decode_room()), 1))
        else:
            self.busy = False
            self._idle()

    def _start_prefill_step(self, now: float, prefill_tokens: int) -> None:
        """A mixed step: every running request decodes one token, prompts take the chunk budget."""
        self.segment_steps = 1
        self._schedule_end_at(now + self.model.step_time(self.kv_tokens, prefill_tokens, len(self.running)))

    def _idle(self) -> None:
        """The instance has nothing left to run."""

    def _schedule_segment_end(self, steps: int) -> None:
        self.segment_steps = steps
        duration = self.model.decode_steps_time(steps, self.segment_batch, self.segment_kv)
        self._schedule_end_at(self.segment_start + duration)

    def _schedule_end_at(self, time: float) -> None:
        self.segment_version += 1  # an earlier end event of a cut segment becomes stale
        self.sim.schedule(time, self._end_segment, self.segment_version)

    def _end_segment(self, now: float, version: int) -> None:
        if version != self.segment_version:
            return
        if self.segment_steps:
            self.sim.token_gaps.segment(self.engine_id, now - self.segment_start, self.segment_steps)
        else:  # a prefill batch run alone: the running requests' next token waits for it
            self.sim.token_gaps.stall(self.engine_id, now - self.segment_start)
        self._segment_ran()
        self.steps_done += self.segment_steps
        self.kv_tokens += self.segment_batch * self.segment_steps
        self._finish_due(now)
        for request, tokens in self.segment_chunk:
            request.prefill_left -= tokens
            if request.prefill_left == 0:
                self._prefilled(now, request)
        self._next_step(now)

    def _segment_ran(self) -> None:
        """The segment's steps ran (before they are counted)."""
