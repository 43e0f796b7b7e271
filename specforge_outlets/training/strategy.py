"""The ``eagle3-outlets`` training step: SpecForge's EAGLE-3 step plus the length objective.

``Eagle3TrainStrategy.forward_loss`` calls ``self.eagle3_model(**eagle3_inputs)`` and unpacks
seven outputs. For that one call we stand a :class:`LabelledCall` in its place, which passes the
batch's ``remaining_length`` to the OUTLETS model and keeps the extra :class:`LengthOutputs`, so
the EAGLE-3 step itself (target projection, compact teacher, TTT loss weights) is inherited
unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch
from specforge.training.strategies.base import Eagle3TrainStrategy, StepContext, StepOutput

from specforge_outlets.data.features import LENGTH_KEY, LOWER_BOUND_KEY
from specforge_outlets.training.ttt_with_length import LengthOutputs
from specforge_outlets.training.objective import LengthWeighting, fit_length, fit_quantiles, total_loss


class LabelledCall:
    """Stands in for the wrapped model during one EAGLE-3 step."""

    def __init__(self, model: torch.nn.Module, remaining_length: torch.Tensor,
                 remaining_lower_bound: Optional[torch.Tensor], drafting: bool, last_hidden_state: torch.Tensor):
        self.model = model
        self.last_hidden_state = last_hidden_state
        self.remaining_length = remaining_length
        self.remaining_lower_bound = remaining_lower_bound
        self.drafting = drafting
        self.length_outputs: Optional[LengthOutputs] = None

    def parameters(self):
        return self.model.parameters()

    def __call__(self, **eagle3_inputs):
        *eagle3_outputs, self.length_outputs = self.model(
            remaining_length=self.remaining_length, remaining_lower_bound=self.remaining_lower_bound,
            drafting=self.drafting, last_hidden_state=self.last_hidden_state, **eagle3_inputs
        )
        return tuple(eagle3_outputs)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The OUTLETS model inside a DDP/FSDP wrapper."""
    return model if hasattr(model, "draft_model") else model.module


class OutletsTrainStrategy(Eagle3TrainStrategy):
    name = "eagle3-outlets"
    required_features = Eagle3TrainStrategy.required_features | {LENGTH_KEY}

    def __init__(
        self,
        eagle3_model: torch.nn.Module,
        *,
        length_loss_weight: float,
        length_l2_weight: float,
        sd_loss_weight: float,
        length_weighting: str,
        length_static_weight: float,
        length_ttt_decay: float,
        length_censored: str,
        quantile_loss_weight: float = 0.0,
        **eagle3_options,
    ) -> None:
        super().__init__(eagle3_model, **eagle3_options)
        self.length_loss_weight = length_loss_weight
        self.length_l2_weight = length_l2_weight
        self.sd_loss_weight = sd_loss_weight
        self.weighting = LengthWeighting(length_weighting, length_static_weight, length_ttt_decay)
        self.one_sided = length_censored == "one_sided"
        self.quantile_loss_weight = quantile_loss_weight

    def forward_loss(self, batch, ctx: Optional[StepContext] = None) -> StepOutput:
        model = self.eagle3_model
        call = LabelledCall(model, batch.tensors[LENGTH_KEY], batch.tensors.get(LOWER_BOUND_KEY),
                            drafting=self.sd_loss_weight > 0, last_hidden_state=batch.tensors["target"])
        self.eagle3_model = call
        try:
            drafting = super().forward_loss(batch, ctx)
        finally:
            self.eagle3_model = model
        outputs = call.length_outputs
        draft = unwrap(model).draft_model
        fit = fit_length(draft.length_head, outputs.raw, outputs.labels, draft.outlets.bucket_edges, self.weighting,
                         lower_bounds=outputs.lower_bounds if self.one_sided else None)
        quantiles = None
        if outputs.quantile_raw is not None:
            quantiles = fit_quantiles(outputs.quantile_raw, outputs.labels, draft.quantile_head.levels, self.weighting,
                                      lower_bounds=outputs.lower_bounds if self.one_sided else None)
        loss = total_loss(
            drafting.loss,
            fit.loss,
            outputs.l2,
            sd_loss_weight=self.sd_loss_weight,
            length_loss_weight=self.length_loss_weight,
            length_l2_weight=self.length_l2_weight,
            quantile_loss=quantiles.loss if quantiles is not None else 0.0,
            quantile_loss_weight=self.quantile_loss_weight,
        )
        quantile_metrics = {} if quantiles is None else {
            f"quantile_coverage_q{round(100 * level)}": (covered, quantiles.count)
            for level, covered in zip(draft.quantile_head.levels, quantiles.covered_sums)}
        return StepOutput(
            loss=loss,
            metrics={
                **drafting.metrics,
                "total_loss": loss.detach(),  # SpecForge's own "loss" metric is the drafting loss
                "sd_loss": drafting.loss.detach(),
                "length_loss": fit.loss.detach(),
                "length_l2": outputs.l2.detach(),
                **({"quantile_loss": quantiles.loss.detach()} if quantiles is not None else {}),
            },
            ratio_metrics={
                **drafting.ratio_metrics,
                "length_mse": (fit.squared_error_sum, fit.count),
                "length_mae_tokens": (fit.abs_error_tokens_sum, fit.count),
                "length_static_mae_tokens": (fit.static_abs_error_tokens_sum, fit.static_count),
                **quantile_metrics,
            },
        )
