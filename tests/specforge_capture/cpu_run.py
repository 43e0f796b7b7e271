"""Run SpecForge 0.2.0's own ``scripts/prepare_hidden_states.py`` on the CPU.

    python tests/specforge_capture/cpu_run.py --workdir DIR [the script's arguments]

The script (``scripts/prepare_hidden_states.py`` of the SpecForge checkout named by
``$SPECFORGE_CHECKOUT``, unchanged; never copied into this repository) runs as written:
its argument parser, the draft config and capture-layer resolution, SpecForge's dataset build (chat
template, loss mask, ``--max-length`` cut), the vocabulary mapping, the ``rows_<a>-<b>/data_<i>``
file layout and ``--compress``. Three things stand in for the GPU, and nothing else:

- the process group is gloo on the CPU (``SPECFORGE_DEVICE=cpu``): one rank when run alone, or the
  ranks of ``python -m torch.distributed.run --nproc_per_node R`` running this file;
- ``.cuda()`` and ``torch.tensor(..., device="cuda")`` stay on the CPU;
- SGLang's capture backend (``specforge.offline_capture.sglang_backend``, a GPU model runner of
  sglang 0.5.14) is replaced by transformers on the same weights, returning what it returns: per
  sequence, the input of each captured layer (SGLang's Llama captures ``layer_id + 1``) concatenated,
  and the final normed hidden state, over the whole padded row as SGLang sees it.

The script is copied into ``--workdir`` first: it writes its dataset cache beside its own parent folder.
"""

from __future__ import annotations

import os
import runpy
import shutil
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# SpecForge's PyPI package (wheel and sdist) ships no scripts/: the script comes from a checkout.
CHECKOUT_VARIABLE = "SPECFORGE_CHECKOUT"


def specforge_script() -> str | None:
    """SpecForge's own prepare_hidden_states.py, if ``$SPECFORGE_CHECKOUT`` names a checkout holding it."""
    checkout = os.environ.get(CHECKOUT_VARIABLE)
    script = os.path.join(checkout, "scripts", "prepare_hidden_states.py") if checkout else None
    return script if script and os.path.isfile(script) else None


class TransformersCaptureBackend:
    """What ``OfflineSGLangCaptureBackend`` returns, computed with transformers on the CPU."""

    def __init__(self, path: str, dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype).eval()
        self.layers = None

    def set_capture_layers(self, layer_ids, *, capture_method: str) -> None:
        if capture_method != "eagle3":
            raise ValueError(f"this stand-in captures eagle3 layers only, got {capture_method!r}")
        self.layers = [layer + 1 for layer in layer_ids]  # SGLang's set_eagle3_layers_to_capture

    def capture(self, *, input_ids, attention_mask, loss_mask):
        import torch

        data, aux_rows, last_rows = [], [], []
        with torch.no_grad():
            for row in range(input_ids.shape[0]):
                states = self.model(input_ids[row : row + 1], output_hidden_states=True).hidden_states
                aux_rows.append(torch.cat([states[layer][0] for layer in self.layers], dim=-1))
                last_rows.append(states[-1][0])
                data.append((input_ids[row : row + 1], attention_mask[row : row + 1], loss_mask[row : row + 1]))
        return data, aux_rows, last_rows


def _cpu_only() -> None:
    import torch

    from specforge.offline_capture import sglang as offline

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    make = torch.tensor

    def tensor(*args, device=None, **kwargs):
        return make(*args, device=None if device == "cuda" else device, **kwargs)

    torch.tensor = tensor

    def from_pretrained(cls, path, *, torch_dtype=None, trust_remote_code=False, **sglang_kwargs):
        return cls(TransformersCaptureBackend(path, torch_dtype))

    offline.OfflineSGLangCapture.from_pretrained = classmethod(from_pretrained)


def main(argv) -> None:
    workdir = argv[argv.index("--workdir") + 1]
    argv = argv[: argv.index("--workdir")] + argv[argv.index("--workdir") + 2 :]
    scripts = os.path.join(workdir, "scripts")
    os.makedirs(scripts, exist_ok=True)
    script = shutil.copy(specforge_script(), scripts)
    if "RANK" not in os.environ:  # run alone: one rank; under torch.distributed.run: its ranks
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    os.environ["SPECFORGE_DEVICE"] = "cpu"
    _cpu_only()
    os.chdir(workdir)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
