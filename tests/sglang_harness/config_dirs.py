"""Model directories holding only the ``config.json`` that the plugin's start-up checks read (no weights)."""

import json


def write_export(directory, fusion=(2, 3, 4), hidden=32, levels=None, target_features="fused") -> str:
    """An ``outlets export`` directory: its fusion layers, hidden size, target features and, if given, quantile
    levels; empty weights."""
    directory.mkdir()
    outlets = {"fusion_layers": list(fusion), "head_input": "draft", "gated_attention": True,
               "head_widths": [hidden, hidden // 2, hidden // 4], "bucket_edges": None,
               "target_features": target_features}
    if levels is not None:
        outlets["quantile_levels"] = list(levels)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["OutletsLlamaForCausalLMEagle3"], "hidden_size": hidden, "outlets_config": outlets}))
    (directory / "model.safetensors").write_bytes(b"")
    return str(directory)


def write_target(directory, layers=6, hidden=32) -> str:
    """A target model directory: its layer count and hidden size."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": hidden}))
    return str(directory)
