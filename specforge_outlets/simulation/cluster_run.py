"""What a simulated instance reads and calls of the cluster run it belongs to (``engine.Simulation``).

Prefill instances and the engines' schedulers depend on this interface, not on the run that creates
them, so that no module imports back the one that imports it.
"""

from __future__ import annotations

from typing import Callable, Protocol

from specforge_outlets.scheduling import SchedulingConfig
from specforge_outlets.simulation.cluster import ClusterConfig
from specforge_outlets.simulation.hardware import StepTimeModel
from specforge_outlets.simulation.request import SimRequest
from specforge_outlets.simulation.sglang_peers import AnyQueuePolicy
from specforge_outlets.simulation.token_gaps import TokenGapLog


class QueueChoice(Protocol):
    """The policy combination under study, as an instance reads it (``engine.Policy``)."""

    @property
    def queue(self) -> AnyQueuePolicy: ...


class ClusterRun(Protocol):
    """One run of the cluster: its settings, the event heap and the request's life between instances."""

    cluster: ClusterConfig
    policy: QueueChoice
    scheduling: SchedulingConfig
    model: StepTimeModel
    dynamic: bool  # whether predictions change as requests decode
    token_gaps: TokenGapLog

    def schedule(self, time: float, callback: Callable[[float, object], None], argument: object) -> None: ...

    def first_token(self, now: float, request: SimRequest) -> None: ...

    def prefill_done(self, now: float, request: SimRequest) -> None: ...

    def finish(self, now: float, request: SimRequest) -> None: ...
