"""Long-class threshold from the predictions' own ranks: the tail-safe classes of ``tail-safe-ranks``.

The tail-safe order splits its classes at a fixed ``long_output_len`` (800 predicted tokens). A learned
predictor's r̂₀ regresses to the mean and never reaches 800 on the project's prompt sets, so every
request lands in the short class and tail-safe is FCFS (issue 45). A threshold read from the
predictions themselves keeps a class of the predicted-longest requests whatever the predictor's scale:
a request is long when its predicted remaining length is among the top ``long_class_share`` of the
last ``rank_window`` predictions this queue received (its own included).

Deterministic and cheap: the window is a FIFO of the values beside the same values sorted, so a new
prediction costs two binary searches and a shift of at most ``rank_window`` pointers (a C memmove),
and the threshold is one index into the sorted list.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Deque, List, Optional

from specforge_outlets.scheduling.keys import SchedulingConfig, predicted_remaining


class RecentPredictions:
    """The predicted remaining lengths of the last ``config.rank_window`` requests a queue classified."""

    def __init__(self, config: SchedulingConfig) -> None:
        self._share = config.long_class_share
        self._arrived: Deque[float] = deque(maxlen=config.rank_window)
        self._sorted: List[float] = []

    def add(self, remaining: float) -> None:
        """Record a prediction; the oldest leaves once the window is full."""
        if len(self._arrived) == self._arrived.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._arrived[0])]
        self._arrived.append(remaining)
        bisect.insort(self._sorted, remaining)

    def long_threshold(self) -> float:
        """The smallest of the top ``long_class_share`` of the window (its k-th largest, k = floor(share x size));
        infinite while that share holds no prediction (fewer than 1 / share in the window: no long class yet)."""
        top = int(self._share * len(self._sorted))
        return self._sorted[-top] if top else math.inf

    def classify(self, predicted_output_len: Optional[float], num_generated_tokens: int, config: SchedulingConfig) -> bool:
        """Whether a request joining the queue now is in the long class, by its predicted remaining length
        (:func:`predicted_remaining`), which first joins the window; a request without a prediction is compared at
        the prior and joins nothing (the window holds predictions seen, not the prior)."""
        remaining = predicted_remaining(predicted_output_len, num_generated_tokens, config.prior_output_len)
        if predicted_output_len is not None:
            self.add(remaining)
        return remaining >= self.long_threshold()
