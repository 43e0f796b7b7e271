"""Which of the SGLang plugin's serving modes accept an ``outlets export``, and the server flags of each.

One rule for both sides: ``outlets export`` prints, from the config.json it wrote, the modes the
draft can serve in, and the plugin (``sglang_patches``) refuses a draft by the same functions, so
the printed flags cannot promise what a server then refuses. Imports neither torch nor SGLang: the
training environment, which has no SGLang, imports it too.

- **EAGLE-3** (``--speculative-algorithm EAGLE3 --speculative-draft-model-path DIR``): the length
  head is read on the draft state SGLang's speculative worker keeps, so only a ``head_input: draft``
  head fits (:func:`eagle3_refusal`).
- **predictor-only** (``--outlets-draft-path DIR``): either head, on a Llama-family target deep and wide
  enough for the fused layers (:func:`min_target_layers`, :func:`target_hidden_size`).

Both modes feed the draft the fused depths SGLang captures, so neither serves the last-layer
ablation (``target_features: last_layer``, :func:`target_features_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from specforge_outlets.model.draft_config import HeadInput, OutletsDraftConfig, TargetFeatures

EAGLE3 = "EAGLE-3"
PREDICTOR_ONLY = "predictor-only"
# What predictor-only mode's capture hooks into (sglang_patches/predictor_mode.py checks it at model load).
LLAMA_TARGET = "a Llama-family target (SGLang LlamaModel)"


def target_features_refusal(outlets: OutletsDraftConfig) -> Optional[str]:
    """Why no mode can feed this draft (both capture the fused depths), or None where they can."""
    if outlets.target_features is TargetFeatures.FUSED:
        return None
    return (f"outlets_config.target_features={outlets.target_features.value!r} is the training ablation: SGLang's "
            "capture gives the draft the fused depths, not the last layer; serve a draft trained on the fused "
            "features (target_features: fused)")


def eagle3_refusal(outlets: OutletsDraftConfig) -> Optional[str]:
    """Why EAGLE-3 mode cannot read this draft's length head, or None where it can."""
    refusal = target_features_refusal(outlets)
    if refusal is not None or outlets.head_input is HeadInput.DRAFT:
        return refusal
    return (f"outlets_config.head_input={outlets.head_input.value!r}: EAGLE-3 mode reads the length head on the draft "
            "state the speculative worker keeps, which a head trained on the fused target features cannot read. "
            "Train with head_input: draft, or use predictor-only mode (--outlets-draft-path, speculative decoding off).")


def min_target_layers(outlets: OutletsDraftConfig) -> int:
    """The fewest target layers predictor-only mode can read the fused depths from.

    SGLang captures a decoder layer's input, so hidden_states index N (the last layer's output) of
    an N-layer target cannot be read: the deepest fused index must lie below N."""
    return max(outlets.fusion_layers) + 1


def target_hidden_size(config: dict) -> Optional[int]:
    """The target hidden size the draft's fused features have (``target_hidden_size``, else the draft's own)."""
    size = config.get("target_hidden_size") or config.get("hidden_size")
    return None if size is None else int(size)


@dataclass(frozen=True)
class ServingMode:
    name: str
    flags: Tuple[str, ...]  # the server flags with the draft, besides --model-path
    needs: Optional[str]  # what the mode asks of the target beyond being the one the draft was trained on
    refusal: Optional[str]  # None: the plugin accepts the draft in this mode

    def line(self) -> str:
        if self.refusal is not None:
            return f"  {self.name}: refused: {self.refusal}"
        needs = f"\n      (TARGET: {self.needs})" if self.needs else ""
        return f"  {self.name}: {' '.join(self.flags)}{needs}"


def serving_modes(draft_dir: str, config: dict) -> List[ServingMode]:
    """Every serving mode, with the flags that serve the export at ``draft_dir`` (its config.json: ``config``)."""
    outlets = OutletsDraftConfig.from_dict(config["outlets_config"])
    hidden = target_hidden_size(config)
    width = f" and hidden size {hidden}" if hidden is not None else ""
    return [
        ServingMode(EAGLE3, ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft_dir,
                             "--schedule-policy", "outlets"),
                    None, eagle3_refusal(outlets)),
        ServingMode(PREDICTOR_ONLY, ("--schedule-policy", "outlets", "--outlets-draft-path", draft_dir,
                                     "--disable-radix-cache"),
                    f"{LLAMA_TARGET} with at least {min_target_layers(outlets)} layers{width}",
                    target_features_refusal(outlets)),
    ]


def describe(draft_dir: str, config: dict) -> str:
    """What ``outlets export`` prints: each mode's flags for ``sglang.launch_server``, or why it is refused."""
    ordered = sorted(serving_modes(draft_dir, config), key=lambda mode: mode.refusal is not None)  # accepted first
    header = ("serve it with the OUTLETS plugin: python -m sglang.launch_server --model-path TARGET (the target "
              "it was trained on) and one mode's flags:")
    return "\n".join([header] + [mode.line() for mode in ordered])
