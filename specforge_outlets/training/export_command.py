"""``outlets export``: a training checkpoint -> a draft directory SGLang loads as an EAGLE-3 draft.

``config.json`` (architecture ``OutletsLlamaForCausalLMEagle3``, with ``outlets_config`` naming
the fusion layers and head shape) + ``model.safetensors`` holding the EAGLE-3 weights, the gate
and the length head. SpecForge's exporter accepts ``eagle3`` checkpoints only, so this command
composes its pieces: state resolution, key validation, serving-key checks, rope fix-up. After
writing, the command prints the plugin's serving modes that accept the export and each one's server
flags (``specforge_outlets.model.draft_modes``), so a head that EAGLE-3 mode refuses is known here.
"""

from __future__ import annotations

import json
import os

from specforge_outlets.errors import OutletsError
from specforge_outlets.model.draft_config import DRAFT_CONFIG_FILE
from specforge_outlets.model.draft_modes import describe


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a training checkpoint as an SGLang-loadable OUTLETS draft directory",
    )
    parser.add_argument("--checkpoint", required=True, help="run output_dir, checkpoint dir or training_state.pt")
    parser.add_argument("--output", required=True, help="directory to write (config.json + model.safetensors)")
    parser.add_argument("--draft-config", default=None,
                        help=f"draft config JSON (default: {DRAFT_CONFIG_FILE} written by `outlets train`)")
    parser.set_defaults(func=run)


def find_draft_config(checkpoint: str) -> str:
    """``draft_config.json`` in the checkpoint path or the run directory above it."""
    path = os.path.abspath(checkpoint.removeprefix("file://"))
    for directory in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        candidate = os.path.join(directory, DRAFT_CONFIG_FILE)
        if os.path.isfile(candidate):
            return candidate
    raise OutletsError(
        f"no {DRAFT_CONFIG_FILE} next to {checkpoint}; pass --draft-config (the run's output_dir has it)"
    )


def export_draft(checkpoint: str, output: str, draft_config_path: str | None = None) -> str:
    from specforge.export.checkpoint_io import apply_legacy_rope_scaling, materialize_draft, resolve_training_state
    from specforge.export.to_sglang import _serving_state

    import specforge_outlets.model.draft  # noqa: F401  (registers the draft architecture)
    from specforge_outlets.training.algorithm import ALGORITHM_NAME

    try:
        state = resolve_training_state(checkpoint)
    except (FileNotFoundError, ValueError) as exc:
        raise OutletsError(f"--checkpoint {checkpoint}: {exc}") from None
    if state.get("strategy") != ALGORITHM_NAME:
        raise OutletsError(
            f"--checkpoint {checkpoint} was trained with strategy {state.get('strategy')!r}; `outlets export` "
            f"exports '{ALGORITHM_NAME}' drafts (use `specforge export` for plain EAGLE-3)"
        )
    weights = state["draft_state_dict"]
    model = materialize_draft(state, draft_config_path or find_draft_config(checkpoint))
    dtype = next(iter(v for k, v in weights.items() if v.is_floating_point())).dtype
    model = model.to(dtype)
    model.load_state_dict(weights, strict=False)  # exact values: materialize_draft builds in bfloat16
    serving = _serving_state(
        {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}, weight_map={}
    )
    tmp = f"{output.rstrip(os.sep)}.tmp-{os.getpid()}"
    model.save_pretrained(tmp, state_dict=serving)
    apply_legacy_rope_scaling(tmp)
    if os.path.exists(output):
        raise OutletsError(f"--output {output} already exists; choose a new directory")
    os.replace(tmp, output)
    return output


def run(args) -> int:
    out = export_draft(args.checkpoint, args.output, args.draft_config)
    print(f"exported OUTLETS draft to {out}")
    with open(os.path.join(out, "config.json")) as handle:
        print(describe(out, json.load(handle)))  # the plugin's own rule: what it accepts, as written
    return 0
