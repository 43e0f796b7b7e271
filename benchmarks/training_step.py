"""Seconds per training step: SpecForge's EAGLE-3 step as the CPU recipe ran it, against the cheap step.

Side by side in one process, on the same batches, repetitions interleaved (medians), one thread,
the SmolLM2-135M draft of recipes/drafts/smollm2-135m-outlets.json (vocabulary 49,152, draft
vocabulary 8,192, TTT length 3), forward and backward of one optimizer step's conversations:

- ``specforge fp32``: SpecForge's step (full target head at every position, draft LM head and loss
  at every position, its TTT attention), float32, batch 2 (the recipe before);
- ``specforge bf16``: the same in bfloat16;
- ``cut bf16``: the OUTLETS step with the cuts (training/loss_rows.py, model/ttt_attention.py,
  SpecForge's compact teacher), bfloat16, 2 conversations of batch 1 (the recipe now);
- ``cut bf16 LP-only``: the same with the drafting loss weighed 0 (nothing of drafting is computed).

A conversation is ``--prompt-share`` prompt and the rest response (loss rows); batch 2 pads the
shorter of the pair, ``--pad-share`` of T (47% more positions on random pairs of the label set).

    .venv/bin/python benchmarks/training_step.py --output benchmarks/data/training-step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Dict, List

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DRAFT_CONFIG = os.path.join(HERE, "..", "recipes", "drafts", "smollm2-135m-outlets.json")
TTT = 3
CONFIGS = ("specforge fp32", "specforge bf16", "cut bf16", "cut bf16 LP-only")


def make_draft(dtype: torch.dtype):
    from transformers import LlamaConfig

    from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
    from specforge_outlets.training.settings import OutletsSettings

    with open(DRAFT_CONFIG, encoding="utf-8") as handle:
        config = LlamaConfig(**json.load(handle))
    config.outlets_config = OutletsSettings().draft_config(config.hidden_size, 30).to_dict()
    torch.manual_seed(0)
    draft = OutletsLlamaForCausalLMEagle3(config, attention_backend="sdpa").to(dtype)
    draft.t2d.zero_()
    draft.t2d[torch.randperm(config.vocab_size)[:config.draft_vocab_size].sort().values] = True
    draft.d2t.copy_(torch.nonzero(draft.t2d).flatten() - torch.arange(config.draft_vocab_size))
    return draft


def conversation_batch(seq_len: int, lengths: List[int], prompt_share: float, hidden: int, vocab: int):
    """A batch of len(lengths) conversations padded to ``seq_len``; each ``prompt_share`` prompt."""
    from specforge.runtime.contracts import TrainBatch

    from specforge_outlets.data.labels import NO_LABEL

    generator = torch.Generator().manual_seed(seq_len)
    batch = len(lengths)
    attention = torch.zeros(batch, seq_len, dtype=torch.long)
    loss_mask = torch.zeros(batch, seq_len, dtype=torch.long)
    remaining = torch.full((batch, seq_len), NO_LABEL)
    for row, length in enumerate(lengths):
        prompt = int(prompt_share * length)
        attention[row, :length] = 1
        loss_mask[row, prompt:length] = 1
        remaining[row, prompt:length] = torch.arange(length - prompt, 0, -1)
    return TrainBatch(
        sample_ids=[str(i) for i in range(batch)], strategy="eagle3-outlets",
        tensors={"input_ids": torch.randint(0, vocab, (batch, seq_len), generator=generator) * attention,
                 "attention_mask": attention, "loss_mask": loss_mask,
                 "hidden_state": torch.randn(batch, seq_len, 3 * hidden, generator=generator).bfloat16(),
                 "target": torch.randn(batch, seq_len, hidden, generator=generator).bfloat16(),
                 "remaining_length": remaining},
        metadata={"target_repr": "hidden_state"})


def in_dtype(batch, dtype: torch.dtype):
    """The batch as the offline normaliser hands it to a run of ``dtype`` (features stored in bfloat16)."""
    from dataclasses import replace

    tensors = {key: value.to(dtype) if value.is_floating_point() else value for key, value in batch.tensors.items()}
    return replace(batch, tensors=tensors)


def step_runner(name: str, target: str) -> Callable[[list], None]:
    """One optimizer step's forward and backward over ``batches`` for configuration ``name``."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaAttention
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.strategies.base import Eagle3TrainStrategy

    from specforge_outlets.training.ttt_with_length import OutletsEagle3Model
    from specforge_outlets.training.settings import OutletsSettings
    from specforge_outlets.training.strategy import OutletsTrainStrategy

    dtype = torch.float32 if "fp32" in name else torch.bfloat16
    draft = make_draft(dtype)
    head = TargetHead(target).to(dtype)
    head.fc.weight.data.normal_(0, 0.02)
    if name.startswith("specforge"):
        draft.midlayer.self_attn.__class__ = LlamaAttention
        strategy = Eagle3TrainStrategy(OnlineEagle3Model(draft, length=TTT, attention_backend="sdpa"), target_head=head)
    else:
        settings = OutletsSettings(sd_loss_weight=0.0 if "LP-only" in name else 1.0)
        model = OutletsEagle3Model(draft_model=draft, length=TTT, attention_backend="sdpa")
        strategy = OutletsTrainStrategy(model, target_head=head, compact_teacher=True, **settings.objective_options())

    def run(batches: list) -> None:
        for batch in batches:
            strategy.forward_loss(in_dtype(batch, dtype)).loss.backward()
        draft.zero_grad(set_to_none=True)

    return run


