"""The label set's prompts with four samples each, and every ladder rung's values for each sample.

The target samples its answers, so a prompt has a distribution of lengths. The committed label set
holds, for the test prompts of the evaluation record (253 of the committed one's, 256 of the converged
drafts'), the test response and three regenerations
(``noise-seed*.jsonl.gz``; a regeneration cut at the 2,048-token cap is censored). A request of the
ladder's workload is one sample; each learned predictor's r̂₀ reads the prompt alone (one value for
its four samples), and the per-prompt ceiling predicts a sample by the mean of its prompt's other
samples. ``benchmarks/predictor_ladder.py`` (simulated) and the real KV-bound servers'
``--ladder`` draw from it.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Dict, List, Tuple

import numpy as np

from specforge_outlets.serving.trace import Trace, poisson_arrival_times
from specforge_outlets.simulation.predicted_lengths import per_prompt_ceiling
from specforge_outlets.studies.committed_data import EVAL_RECORD, LABEL_SET, read_eval_record
from specforge_outlets.studies.sharegpt_serving import REQUESTS

NOISE_SAMPLES = [os.path.join(LABEL_SET, f"noise-seed{seed}.jsonl.gz") for seed in (1, 2, 3)]
# the learned rungs: their names in the ladder -> the evaluation record's
LEARNED = {"bert (MiniLM)": "bert", "outlets r0": "outlets", "probe-mid (N/2)": "probe-mid"}


class LabelSetSamples:
    """The label set's prompts with four samples each; a request is one sample, drawn uniformly."""

    name = "sharegpt-smollm2"

    def __init__(self, record_path: str = EVAL_RECORD) -> None:
        """``record_path``: the evaluation record whose r̂₀ the learned rungs take (another draft's, e.g.)."""
        with open(REQUESTS) as handle:
            input_len = {row["id"]: row["input_length"] for row in map(json.loads, handle)}
        record = {row["id"]: row for row in read_eval_record(record_path)}
        others: Dict[str, List[Tuple[int, bool]]] = {}
        for path in NOISE_SAMPLES:
            with gzip.open(path, "rt") as handle:
                for row in map(json.loads, handle):
                    turn = row["turns"][0]
                    others.setdefault(row["id"], []).append((int(turn["num_tokens"]), turn["finish_reason"] != "stop"))
        prompts = [p for p in record if len(others.get(p, ())) == len(NOISE_SAMPLES) and p in input_len]
        samples = [[(int(record[p]["true_output_len"]), bool(record[p]["censored"]))] + others[p] for p in prompts]
        per_sample = len(NOISE_SAMPLES) + 1
        self.ids = [f"{p}/{k}" for p in prompts for k in range(per_sample)]
        self.prompts = np.repeat(np.arange(len(prompts)), per_sample)  # each sample's prompt (an index)
        self.input_lens = np.repeat([input_len[p] for p in prompts], per_sample)
        self.output_lens = np.array([length for s in samples for length, _ in s])
        self.censored = np.array([cut for s in samples for _, cut in s])
        self.train_median = float(record[prompts[0]]["static"]["constant"])  # outlets eval's train median
        self.values = {rung: np.repeat([float(record[p]["static"][name]) for p in prompts], per_sample)
                       for rung, name in LEARNED.items()}
        self.values["ceiling"] = np.concatenate(per_prompt_ceiling([[length for length, _ in s] for s in samples]))

    def trace(self, rate_rps: float, count: int, seed: int) -> Tuple[Trace, np.ndarray]:
        """A Poisson trace of samples drawn with replacement, and which sample each request is."""
        rng = np.random.default_rng(seed)
        drawn = rng.integers(0, len(self.ids), size=count)
        trace = Trace(f"{self.name}-{rate_rps:g}rps", [f"{self.ids[i]}#{n}" for n, i in enumerate(drawn)],
                      poisson_arrival_times(rng, rate_rps, count), self.input_lens[drawn], self.output_lens[drawn])
        return trace, drawn

    def measured(self, rung: str, trace: Trace, drawn: np.ndarray, seed: int) -> List[float]:
        return self.values[rung][drawn].tolist()
