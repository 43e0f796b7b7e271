"""Which target depths the draft fuses, and the two ways of counting them.

OUTLETS names depths the way Hugging Face ``output_hidden_states`` counts them: index 0 is the
embedding output and index k is the output of decoder layer k (1-based). SpecForge and SGLang
name the same tensor "output of layer k - 1" (0-based layer ids). Keeping one conversion here is
what makes capture (transformers), training (SpecForge) and serving (SGLang) read the same
three tensors.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple


def default_fusion_layers(num_layers: int) -> Tuple[int, int, int]:
    """Outputs of layers {2, N/2, N-2} of an N-layer target, in hidden_states indices."""
    layers = (2, num_layers // 2, num_layers - 2)
    validate_fusion_layers(layers, num_layers)
    return layers


def validate_fusion_layers(layers: Sequence[int], num_layers: int) -> None:
    """Three distinct, increasing hidden_states indices in [1, N]."""
    layers = list(layers)
    if len(layers) != 3 or any(isinstance(k, bool) or not isinstance(k, int) for k in layers):
        raise ValueError(f"fusion_layers must be three integers, got {layers!r}")
    if not all(1 <= k <= num_layers for k in layers) or sorted(set(layers)) != layers:
        raise ValueError(
            f"fusion_layers={layers} must be three increasing hidden_states indices in [1, {num_layers}] "
            f"for a {num_layers}-layer target (index 0 is the embedding output); "
            f"the default is {[2, num_layers // 2, num_layers - 2]}"
        )


def to_specforge_layer_ids(layers: Sequence[int]) -> List[int]:
    """hidden_states index k is SpecForge's / SGLang's ``eagle_aux_hidden_state_layer_ids`` k - 1."""
    return [k - 1 for k in layers]
