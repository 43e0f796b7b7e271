"""Prediction in predictor-only mode, per request and per prefill token: the OUTLETS draft on one CPU thread."""

from __future__ import annotations

import json
import os
import statistics
from typing import List

from specforge_outlets.studies.committed_data import REPO
from specforge_outlets.studies.scheduler_overhead.requests import timed

PROMPT_LENS = (64, 256, 1024)
DEFAULT_DRAFT = os.path.join(REPO, "runs", "bench-sharegpt", "draft-outlets")


def measure_predictor(draft: str, prompt_lens, repetitions: int) -> List[dict]:
    import torch

    from specforge_outlets.model.plain_draft import OutletsLengthPredictor

    torch.set_num_threads(1)
    with open(os.path.join(draft, "config.json")) as handle:
        config = json.load(handle)
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(vocab, hidden)  # the target's; its values do not change the cost
    predictor = OutletsLengthPredictor(draft, embedding)
    rows = []
    for length in prompt_lens:
        features = torch.randn(length, 3 * hidden)
        prompt = torch.randint(0, vocab, (length,)).tolist()
        predictor.predict_output_len(features, prompt, 1)  # warm-up
        times = [timed(predictor.predict_output_len, features, prompt, 1) for _ in range(repetitions)]
        ms = 1e3 * statistics.median(times)
        rows.append({"prompt tokens": length, "ms per request": ms, "us per prefill token": 1e3 * ms / length})
        print(f"predictor {length:>5} prompt tokens: {ms:.2f} ms ({1e3 * ms / length:.1f} us/token)", flush=True)
    return rows
