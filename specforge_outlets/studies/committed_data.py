"""What the serving benchmarks read: the label set's committed evaluation record, and shared data.

- **The evaluation record** ``benchmarks/data/sharegpt-smollm2/eval/predictions.jsonl.gz``, written by
  ``outlets eval`` (``specforge_outlets/evaluation/report.py``): one row per test request (595, the
  censored ones included) with ``id``, ``true_output_len`` (for a censored response the length it ran
  to, the 2,048 cap), ``censored``, ``static`` (each predictor's r̂₀) and ``dynamic`` (each
  re-predicting predictor's estimate at every output token). The serving benchmarks replay what each
  request *generated*, so they read the censored rows' lengths too. Both they and ``--predictions``
  flags read it with ``specforge_outlets/evaluation/predictions_file.py`` (``iter_record``, which
  checks those fields; ``read_predictions``, one predictor's).
- **Shared data** (ShareGPT prompts, traces) is never copied into the repository: it is found by
  ``specforge_outlets.resources.shared_data`` (``$OUTLETS_SHARED_DIR``, else ``../shared`` beside the
  checkout).

The studies read and write the checkout they are installed from (an editable install): ``REPO``.
"""

from __future__ import annotations

import os
from typing import Dict, List

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.predictions_file import iter_record
from specforge_outlets.resources import ENV_SHARED_DIR, shared_data

# the checkout: specforge_outlets/studies/ is two folders below it
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LABEL_SET = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2")
EVAL_RECORD = os.path.join(LABEL_SET, "eval", "predictions.jsonl.gz")
# shared data, relative to the shared directory
SHAREGPT_PROMPTS = "data/prompts/sharegpt_first_turn_2978.jsonl"
AZURE_CONV_TRACE = "data/traces/AzureLLMInferenceTrace_conv.csv"
SHAREGPT_CHATGPT_LENGTHS = "data/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def shared(relative: str, needed_by: str) -> str:
    """The path of a shared file, or a clear stop naming where it was looked for."""
    path = shared_data(relative)
    if path is None:
        raise SystemExit(f"{needed_by} reads {relative} from the shared data, which is not on this machine: set "
                         f"{ENV_SHARED_DIR} to the directory that holds data/, or put it at "
                         f"{os.path.join(os.path.dirname(REPO), 'shared')}")
    return path


def read_eval_record(path: str = EVAL_RECORD) -> List[Dict]:
    """Every row of the evaluation record; a row without the fields the benchmarks read stops them, naming its line."""
    try:
        return [row for _, row in iter_record(path, "the evaluation record")]
    except OutletsError as exc:
        raise SystemExit(str(exc)) from None
