"""The ladder's workloads and its rungs: each rung's predicted lengths for a workload's requests.

Rungs (``RUNGS``), from no information to all of it: none; a constant (the train split's median);
OUTLETS r̂₀ shuffled across requests (its values, no per-request information); the learned predictors'
r̂₀; the per-prompt ceiling; the oracle. The label set's samples know every rung's value per sample
(``studies.label_set_samples``); the serving study's lengths-only workloads carry the errors each rung
made on those samples at a similar true length (:class:`TransferredErrors`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.serving.trace import Trace
from specforge_outlets.simulation.predicted_lengths import (
    constant_predictions,
    mean_rescaled_predictions,
    shuffled_predictions,
    with_measured_errors,
)
from specforge_outlets.studies import sharegpt_serving as study
from specforge_outlets.studies.label_set_samples import LEARNED, LabelSetSamples


class TransferredErrors:
    """A lengths-only workload of the serving study; each rung's values carry the errors it made on the label set's
    samples at a similar true length (a rung is drawn with its own generator, so adding one changes no other)."""

    def __init__(self, name: str, label_set: LabelSetSamples) -> None:
        self.name, self.label_set = name, label_set
        self.source = study.workloads()[name]()
        self.train_median = label_set.train_median

    def trace(self, rate_rps: float, count: int, seed: int) -> Tuple[Trace, None]:
        if not self.source.recorded_arrivals:
            return self.source.trace(rate_rps, count, seed), None
        whole = self.source.lengths  # recorded arrivals: the seed's own window, scaled to the rate
        if (seed + 1) * count > len(whole):
            raise SystemExit(f"{self.name} holds {len(whole)} requests: {seed + 1} windows of {count} do not fit")
        window = slice(seed * count, (seed + 1) * count)
        times = whole.arrival_times[window] - whole.arrival_times[window][0]
        trace = Trace(f"{self.name}-window{seed}", whole.ids[window], times, whole.input_lens[window],
                      whole.output_lens[window])
        return trace.scaled(rate_rps / trace.offered_rps), None

    def measured(self, rung: str, trace: Trace, drawn: None, seed: int) -> List[float]:
        rng = np.random.default_rng([seed, sorted(self.label_set.values).index(rung)])
        return with_measured_errors(self.label_set.output_lens, self.label_set.values[rung], trace.output_lens,
                                    rng).tolist()


RESCALED = "outlets r0 mean-rescaled"  # shown beside the ladder, not a rung of its order (it knows the mean)
# its controls, at the same mean: no ranking (a constant) and no per-request ranking (OUTLETS' values shuffled)
RESCALED_CONTROLS = ("constant mean-rescaled", "outlets r0 shuffled mean-rescaled")
BESIDE = (RESCALED, *RESCALED_CONTROLS)  # the rungs that know the mean
Rung = Callable[[object, Trace, Optional[np.ndarray], int], List[Optional[float]]]
RUNGS: Dict[str, Rung] = {
    "none": lambda work, trace, drawn, seed: [None] * len(trace),
    "constant": lambda work, trace, drawn, seed: constant_predictions(work.train_median, len(trace)),
    "outlets r0 shuffled": lambda work, trace, drawn, seed: shuffled_predictions(
        work.measured("outlets r0", trace, drawn, seed), seed),
    **{rung: (lambda rung: lambda work, trace, drawn, seed: work.measured(rung, trace, drawn, seed))(rung)
       for rung in LEARNED},
    # OUTLETS' ranking at the workload's mean length: what calibrating r̂₀ by finished lengths could gain
    RESCALED: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        work.measured("outlets r0", trace, drawn, seed), trace.output_lens),
    RESCALED_CONTROLS[0]: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        constant_predictions(work.train_median, len(trace)), trace.output_lens),
    RESCALED_CONTROLS[1]: lambda work, trace, drawn, seed: mean_rescaled_predictions(
        shuffled_predictions(work.measured("outlets r0", trace, drawn, seed), seed), trace.output_lens),
    "ceiling": lambda work, trace, drawn, seed: work.measured("ceiling", trace, drawn, seed),
    "oracle": lambda work, trace, drawn, seed: trace.output_lens.astype(np.float64).tolist(),
}


def workloads(names: Sequence[str], record: str) -> Dict[str, Callable[[], object]]:
    label_set = LabelSetSamples(record)
    made = {LabelSetSamples.name: lambda: label_set}
    made.update({name: (lambda name: lambda: TransferredErrors(name, label_set))(name)
                 for name in ("sharegpt-chatgpt", "azure-conv")})
    return {name: made[name] for name in names}
