"""The recipe's ``outlets:`` block: the objective's weights and the shape of the additions.

SpecForge validates every other block of the recipe and rejects unknown keys, so this block is
removed (and validated here, just as strictly) before SpecForge sees the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from specforge_outlets.data.fusion_layers import default_fusion_layers, validate_fusion_layers
from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft_config import HeadInput, OutletsDraftConfig, QuantileMode, TargetFeatures
from specforge_outlets.model.quantile_head import check_levels

HEAD_TYPES = ("regression", "buckets")
BIAS_INITS = ("mean", "zero")
WEIGHTINGS = ("per_response", "pooled")  # see training.objective.LengthWeighting
# Censored training responses: left out, or fitted one-sided (training.objective.fit_length, and
# evaluation.heads.fit_head for the learned baselines of `outlets eval --censored-training`).
CENSORED_TARGETS = ("drop", "one_sided")
NUMBERS = ("length_loss_weight", "length_l2_weight", "sd_loss_weight", "length_static_weight", "length_ttt_decay",
           "length_head_lr_scale", "quantile_loss_weight")
DEFAULT_BUCKET_EDGES = (32, 64, 128, 256, 512, 1024)  # tokens; used only by head_type: buckets


@dataclass(frozen=True)
class OutletsSettings:
    """L = sd_loss_weight * L_SD + length_loss_weight * L_len + length_l2_weight * ||theta_len||^2.

    The ``length_*`` training settings make the head learn from the prompt: with the
    pooled weighting and a zero bias it predicted about the same length for every request. The
    old set-up is ``length_weighting: pooled, length_static_weight: 0, length_ttt_decay: 1,
    length_bias_init: zero, length_head_lr_scale: 1``; docs/training.md has the measured difference.
    """

    length_loss_weight: float = 0.1  # lambda; 0 is the SD-only ablation
    length_l2_weight: float = 1e-5  # gamma, L2 over the length MLP only
    sd_loss_weight: float = 1.0  # 0 is the LP-only ablation (no drafting loss)
    gated_attention: bool = True  # false: plain EAGLE-3 attention (ablation)
    head_input: HeadInput = HeadInput.DRAFT
    target_features: TargetFeatures = TargetFeatures.FUSED  # last_layer: the draft reads the last layer alone (ablation)
    head_type: str = "regression"  # "buckets": classification over length buckets (ablation)
    head_widths: Optional[Tuple[int, ...]] = None  # None: (H, H/2, H/4)
    bucket_edges: Tuple[int, ...] = DEFAULT_BUCKET_EDGES
    fusion_layers: Optional[Tuple[int, int, int]] = None  # None: (2, N/2, N-2), hidden_states indices
    # how L_len weighs positions (training.objective.LengthWeighting): each response counts once,
    # its static position (r_hat_0) once more, TTT step k by length_ttt_decay ** k
    length_weighting: str = "per_response"  # "pooled": every labelled position alike (the old loss)
    length_static_weight: float = 1.0
    length_ttt_decay: float = 0.5  # 1: steps alike (the old loss); 0: step 0 only
    length_bias_init: str = "mean"  # output bias = best constant fit of the training labels; "zero": none
    length_head_lr_scale: float = 10.0  # the head's learning rate over training.learning_rate (1: the old)
    # responses cut by the token limit: "one_sided" trains their positions to predict at least the
    # tokens still to come (remaining >= c - t); "drop" leaves them out of L_len
    length_censored: str = "drop"
    # the quantile head (model/quantile_head.py): z quantiles at these levels, pinball loss weighted
    # like L_len (same positions, weights and censoring); None: no quantile head
    quantile_levels: Optional[Tuple[float, ...]] = None
    quantile_loss_weight: float = 0.1
    quantile_mode: QuantileMode = QuantileMode.JOINT

    def __post_init__(self) -> None:
        for name in ("length_loss_weight", "length_l2_weight", "sd_loss_weight", "length_static_weight",
                     "quantile_loss_weight"):
            if getattr(self, name) < 0:
                raise OutletsError(f"outlets.{name} must be >= 0, got {getattr(self, name)}")
        if self.length_loss_weight == 0 and self.sd_loss_weight == 0:
            raise OutletsError("outlets.length_loss_weight and outlets.sd_loss_weight are both 0: nothing to train")
        for name, kind in (("head_input", HeadInput), ("quantile_mode", QuantileMode),
                           ("target_features", TargetFeatures)):
            try:
                object.__setattr__(self, name, kind(getattr(self, name)))
            except ValueError:
                raise OutletsError(f"outlets.{name} must be one of {tuple(member.value for member in kind)}, "
                                   f"got {getattr(self, name)!r}") from None
        if self.head_type not in HEAD_TYPES:
            raise OutletsError(f"outlets.head_type must be one of {HEAD_TYPES}, got {self.head_type!r}")
        if self.length_weighting not in WEIGHTINGS:
            raise OutletsError(f"outlets.length_weighting must be one of {WEIGHTINGS}, got {self.length_weighting!r}")
        if self.length_head_lr_scale <= 0:
            raise OutletsError(f"outlets.length_head_lr_scale must be > 0, got {self.length_head_lr_scale}")
        if not 0 <= self.length_ttt_decay <= 1:
            raise OutletsError(f"outlets.length_ttt_decay must be in [0, 1], got {self.length_ttt_decay}")
        if self.length_censored not in CENSORED_TARGETS:
            raise OutletsError(f"outlets.length_censored must be one of {CENSORED_TARGETS}, got {self.length_censored!r}")
        if self.length_bias_init not in BIAS_INITS:
            raise OutletsError(f"outlets.length_bias_init must be one of {BIAS_INITS}, got {self.length_bias_init!r}")
        if self.quantile_levels is not None:
            try:
                check_levels(self.quantile_levels)
            except ValueError as exc:
                raise OutletsError(f"outlets.quantile_levels: {exc}") from None
        edges = list(self.bucket_edges)
        if not edges or edges != sorted(set(edges)) or edges[0] <= 0:
            raise OutletsError(f"outlets.bucket_edges must be increasing positive token counts, got {edges}")

    @classmethod
    def from_mapping(cls, raw: Optional[Mapping[str, Any]]) -> "OutletsSettings":
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise OutletsError(f"unknown key(s) outlets.{', outlets.'.join(unknown)}; valid keys: {sorted(known)}")
        for name in ("head_widths", "bucket_edges", "fusion_layers"):
            if raw.get(name) is not None:
                raw[name] = tuple(int(v) for v in raw[name])
        if raw.get("quantile_levels") is not None:
            try:
                raw["quantile_levels"] = tuple(float(v) for v in raw["quantile_levels"])
            except (TypeError, ValueError):
                raise OutletsError(f"outlets.quantile_levels must be a list of numbers in (0, 1), got "
                                   f"{raw['quantile_levels']!r}") from None
        for name in NUMBERS:
            if name in raw:
                try:
                    raw[name] = float(raw[name])
                except (TypeError, ValueError):
                    raise OutletsError(f"outlets.{name} must be a number, got {raw[name]!r}") from None
        if "gated_attention" in raw and not isinstance(raw["gated_attention"], bool):
            raise OutletsError(f"outlets.gated_attention must be true or false, got {raw['gated_attention']!r}")
        return cls(**raw)

    def draft_config(self, hidden_size: int, target_layers: int) -> OutletsDraftConfig:
        """The ``outlets_config`` block for a draft of ``hidden_size`` on a ``target_layers``-deep target."""
        fusion = self.fusion_layers or default_fusion_layers(target_layers)
        try:
            validate_fusion_layers(fusion, target_layers)
        except ValueError as exc:
            raise OutletsError(f"outlets.fusion_layers: {exc}") from None
        widths = self.head_widths or (hidden_size, hidden_size // 2, hidden_size // 4)
        if widths[0] != hidden_size or any(w <= 0 for w in widths):
            raise OutletsError(
                f"outlets.head_widths={list(widths)} must start at the draft hidden size {hidden_size} "
                "and stay positive"
            )
        return OutletsDraftConfig(
            fusion_layers=tuple(fusion),
            gated_attention=self.gated_attention,
            head_input=self.head_input,
            head_widths=tuple(widths),
            bucket_edges=tuple(self.bucket_edges) if self.head_type == "buckets" else None,
            quantile_levels=self.quantile_levels,
            quantile_mode=self.quantile_mode,
            target_features=self.target_features,
        )

    def objective_options(self) -> Dict[str, Any]:
        """The settings the training step needs (recorded in SpecForge's resume contract)."""
        return {
            "length_loss_weight": self.length_loss_weight,
            "length_l2_weight": self.length_l2_weight,
            "sd_loss_weight": self.sd_loss_weight,
            "length_weighting": self.length_weighting,
            "length_static_weight": self.length_static_weight,
            "length_ttt_decay": self.length_ttt_decay,
            "length_censored": self.length_censored,
            "quantile_loss_weight": self.quantile_loss_weight,
        }
