"""The OUTLETS objective: L = w_sd * L_SD + lambda * L_len + mu * L_q + gamma * ||theta_len||^2.

L_q is the quantile head's pinball loss (:func:`fit_quantiles`), on the same positions
with the same weights as L_len; mu is ``outlets.quantile_loss_weight`` and the term is absent
without a quantile head.

L_SD is SpecForge's EAGLE-3 loss, unchanged. L_len is fitted on z = log(1 + remaining tokens) at
the labelled positions of the training-time-test steps: the mean squared error in log space for the
regression head, cross-entropy over length buckets for the bucket ablation. Both are a *weighted*
mean over positions, the weights set by :class:`LengthWeighting`.

Why the weights matter: a response of L tokens has L labelled positions but only one static one
(the state before its first token, whose prediction r_hat_0 orders the queue). Pooled over every
position of every step (``pooled``, uniform TTT weights), long responses dominate and the constant
that minimises the pool for r_hat_0 sits near mean(L)/e whatever the prompt says; the head then
learns to track the countdown within a response and ignores the prompt. ``per_response`` makes
each response count once, whatever its length, and ``static_weight`` adds weight where r_hat_0 is
read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.model.length_head import LengthHead, bucket_index, log_remaining_to_tokens, tail_log_probability
from specforge_outlets.model.quantile_head import QuantileHead, constant_quantiles, pinball_rows
from specforge_outlets.training.settings import WEIGHTINGS, OutletsSettings


@dataclass(frozen=True)
class LengthWeighting:
    """How much each labelled position of each TTT step counts in L_len.

    ``per_response``: each position of a response weighs 1/n (n its labelled positions in the
    step), so every response sums to 1; ``pooled``: every position weighs 1 (a response weighs n).
    ``static_weight`` adds that many times its response's total weight on the response's static
    position: its first labelled position, where the label is the full length L. At TTT step 0
    that is the state at the last prompt position, the one ``outlets eval`` and serving read as
    r_hat_0 (``evaluation/requests.py``: ``prompt_end = start - 1``; labels there are
    ``shift_left(remaining_length, 1)``). Step k is weighted ``ttt_decay ** k``: 1 weighs the
    steps alike, 0 keeps only step 0, the step r_hat_0 and the dynamic predictions come from.
    """

    weighting: str  # training.settings.WEIGHTINGS
    static_weight: float
    ttt_decay: float

    def __post_init__(self) -> None:
        assert self.weighting in WEIGHTINGS, self.weighting
        assert self.static_weight >= 0 and 0 <= self.ttt_decay <= 1, self

    @classmethod
    def from_settings(cls, settings: OutletsSettings) -> "LengthWeighting":
        return cls(settings.length_weighting, settings.length_static_weight, settings.length_ttt_decay)

    def position_weights(self, labels: torch.Tensor, step: int = 0) -> torch.Tensor:
        """[B, T] labels of one TTT step -> [B, T] float weights, 0 where there is no label."""
        return self.weights_at(response_positions(labels), step)

    def weights_at(self, positions, step: int) -> torch.Tensor:
        """The same weights from ``response_positions`` already computed for these labels."""
        labelled, starts, size = positions
        per_position = 1.0 / size if self.weighting == "per_response" else torch.ones_like(size)
        response_total = per_position * size  # 1 (per_response) or n (pooled)
        weights = per_position + self.static_weight * response_total * starts
        return torch.where(labelled, weights, torch.zeros_like(weights)) * self.ttt_decay**step


def response_positions(labels: torch.Tensor):
    """(labelled, static, n) for [B, T] labels: the static position is each response's first
    labelled one (its labels count down by one from L), n the response's labelled positions, as
    float at every position of the response."""
    labelled = labels != NO_LABEL
    previous = F.pad(labels[..., :-1], (1, 0), value=NO_LABEL)
    starts = labelled & (previous != labels + 1)
    segment = (torch.cumsum(starts.flatten(), 0) - 1).view_as(labels).clamp_min(0)
    size = torch.bincount(segment[labelled], minlength=int(segment.max()) + 1)[segment].float()
    return labelled, starts, size


def labelled_rows(
    raw_outputs: Sequence[torch.Tensor],  # per TTT step: [B, T, out]
    labels: Sequence[torch.Tensor],  # per TTT step: [B, T]
    weighting: LengthWeighting,
    lower_bounds: Sequence[torch.Tensor] | None = None,  # per TTT step: [B, T], or None
):
    """The labelled positions of every step as rows: (raw [N, out], remaining [N] (the bound where
    censored), censored [N], weights [N], static [N]: the uncensored static positions of step 0)."""
    if lower_bounds is None:
        lower_bounds = [torch.full_like(l, NO_LABEL) for l in labels]
    targets = [torch.where(l != NO_LABEL, l, b) for l, b in zip(labels, lower_bounds)]
    masks = [t != NO_LABEL for t in targets]
    raw = torch.cat([r[m] for r, m in zip(raw_outputs, masks)])  # [N, out]
    remaining = torch.cat([t[m] for t, m in zip(targets, masks)])  # [N] exact, or the bound where censored
    censored = torch.cat([(b != NO_LABEL)[m] for b, m in zip(lower_bounds, masks)])  # [N]
    positions = [response_positions(t) for t in targets]  # once per step: weights and the static mask
    weights = torch.cat([weighting.weights_at(p, k)[m] for k, (p, m) in enumerate(zip(positions, masks))])
    static = torch.cat([p[1][m] & (k == 0) for k, (p, m) in enumerate(zip(positions, masks))]) & ~censored
    return raw, remaining, censored, weights, static


@dataclass(frozen=True)
class QuantileFit:
    """The quantile term of one batch and the sums behind its coverage metrics (exact labels, every step)."""

    loss: torch.Tensor  # scalar, differentiable
    covered_sums: torch.Tensor  # [K]: positions whose remaining length is at or below each quantile
    count: torch.Tensor


def fit_quantiles(
    raw_outputs: Sequence[torch.Tensor],  # per TTT step: [B, T, K]
    labels: Sequence[torch.Tensor],
    levels: Sequence[float],
    weighting: LengthWeighting,
    lower_bounds: Sequence[torch.Tensor] | None = None,
) -> QuantileFit:
    """The weighted pinball loss of the quantile head on z = log(1 + remaining), on the positions
    and with the weights of L_len; censored positions one-sided (``quantile_head.pinball_rows``)."""
    raw, remaining, censored, weights, _ = labelled_rows(raw_outputs, labels, weighting, lower_bounds)
    exact = ~censored
    if remaining.numel() == 0 or weights.sum() == 0:
        zero = raw.sum() * 0.0
        return QuantileFit(zero, torch.zeros(len(levels)), exact.sum().float())
    z_pred = QuantileHead.log_remaining_quantiles(raw)  # [N, K]
    z_true = torch.log1p(remaining.float())
    loss = (weights * pinball_rows(z_pred, z_true, levels, censored)).sum() / weights.sum()
    with torch.no_grad():
        covered = (z_true[:, None] <= z_pred)[exact].float().sum(0)
    return QuantileFit(loss, covered, exact.sum().float())


@dataclass(frozen=True)
class LengthFit:
    """The length term of one batch and the sums behind its metrics (unweighted, over TTT steps)."""

    loss: torch.Tensor  # scalar, differentiable
    squared_error_sum: torch.Tensor  # of z, in log space
    abs_error_tokens_sum: torch.Tensor
    count: torch.Tensor
    static_abs_error_tokens_sum: torch.Tensor  # |r_hat_0 - L| at step 0, the static prediction
    static_count: torch.Tensor


def fit_length(
    head: LengthHead,
    raw_outputs: Sequence[torch.Tensor],  # per TTT step: [B, T, out]
    labels: Sequence[torch.Tensor],  # per TTT step: [B, T] remaining tokens, NO_LABEL = unlabelled
    bucket_edges: Sequence[int] | None,
    weighting: LengthWeighting,
    lower_bounds: Sequence[torch.Tensor] | None = None,  # per TTT step: [B, T] censored bounds, or None
) -> LengthFit:
    """The weighted length loss; with ``lower_bounds``, censored positions enter one-sided.

    A censored position only says that at least ``c - t`` tokens remain, so it is penalised only
    when the prediction falls below that: ``relu(z_bound - z_pred)^2`` for the regression head, and
    for the bucket head the negative log of the probability of the bound's bucket or a longer one.
    Each censored response is weighted like a finished one (its bound counts down by one, so
    ``response_positions`` finds it). The metrics (MSE, MAE) stay over exact labels only.
    """
    raw, remaining, censored, weights, static = labelled_rows(raw_outputs, labels, weighting, lower_bounds)
    exact = ~censored
    count = exact.sum().float()
    z_true = torch.log1p(remaining.float())
    z_pred = head.log_remaining(raw).float()
    if remaining.numel() == 0 or weights.sum() == 0:  # no length signal in this batch: keep the graph
        zero = raw.sum() * 0.0
        return LengthFit(zero, zero.detach(), zero.detach(), count, zero.detach(), zero.detach())
    if bucket_edges is None:
        per_position = torch.where(censored, F.relu(z_true - z_pred) ** 2, (z_pred - z_true) ** 2)
    else:
        log_p = F.log_softmax(raw.float(), dim=-1)  # [N, buckets]
        bucket = bucket_index(remaining, bucket_edges)
        per_position = -torch.where(censored, tail_log_probability(log_p, bucket), log_p.gather(-1, bucket[:, None]).squeeze(-1))
    loss = (weights * per_position).sum() / weights.sum()
    with torch.no_grad():
        abs_tokens = (log_remaining_to_tokens(z_pred) - remaining.float()).abs()[exact]
        return LengthFit(
            loss,
            ((z_pred - z_true) ** 2)[exact].sum(),
            abs_tokens.sum(),
            count,
            abs_tokens[static[exact]].sum(),
            static.sum().float(),
        )


def constant_fit(labels: Iterable[torch.Tensor], bucket_edges: Sequence[int] | None,
                 weighting: LengthWeighting) -> torch.Tensor:
    """The output bias of the best constant predictor of L_len on these step-0 label tensors.

    Regression: the weighted mean of z; buckets: the log of the weighted bucket frequencies. The
    labels of later TTT steps are the same positions' labels shifted, so the TTT weights do not
    change it. A head started here predicts the mean target instead of z = 0 (one token) against
    targets of z = 4-6, and spends its steps on what the prompt says rather than on the offset.
    """
    z_sum, weight_sum, bucket_sums = 0.0, 0.0, None
    for step_labels in labels:
        step_labels = step_labels.reshape(1, -1)
        weights = weighting.position_weights(step_labels).double()
        mask = step_labels != NO_LABEL
        weights, remaining = weights[mask], step_labels[mask]
        z_sum += float((weights * torch.log1p(remaining.double())).sum())
        weight_sum += float(weights.sum())
        if bucket_edges is not None:
            counts = torch.bincount(bucket_index(remaining, bucket_edges), weights, len(bucket_edges) + 1)
            bucket_sums = counts if bucket_sums is None else bucket_sums + counts
    if weight_sum == 0:
        raise ValueError("no labelled position in the training data")
    if bucket_edges is None:
        return torch.tensor([z_sum / weight_sum])
    return torch.log((bucket_sums / weight_sum).clamp_min(1e-4)).float()


def constant_quantile_fit(labels: Iterable[torch.Tensor], levels: Sequence[float],
                          weighting: LengthWeighting) -> torch.Tensor:
    """The quantile head's starting z quantiles [K]: weighted quantiles of the step-0 labels' z."""
    z, weights = [], []
    for step_labels in labels:
        step_labels = step_labels.reshape(1, -1)
        mask = step_labels != NO_LABEL
        z.append(torch.log1p(step_labels[mask].double()))
        weights.append(weighting.position_weights(step_labels).double()[mask])
    z_all, weights_all = torch.cat(z) if z else torch.zeros(0), torch.cat(weights) if weights else torch.zeros(0)
    if weights_all.sum() == 0:
        raise ValueError("no labelled position in the training data")
    return constant_quantiles(z_all, weights_all, levels)


def l2_penalty(head: torch.nn.Module) -> torch.Tensor:
    """||theta||^2 over every parameter of a head (the length MLP, the quantile MLP)."""
    return sum((p.float() ** 2).sum() for p in head.parameters())


def total_loss(
    sd_loss: torch.Tensor,
    length_loss: torch.Tensor,
    l2: torch.Tensor,
    *,
    sd_loss_weight: float,
    length_loss_weight: float,
    length_l2_weight: float,
    quantile_loss: torch.Tensor | float = 0.0,
    quantile_loss_weight: float = 0.0,
) -> torch.Tensor:
    return (sd_loss_weight * sd_loss + length_loss_weight * length_loss + quantile_loss_weight * quantile_loss
            + length_l2_weight * l2)
