"""Instruction-based baseline (PIA-style: "perception in advance").

Before answering, the target itself is asked how many tokens its answer will take: the request's
last user turn is followed by a fixed instruction, the assistant turn is started with a fixed
prefix (``ANSWER_PREFIX``) that the target continues greedily for a few tokens,
and the first integer of the answer is the prediction. Answers without a positive integer count
as the training median; how many there were is reported (``info.unparseable``). Predictions are
clipped to the generation's ``max_new_tokens`` (no response can be longer; ``info.clipped`` says
how many answers were above it), so one absurd answer cannot dominate the MAE. Static only.
"""

from __future__ import annotations

import re
from typing import List, Optional

import numpy as np
import torch
from tqdm import tqdm

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.predictor_api import Prediction, Predictor
from specforge_outlets.evaluation.requests import Request, Split

INSTRUCTION = (
    "\n\nDo not answer the request above yet. Estimate how many tokens your answer to it will take "
    "and reply with only that number."
)
# The answer is started for the model, so that a small target continues with a number instead of
# answering the request itself (SmolLM2-135M ignores the bare instruction most of the time).
ANSWER_PREFIX = "Estimated length of my answer, in tokens:"
MAX_NEW_TOKENS = 12
BATCH = 8
MAX_PLAUSIBLE = 100_000  # larger "estimates" are echoes of numbers in the prompt, not estimates
_NUMBER = re.compile(r"\d[\d,]*")


def parse_estimate(text: str) -> Optional[float]:
    """The first positive integer in ``text`` (thousands separators allowed), else ``None``."""
    match = _NUMBER.search(text)
    if not match:
        return None
    digits = match.group(0).replace(",", "")
    if not digits:
        return None
    value = int(digits)
    return float(value) if 0 < value <= MAX_PLAUSIBLE else None


def asking_messages(request: Request) -> List[dict]:
    messages = [dict(turn) for turn in request.messages]
    last = max(i for i, turn in enumerate(messages) if turn["role"] == "user")
    messages[last]["content"] = messages[last]["content"] + INSTRUCTION
    return messages


class InstructionPredictor(Predictor):
    name = "pia"
    description = "the target asked, before answering, how many tokens its answer will take (PIA-style); unparseable -> training median"

    def fit(self, train: Split) -> None:
        self.median = float(np.median(train.lengths))

    def _load(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from specforge_outlets.data.targets import end_of_turn_token_id

        if not self.context.target_path:
            raise OutletsError("the pia baseline asks the target model: pass --target")
        tokenizer = AutoTokenizer.from_pretrained(self.context.target_path)
        if not tokenizer.chat_template:
            raise OutletsError(f"--target {self.context.target_path}: the tokenizer has no chat template (pia needs one)")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(self.context.target_path, dtype=torch.float32)
        model = model.to(self.context.device).eval()
        return tokenizer, model, end_of_turn_token_id(tokenizer, model.generation_config)

    def check(self, test: Split) -> None:
        test.require_messages(self.name)
        if self.context.max_new_tokens is None:
            raise OutletsError(
                "the pia baseline clips its estimates to the generation limit, which is unknown: pass "
                "--max-new-tokens (the regeneration's), or keep the `outlets regenerate` summary "
                "(<output>.summary.json) next to the JSONL the test manifest names"
            )

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        self.check(test)
        limit = self.context.max_new_tokens
        tokenizer, model, end_id = self._load()
        prompts = [
            tokenizer.apply_chat_template(asking_messages(request), tokenize=False, add_generation_prompt=True)
            + ANSWER_PREFIX
            for request in test.requests
        ]
        answers: List[str] = []
        for start in tqdm(range(0, len(prompts), BATCH), desc="pia: ask the target", unit="batch",
                          disable=not self.context.progress, leave=False):
            batch = tokenizer(prompts[start : start + BATCH], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(self.context.device)
            output = model.generate(**batch, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=end_id,
                                    pad_token_id=tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None)
            new = output[:, batch["input_ids"].shape[1] :]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
        estimates = [parse_estimate(answer) for answer in answers]
        unparseable = [i for i, value in enumerate(estimates) if value is None]
        clipped = sum(value is not None and value > limit for value in estimates)
        self.info.update(
            instruction=INSTRUCTION.strip(),
            answer_prefix=ANSWER_PREFIX,
            unparseable=len(unparseable),
            parsed=len(estimates) - len(unparseable),
            fallback=self.median,
            max_new_tokens=limit,
            clipped=clipped,
            examples=[{"id": test.requests[i].id, "answer": answers[i]} for i in range(min(5, len(answers)))],
        )
        return [Prediction(min(self.median if value is None else value, float(limit))) for value in estimates]
