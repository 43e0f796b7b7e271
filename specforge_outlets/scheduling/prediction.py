"""One request's length prediction: the predicted total output length, its quantiles, where it came from, and
the output length it was made at, in one immutable object every reader asks.

The length head predicts ``log_remaining`` (z = log(1 + remaining tokens); ``model/length_head.py``
``log_remaining_to_tokens`` is the one conversion to tokens). Its ``predicted_remaining`` tokens at the
``output_len``-th output token become a :class:`LengthPrediction` here (:meth:`LengthPrediction.from_remaining`),
which keeps the total output length: a total stays right as the request generates (its remaining length falls
by one per token), so the order keys, retraction, KV admission and routing read the remaining length at any
age from it (:meth:`LengthPrediction.remaining`) without a new prediction.

Pure Python, as the rest of the scheduling core: the SGLang plugin keeps one on each ``Req``
(``sglang_patches/predictions.py``) and the simulator's requests (``simulation/request.py``) hold the same object.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence, Tuple

from specforge_outlets.scheduling.keys import SchedulingConfig, predicted_remaining

# Smallest total-length quantile kept: a draft may predict 0 remaining at prefill, the core's distributions need > 0
MIN_QUANTILE = 1e-3


class PredictionSource(str, Enum):
    """Where a prediction came from (a ``str``: the plugin's logs and tests compare it with the plain name)."""

    EXTERNAL = "external"  # with the request (custom_params): takes precedence over any predictor
    DRAFT = "draft"  # the OUTLETS draft's length head (predictor-only or EAGLE-3 mode)
    PREFILL = "prefill"  # transferred from the PD prefill instance
    PRIOR = "prior"  # a failed prediction fell back to the scheduling config's prior


def total_quantiles(values: Sequence[float]) -> Tuple[float, ...]:
    """Total-length quantiles as the core reads them: floats, at least :data:`MIN_QUANTILE`, non-decreasing (a
    running maximum undoes a float rounding that crossed two equal ones)."""
    totals, highest = [], MIN_QUANTILE
    for value in values:
        highest = max(highest, float(value))
        totals.append(highest)
    return tuple(totals)


@dataclass(frozen=True)
class LengthPrediction:
    """A request's predicted total output length (r̂₀, or ``t − 1 + r̂ₜ`` once re-predicted after t tokens)."""

    predicted_output_len: float
    source: PredictionSource
    # the total length's quantiles at the scheduling config's quantile_levels; None: a point mass at the prediction
    predicted_output_quantiles: Optional[Tuple[float, ...]] = None
    at_generated: int = 0  # the request's output length when the prediction was made (0: before its first token)

    @classmethod
    def of_total(cls, predicted_output_len: float, source, quantiles: Optional[Sequence[float]] = None,
                 at_generated: int = 0) -> "LengthPrediction":
        """A prediction of the total output length (and, when the source gives them, its quantiles)."""
        totals = None if quantiles is None else total_quantiles(quantiles)
        return cls(float(predicted_output_len), PredictionSource(source), totals, at_generated)

    @classmethod
    def from_remaining(cls, remaining: float, output_len: int, remaining_quantiles: Optional[Sequence[float]] = None,
                       source=PredictionSource.DRAFT) -> "LengthPrediction":
        """The head's ``remaining`` tokens (and quantiles) read at the ``output_len``-th output token.

        The head's value at a token counts that token (the labels are L, L-1, ..., 1 from the first response
        token on: ``specforge_outlets.data.labels``), so the request is predicted to end after
        ``output_len - 1 + remaining`` tokens; the first (``output_len == 1``, at prefill) is r̂₀ itself.
        """
        offset = output_len - 1
        totals = None if remaining_quantiles is None else [offset + float(value) for value in remaining_quantiles]
        return cls.of_total(offset + float(remaining), source, totals, output_len)

    @property
    def is_external(self) -> bool:
        """The prediction came with the request: it takes precedence over any predictor."""
        return self.source is PredictionSource.EXTERNAL

    def remaining(self, generated: int) -> float:
        """Predicted remaining output tokens after ``generated`` (floored at the core's minimum)."""
        return predicted_remaining(self.predicted_output_len, generated, 0.0)

    def remaining_quantiles(self, generated: int) -> Optional[Tuple[float, ...]]:
        """The remaining length's quantiles after ``generated`` tokens (at least 0), None without quantiles."""
        if self.predicted_output_quantiles is None:
            return None
        return tuple(max(value - generated, 0.0) for value in self.predicted_output_quantiles)


def remaining_or_prior(prediction: Optional[LengthPrediction], generated: int, config: SchedulingConfig) -> float:
    """A request's predicted remaining output tokens after ``generated``; the prior's when it is unpredicted."""
    if prediction is None:
        return predicted_remaining(None, generated, config.prior_output_len)
    return prediction.remaining(generated)
