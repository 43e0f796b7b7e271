"""What a regenerated label set says before any model is trained: lengths, censoring, the noise floor.

The target samples its answers, so a prompt has a distribution of lengths, not one length. With
several samples of the same prompts (runs with other ``--seed``), predicting each sample by the
median of its prompt's other samples is the best a predictor that knows the prompt perfectly can
do in static MAE; one global constant (the median of all lengths) is what knowing nothing gives.
The share of the variance of log length that lies between prompts bounds how much of the length
the prompt can explain at all.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from specforge_outlets.data.generation import LENGTH, assistant_turns
from specforge_outlets.evaluation.ceiling import icc_oneway
from specforge_outlets.evaluation.metrics import bootstrap_interval, noise_floor_errors

# Lengths at and above this count as "long" in the serving studies (the tail-safe class edge).
LONG_OUTPUT_TOKENS = 800


def first_turns(rows: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Row id -> its first assistant turn."""
    return {str(row["id"]): assistant_turns(row)[0] for row in rows}


def length_summary(turns: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Counts, censoring and the distribution of the finished lengths."""
    finished = np.array([t["num_tokens"] for t in turns.values() if t["finish_reason"] != LENGTH], np.float64)
    censored = sum(t["finish_reason"] == LENGTH for t in turns.values())
    return {
        "responses": len(turns),
        "finished": int(finished.size),
        "censored": int(censored),
        "censored_share": censored / max(len(turns), 1),
        "mean": float(finished.mean()) if finished.size else None,
        "quantiles_10_25_50_75_90_99": np.percentile(finished, [10, 25, 50, 75, 90, 99]).tolist() if finished.size else None,
        "long_share": float((finished >= LONG_OUTPUT_TOKENS).mean()) if finished.size else None,
    }


def noise_floor(samples: Mapping[str, Sequence[float]], seed: int = 0) -> Dict[str, Any]:
    """Static MAE of the median-of-others predictor, of one global median, and the intraclass correlation.

    ``samples``: prompt id -> its finished lengths (at least two to count).
    """
    usable = {key: list(map(float, lengths)) for key, lengths in samples.items() if len(lengths) >= 2}
    if not usable:
        return {"prompts": 0}
    floor = noise_floor_errors(usable)
    every = np.concatenate([np.asarray(v) for v in usable.values()])
    constant = float(np.median(every))
    constant_errors = {key: float(np.mean(np.abs(np.asarray(v) - constant))) for key, v in usable.items()}
    keys = sorted(usable)
    return {
        "prompts": len(usable),
        "samples": int(every.size),
        "floor_mae": float(np.mean([floor[k] for k in keys])),
        "floor_mae_ci": bootstrap_interval([floor[k] for k in keys], seed=seed),
        "constant_mae": float(np.mean([constant_errors[k] for k in keys])),
        "constant_mae_ci": bootstrap_interval([constant_errors[k] for k in keys], seed=seed),
        "constant": constant,
        # the unbiased share of log-length variance between prompts (ICC(1); the earlier
        # "between_prompt_share_of_log_variance" divided the within-prompt sum by N, not N - k)
        "icc_log_length": icc_oneway([np.log1p(usable[k]) for k in keys]) if len(keys) >= 2 else None,
    }


def samples_by_prompt(files: Sequence[Sequence[Dict[str, Any]]]) -> Dict[str, List[float]]:
    """Finished first-turn lengths per prompt id, over several regenerations of the same prompts."""
    out: Dict[str, List[float]] = {}
    for rows in files:
        for key, turn in first_turns(rows).items():
            if turn["finish_reason"] != LENGTH:
                out.setdefault(key, []).append(float(turn["num_tokens"]))
    return out


def plot_lengths(turns: Mapping[str, Dict[str, Any]], samples: Mapping[str, Sequence[float]], path: str) -> None:
    """Histogram of the finished lengths (log bins) and the spread of each noise prompt's samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finished = [t["num_tokens"] for t in turns.values() if t["finish_reason"] != LENGTH]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.hist(finished, bins=np.geomspace(1, 2048, 40), color="tab:blue")
    left.set_xscale("log")
    left.set_xlabel("response length (tokens)")
    left.set_ylabel("responses")
    left.set_title(f"{len(finished)} finished responses")
    usable = sorted((np.median(v), v) for v in samples.values() if len(v) >= 2)
    for rank, (_, lengths) in enumerate(usable):
        right.plot([rank] * len(lengths), lengths, ".", color="tab:orange", alpha=0.6, markersize=4)
    right.set_yscale("log")
    right.set_xlabel("prompt (sorted by median length)")
    right.set_ylabel("length of each sample (tokens)")
    right.set_title(f"sampling noise: {len(usable)} prompts x up to {max(map(len, samples.values()), default=0)} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
