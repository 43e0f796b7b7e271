"""Small-LM bucket classifier (the ranking/classification proxy family: LTR, ShuffleInfer).

A frozen small causal LM reads the prompt; a linear head over its mean-pooled last hidden state is
trained with cross-entropy to pick the output-length bucket (``heads.fit_head``); the prediction
is the bucket's geometric centre. The buckets are OUTLETS' own bucket head's (the default
``outlets.bucket_edges``, centres from ``model.length_head``): ``[1,32), [32,64), ..., [512,1024),
[1024,2048)``, lengths of 2048 and more falling in the last.

By default the LM is the target itself: its last hidden states over the prompt are already in
the feature files (the prompt prefix of a causal LM does not depend on the response), so nothing
is re-run. ``--classifier-lm DIR`` uses another causal LM on the chat-templated prompt text.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from tqdm import tqdm

from specforge_outlets.evaluation.baselines.prompt_head import fit_prompt_head
from specforge_outlets.evaluation.heads import HeadSettings
from specforge_outlets.evaluation.predictor_api import Prediction, Predictor
from specforge_outlets.evaluation.requests import Split
from specforge_outlets.model.length_head import bucket_index, bucket_log_centers
from specforge_outlets.training.settings import DEFAULT_BUCKET_EDGES

BUCKET_EDGES = DEFAULT_BUCKET_EDGES  # [1,32), [32,64), ..., [1024, 2048): OUTLETS' bucket head's
SETTINGS = HeadSettings(outputs=len(BUCKET_EDGES) + 1)  # linear


class BucketClassifierPredictor(Predictor):
    name = "lm-classifier"
    description = "frozen small causal LM (default: the target) mean-pooled prompt state + linear length-bucket classifier"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.lm_path: Optional[str] = context.options.get("classifier_lm")
        self.centres = torch.expm1(bucket_log_centers(BUCKET_EDGES))
        self.info.update(lm=self.lm_path or "target (features' hidden_state)", bucket_edges=list(BUCKET_EDGES))

    def embeddings(self, split: Split, desc: str) -> torch.Tensor:
        if self.lm_path:
            return self._lm_embeddings(split, desc)
        out = [None] * len(split)
        for _, features, members in tqdm(split.by_file(), total=len(split.files()), desc=desc, unit="file",
                                         disable=not self.context.progress, leave=False):
            hidden = features["hidden_state"][0].float()
            for index, request in members:
                out[index] = hidden[: request.start].mean(0)
        return torch.stack(out)

    @torch.no_grad()
    def _lm_embeddings(self, split: Split, desc: str) -> torch.Tensor:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        split.require_messages(self.name)
        if not hasattr(self, "lm"):
            self.tokenizer = AutoTokenizer.from_pretrained(self.lm_path)
            self.lm = AutoModelForCausalLM.from_pretrained(self.lm_path, dtype=torch.float32).eval()
        out = []
        for request in tqdm(split.requests, desc=desc, unit="req", disable=not self.context.progress, leave=False):
            ids = self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True,
                                                     return_tensors="pt", return_dict=True)["input_ids"]
            hidden = self.lm(ids, output_hidden_states=True).hidden_states[-1][0]
            out.append(hidden.mean(0).float())
        return torch.stack(out)

    def fit(self, train: Split) -> None:
        fit_prompt_head(self, train, lambda lengths: bucket_index(torch.as_tensor(lengths), BUCKET_EDGES), SETTINGS)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        buckets = self.model(self.embeddings(test, "lm-classifier: embed test")).argmax(-1)
        return [Prediction(float(self.centres[b])) for b in buckets]