def measure(args: argparse.Namespace) -> Dict[str, object]:
    from specforge_outlets.data.targets import resolve_target
    from specforge_outlets.training.cpu_loss import install_cpu_loss
    from specforge_outlets.training.loss_rows import install_loss_row_teacher

    torch.set_num_threads(1)
    install_cpu_loss()
    install_loss_row_teacher()
    target = resolve_target(args.target)
    with open(DRAFT_CONFIG, encoding="utf-8") as handle:
        config = json.load(handle)
    runners = {name: step_runner(name, target) for name in CONFIGS}
    results: Dict[str, object] = {"repetitions": args.repetitions, "prompt_share": args.prompt_share,
                                  "pad_share": args.pad_share, "threads": 1, "seconds": {}}
    for seq_len in args.seq_lens:
        short = int(seq_len * (1 - args.pad_share))
        shape = dict(prompt_share=args.prompt_share, hidden=config["hidden_size"], vocab=config["vocab_size"])
        padded = [conversation_batch(seq_len, [seq_len, short], **shape)]
        single = [conversation_batch(seq_len, [seq_len], **shape), conversation_batch(short, [short], **shape)]
        times: Dict[str, List[float]] = {name: [] for name in CONFIGS}
        for repetition in range(args.repetitions + 1):  # the first round warms up, unrecorded
            order = CONFIGS if repetition % 2 == 0 else tuple(reversed(CONFIGS))
            for name in order:
                start = time.perf_counter()
                runners[name](padded if name.startswith("specforge") else single)
                if repetition:
                    times[name].append(time.perf_counter() - start)
                print(f"T={seq_len} {name}: {time.perf_counter() - start:.2f} s", flush=True)
        results["seconds"][str(seq_len)] = {name: statistics.median(values) for name, values in times.items()}
    return results


def report(results: Dict[str, object]) -> str:
    lines = ["| configuration | " + " | ".join(f"T = {t} (s / step)" for t in results["seconds"]) + " | speed-up |",
             "|---|" + "---|" * (len(results["seconds"]) + 1)]
    for name in CONFIGS:
        cells = [f"{results['seconds'][t][name]:.2f}" for t in results["seconds"]]
        speedups = [results["seconds"][t]["specforge fp32"] / results["seconds"][t][name] for t in results["seconds"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + " / ".join(f"{s:.1f}x" for s in speedups) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(HERE, "data", "training-step"))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--prompt-share", type=float, default=0.25, help="share of a conversation that is prompt")
    parser.add_argument("--pad-share", type=float, default=0.64,
                        help="share of T that batch 2 pads (0.64: 47%% more positions than the two conversations, "
                             "as on random pairs of the label set)")
    parser.add_argument("--target", default="smollm2-135m", help="target whose head shape is used")
    args = parser.parse_args()
    results = measure(args)
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "result.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    with open(os.path.join(args.output, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
