"""Small-LM bucket classifier (the ranking/classification proxy family: LTR, ShuffleInfer).

A frozen small causal LM reads the prompt; a linear head over its mean-pooled last hidden state is
trained with cross-entropy to pick the output-length bucket; the prediction is the bucket's
geometric centre (the buckets and centres of OUTLETS' own bucket head, ``model.length_head``).

By default the LM is the target itself: its last hidden states over the prompt are already in
the feature files (the prompt prefix of a causal LM does not depend on the response), so nothing
is re-run. ``--classifier-lm DIR`` uses another causal LM on the chat-templated prompt text.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from tqdm import tqdm

from specforge_outlets.evaluation.heads import train_head
from specforge_outlets.evaluation.predictor import Prediction, Predictor
from specforge_outlets.evaluation.requests import Split
from specforge_outlets.model.length_head import bucket_index, bucket_log_centers

BUCKET_EDGES = (16, 32, 64, 128, 256, 512, 1024)  # [1,16), [16,32), ..., [1024, 2048)
EPOCHS = 300


class BucketClassifierPredictor(Predictor):
    name = "lm-classifier"
    description = "frozen small causal LM (default: the target) mean-pooled prompt state + linear length-bucket classifier"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.lm_path: Optional[str] = context.options.get("classifier_lm")
        self.edges = tuple(context.options.get("bucket_edges") or BUCKET_EDGES)
        self.centres = torch.expm1(bucket_log_centers(self.edges))
        self.info.update(lm=self.lm_path or "target (features' hidden_state)", bucket_edges=list(self.edges))

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
        x = self.embeddings(train, "lm-classifier: embed train")
        y = bucket_index(torch.as_tensor(train.lengths), self.edges)
        self.model = train_head(x, y, outputs=len(self.edges) + 1, epochs=EPOCHS, lr=1e-3, weight_decay=1e-2,
                                seed=self.context.seed)

    @torch.no_grad()
    def predict(self, test: Split) -> List[Prediction]:
        buckets = self.model(self.embeddings(test, "lm-classifier: embed test")).argmax(-1)
        return [Prediction(float(self.centres[b])) for b in buckets]
