"""In-process regeneration with transformers: batched, left-padded, stopping at the end of turn.

For CPU and small GPU runs. Batches are left-padded so every prompt ends at the same position and
the new tokens line up; each sequence's length is counted up to its first stop token.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Union

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList

from specforge_outlets.data.chat_tokens import generation_prompt_ids
from specforge_outlets.data.generation import (
    Messages, SamplingSettings, TurnError, TurnResult, context_overflow, turn_from_tokens,
)
from specforge_outlets.data.targets import resolve_target, stop_token_ids


class HFBackend:
    def __init__(self, target: str, settings: SamplingSettings, device: str = "cpu") -> None:
        path = resolve_target(target)
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        self.device = device
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token_id = self.stop_ids[0]
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        torch.manual_seed(settings.seed)

    def prompt_ids(self, messages: Messages) -> List[int]:
        return generation_prompt_ids(self.tokenizer, messages)

    def complete(self, batch: Sequence[Messages]) -> List[Union[TurnResult, TurnError]]:
        settings = self.settings
        prompts = [self.prompt_ids(messages) for messages in batch]
        answers: List[Union[TurnResult, TurnError, None]] = [None] * len(batch)
        runnable = []
        for index, ids in enumerate(prompts):
            answers[index] = context_overflow(len(ids), settings.max_new_tokens, self.context)
            if answers[index] is None:
                runnable.append(index)
        if runnable:
            encoded = self.tokenizer.pad({"input_ids": [prompts[i] for i in runnable]}, return_tensors="pt")
            sampling: dict[str, Any] = {"do_sample": False}
            if settings.temperature > 0:
                sampling = {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p}
            steps = tqdm(total=settings.max_new_tokens, desc="decode steps", unit="tok", leave=False)
            with torch.no_grad(), steps:
                output = self.model.generate(
                    input_ids=encoded["input_ids"].to(self.device),
                    attention_mask=encoded["attention_mask"].to(self.device),
                    max_new_tokens=settings.max_new_tokens,
                    repetition_penalty=settings.repetition_penalty,
                    eos_token_id=self.stop_ids,
                    pad_token_id=self.tokenizer.pad_token_id,
                    stopping_criteria=StoppingCriteriaList([_StepProgress(steps)]),
                    **sampling,
                )
            new_tokens = output[:, encoded["input_ids"].shape[1] :].tolist()
            for index, tokens in zip(runnable, new_tokens):
                answers[index] = self._turn(tokens)
        return answers  # type: ignore[return-value]

    def _turn(self, tokens: List[int]) -> TurnResult:
        return turn_from_tokens(tokens, self.stop_ids, self.settings.max_new_tokens,
                                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))


class _StepProgress(StoppingCriteria):
    """Never stops anything: ticks an inner progress bar per decoding step (batches run minutes on CPU)."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.bar.update(1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
