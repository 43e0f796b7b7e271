"""``outlets_config``: the block of the draft's config.json that shapes the OUTLETS additions.

It travels with every checkpoint and export, so a loader (PyTorch, SGLang plugin) rebuilds the
exact gate and head without the training recipe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum, StrEnum
from typing import Any, Dict, Optional, Tuple

# The run's resolved draft config (SpecForge's, with ``outlets_config``): `outlets train` writes it
# into the run's output_dir, next to the checkpoints; `outlets export` and the wandb run config read it.
DRAFT_CONFIG_FILE = "draft_config.json"


class HeadInput(StrEnum):
    """What the length head reads."""

    DRAFT = "draft"  # the draft decoder's output (the method)
    FUSED = "fused"  # the fused target features, no draft decoder (ablation)


class TargetFeatures(StrEnum):
    """Which target features the draft reads (``model/target_features.py``)."""

    FUSED = "fused"  # three depths, EAGLE-3's fusion (the method)
    LAST_LAYER = "last_layer"  # the last layer alone, as EAGLE-1/2 drafted (ablation)


class QuantileMode(StrEnum):
    """How the quantile head trains."""

    JOINT = "joint"  # its loss reaches the draft, weighted like the length loss
    DETACHED = "detached"  # the gradient stops at the draft state, so drafting is as without the head


@dataclass(frozen=True)
class OutletsDraftConfig:
    fusion_layers: Tuple[int, int, int]  # target depths, Hugging Face hidden_states indices
    gated_attention: bool
    head_input: HeadInput
    head_widths: Tuple[int, ...]  # MLP widths before the output layer, e.g. (H, H/2, H/4)
    bucket_edges: Optional[Tuple[int, ...]]  # None: regression on log(1 + r); else bucket classes
    quantile_levels: Optional[Tuple[float, ...]] = None  # None: no quantile head (model/quantile_head.py)
    quantile_mode: QuantileMode = QuantileMode.JOINT
    target_features: TargetFeatures = TargetFeatures.FUSED
    # per level, z shifts the served quantiles add (the split-conformal correction of fit-quantile-head); None: none
    quantile_shifts: Optional[Tuple[float, ...]] = None

    def __post_init__(self) -> None:  # a value read from JSON becomes its enum member; ValueError if it is none
        object.__setattr__(self, "head_input", HeadInput(self.head_input))
        object.__setattr__(self, "target_features", TargetFeatures(self.target_features))
        if self.quantile_shifts is not None and len(self.quantile_shifts) != len(self.quantile_levels or ()):
            raise ValueError(f"outlets_config.quantile_shifts {list(self.quantile_shifts)} needs one shift per "
                             f"quantile level {list(self.quantile_levels or ())}")
        object.__setattr__(self, "quantile_mode", QuantileMode(self.quantile_mode))

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "OutletsDraftConfig":
        edges, levels = raw.get("bucket_edges"), raw.get("quantile_levels")
        return cls(
            fusion_layers=tuple(raw["fusion_layers"]),
            gated_attention=bool(raw["gated_attention"]),
            head_input=raw["head_input"],
            head_widths=tuple(raw["head_widths"]),
            bucket_edges=tuple(edges) if edges is not None else None,
            quantile_levels=tuple(float(level) for level in levels) if levels is not None else None,
            quantile_mode=raw.get("quantile_mode", QuantileMode.JOINT),
            target_features=raw.get("target_features", TargetFeatures.FUSED),
            quantile_shifts=(tuple(float(shift) for shift in raw["quantile_shifts"])
                             if raw.get("quantile_shifts") is not None else None),
        )

    def to_dict(self) -> Dict[str, Any]:
        raw = asdict(self)
        return {key: list(value) if isinstance(value, tuple) else value.value if isinstance(value, Enum) else value
                for key, value in raw.items()}

    @property
    def head_outputs(self) -> int:
        return 1 if self.bucket_edges is None else len(self.bucket_edges) + 1


def read_outlets_config(config: Any) -> OutletsDraftConfig:
    """The draft config's ``outlets_config`` block, or a clear error for a plain EAGLE-3 config."""
    raw = getattr(config, "outlets_config", None)
    if not raw:
        from specforge_outlets.errors import OutletsError

        raise OutletsError(
            "draft config has no 'outlets_config' block: it is a plain EAGLE-3 draft without a "
            "length head; train it with `outlets train` (training.strategy: eagle3-outlets)"
        )
    return OutletsDraftConfig.from_dict(dict(raw))
