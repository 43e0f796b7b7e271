"""The interface every length predictor implements, OUTLETS and the baselines alike.

A predictor is fitted on the train split and predicts, for each test request, the static
``r_hat_0`` (the whole output length, before the first response token) and, where it has one, a
dynamic ``r_hat_t`` for every response position ``t = 0 .. L-1``. Predictors without a dynamic
model are scored dynamically by counting down their static prediction (``metrics.countdown``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from specforge_outlets.evaluation.requests import Split
from specforge_outlets.errors import OutletsError

# How a predictor's dynamic predictions are obtained, reported next to its dynamic MAE.
DYNAMIC_MODEL = "model"  # re-predicted from the state at every position
DYNAMIC_COUNTDOWN = "countdown"  # max(r_hat_0 - t, 1): the static prediction minus tokens generated


@dataclass
class Prediction:
    static: float  # r_hat_0, tokens
    dynamic: Optional[np.ndarray] = None  # r_hat_t for t = 0 .. L-1, tokens
    # a predictor with a quantile head (a predicted length distribution): remaining-token quantiles at its
    # ``quantile_levels`` for t = 0 .. L-1 ([L, K]; row 0 is the whole output length's), non-decreasing along K
    dynamic_quantiles: Optional[np.ndarray] = None


@dataclass
class EvalContext:
    """What predictors may need besides the splits."""

    target_path: Optional[str] = None  # resolved target model directory (LM-based predictors)
    max_new_tokens: Optional[int] = None  # the generation limit of the test responses (pia clips to it)
    device: str = "cpu"
    seed: int = 0
    progress: bool = True
    options: Dict[str, Any] = field(default_factory=dict)


class Predictor:
    """Base class: set ``name`` and ``description``; override ``fit`` and ``predict``."""

    name = "predictor"
    description = ""
    dynamic_source = DYNAMIC_COUNTDOWN
    quantile_levels: Optional[tuple] = None  # set by a predictor whose predictions carry quantiles

    def __init__(self, context: EvalContext) -> None:
        self.context = context
        self.info: Dict[str, Any] = {}  # extra facts for the report (e.g. unparseable answers)

    @classmethod
    def missing_dependency(cls) -> Optional[str]:
        """The install this predictor lacks (``outlets eval`` asks before anything is fitted), else None."""
        return None

    def check(self, test: Split) -> None:
        """Raise an OutletsError for a requirement that is missing, before any predictor is fitted."""

    def fit(self, train: Split) -> None:
        raise NotImplementedError

    def training_split(self, train: Split) -> Split:
        """What a learned predictor fits on: with ``--censored-training one_sided``, the censored
        responses too (their ``length`` a lower bound, fitted one-sided by ``heads.fit_head``)."""
        return train.with_censored() if self.context.options.get("censored_training") == "one_sided" else train

    def predict(self, test: Split) -> List[Prediction]:
        raise NotImplementedError


def check_predictions(name: str, test: Split, predictions: List[Prediction]) -> None:
    """One finite prediction per request; the error names the request's file."""
    if len(predictions) != len(test):
        raise OutletsError(f"predictor {name}: {len(predictions)} predictions for {len(test)} requests")
    for request, prediction in zip(test.requests, predictions):
        bad = not np.isfinite(prediction.static)
        if prediction.dynamic is not None:
            if prediction.dynamic.shape != (request.length,):
                raise OutletsError(
                    f"predictor {name}: {request.file} request {request.id}: {prediction.dynamic.shape} "
                    f"dynamic predictions for a {request.length}-token response"
                )
            bad = bad or not bool(np.isfinite(prediction.dynamic).all())
        if prediction.dynamic_quantiles is not None:
            if prediction.dynamic_quantiles.shape[0] != request.length:
                raise OutletsError(
                    f"predictor {name}: {request.file} request {request.id}: {prediction.dynamic_quantiles.shape} "
                    f"quantile predictions for a {request.length}-token response"
                )
            bad = bad or not bool(np.isfinite(prediction.dynamic_quantiles).all())
        if bad:
            raise OutletsError(
                f"predictor {name}: non-finite (NaN/inf) prediction for request {request.id} of {request.file}; "
                "the model or its input features are broken (check the file for NaN hidden states)"
            )
