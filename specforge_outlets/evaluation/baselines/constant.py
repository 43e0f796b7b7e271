"""Constant baseline: the training median length.

Dynamically it predicts the training median of ``L - t`` over the training responses still
running after ``t`` tokens (the best constant that knows only how far decoding has got).
"""

from __future__ import annotations

from typing import List

import numpy as np

from specforge_outlets.evaluation.predictor_api import Prediction, Predictor
from specforge_outlets.evaluation.requests import Split


class ConstantPredictor(Predictor):
    name = "constant"
    description = "training median length; dynamically the median remaining length of training responses still running"
    dynamic_source = "conditional-median"

    def fit(self, train: Split) -> None:
        self.lengths = np.sort(np.asarray(train.lengths, np.float64))
        self.median = float(np.median(self.lengths))
        self.info["training_median"] = self.median

    def remaining_median(self, steps: int) -> np.ndarray:
        """Median of ``L - t`` over training lengths ``L > t``, for ``t = 0 .. steps-1`` (1 past the longest)."""
        out = np.ones(steps)
        for t in range(min(steps, int(self.lengths[-1]))):
            running = self.lengths[self.lengths > t]
            out[t] = float(np.median(running - t))
        return out

    def predict(self, test: Split) -> List[Prediction]:
        table = self.remaining_median(max(test.lengths))
        return [Prediction(self.median, table[: request.length].copy()) for request in test.requests]
