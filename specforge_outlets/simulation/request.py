"""A request as the simulator moves it through the cluster."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.scheduling import LengthPrediction, PredictionSource


class SimRequest:
    """A request as it moves through the cluster (the fields the scheduling core reads included)."""

    __slots__ = (
        "index", "arrival_time", "input_len", "output_len", "unrevealed_prediction", "prediction",
        "num_generated_tokens", "reservation", "full_reservation", "enqueue_time", "queue_delay", "pending_work",
        "prefill_left", "prefill_claim", "join_step", "finish_step", "retractions", "first_token_time", "first_batch_time",
        "finish_time", "trajectory", "prefill_queue_delay", "transfer_time", "decode_queue_delay", "quantile_trajectory",
        "last_token_time", "span_start", "span_pause",  # TokenGapLog's
    )

    def __init__(self, index: int, arrival_time: float, input_len: int, output_len: int,
                 prediction: Optional[LengthPrediction], reservation: int, trajectory: Optional[np.ndarray] = None,
                 quantile_trajectory: Optional[Sequence[Tuple[float, ...]]] = None) -> None:
        self.index = index
        self.arrival_time = arrival_time
        self.input_len = input_len
        self.output_len = output_len
        # r̂_0 (and its total-length quantiles; None: not predicted), revealed to the scheduler (as prediction) at
        # the cluster's prediction point
        self.unrevealed_prediction = prediction
        self.prediction: Optional[LengthPrediction] = None
        # dynamic predictions: entry k is the predicted remaining tokens (r̂_t) read at output token k + 1,
        # counting that token; and the remaining-length quantiles read at each output token (None: the
        # prediction's own quantiles stay)
        self.trajectory = trajectory
        self.quantile_trajectory = quantile_trajectory
        self.prefill_queue_delay = 0.0
        self.transfer_time = 0.0
        self.decode_queue_delay = 0.0
        self.num_generated_tokens = 0
        self.reservation = reservation  # KV tokens reserved at the current admission
        self.full_reservation = reservation  # prompt + max(max_new_tokens, output): can never overflow
        self.enqueue_time = 0.0
        self.queue_delay = 0.0
        self.pending_work = 0.0  # this request's share of its instance's waiting work
        self.prefill_left = input_len
        self.prefill_claim = 0  # KV tokens its prefill (or recomputation) holds while it runs
        self.join_step = 0
        self.finish_step = -1  # the step its decode ends; -1 while not decoding
        self.retractions = 0
        self.first_token_time = np.nan
        self.first_batch_time = np.nan  # when it first joins a decode batch (SGLang's PD decode streams token 1 then)
        self.finish_time = np.nan
        self.last_token_time = np.nan
        self.span_start = 0
        self.span_pause = 0.0

    def prediction_at(self, generated: int) -> Optional[LengthPrediction]:
        """The prediction the scheduler holds once ``generated`` tokens exist.

        Static: the prediction revealed at the prediction point. Dynamic (a trajectory, as EAGLE-3 mode
        re-predicts after every step): from the second token on, the latest estimate, read at output token
        k, says the request ends after ``k - 1 + estimate`` tokens (``LengthPrediction.from_remaining``, the
        plugin's ``set_predicted_remaining``); at the first it is the prediction. The point and quantile
        trajectories are separate inputs (a predictions file may carry one without the other, or of other
        lengths), so each is read on its own, and built without ``from_remaining``'s clean-up: the
        simulator's quantiles are checked as they are read (``predicted_lengths``), and its results stay
        those of the plain sums.
        """
        prediction = self.prediction
        if prediction is None or generated < 2 or (self.trajectory is None and self.quantile_trajectory is None):
            return prediction
        total, quantiles = prediction.predicted_output_len, prediction.predicted_output_quantiles
        if self.trajectory is not None:
            k = min(generated, len(self.trajectory))
            total = k - 1 + float(self.trajectory[k - 1])
        if self.quantile_trajectory is not None and quantiles is not None:
            k = min(generated, len(self.quantile_trajectory))
            quantiles = tuple(k - 1 + value for value in self.quantile_trajectory[k - 1])
        return LengthPrediction(total, PredictionSource.DRAFT, quantiles, generated)

    def reveal_prediction(self) -> None:
        """The prediction point: the scheduler learns the prediction."""
        self.prediction = self.unrevealed_prediction

    @property
    def predicted_output_len(self) -> Optional[float]:
        """The revealed prediction's total (what the queue's order keys read; None: the prior)."""
        return None if self.prediction is None else self.prediction.predicted_output_len

    @property
    def predicted_output_quantiles(self) -> Optional[Tuple[float, ...]]:
        """The revealed prediction's total-length quantiles (what the distribution keys read)."""
        return None if self.prediction is None else self.prediction.predicted_output_quantiles

    @property
    def prompt_len(self) -> int:
        """Prompt tokens (what the kv-footprint key reads)."""
        return self.input_len
