"""How well any prompt-level predictor could do: the noise floor and ranking ceiling on the scored rows.

The target samples its answers, so a prompt has a distribution of lengths and the scored response
is one draw. With several samples of the same test prompts (the scored response first):

- the intraclass correlation ``rho`` of ``z = log(1 + L)``: the share of its variance that lies
  between prompts. The one-way random-effects ANOVA estimator ICC(1) for unequal group sizes
  (Searle 1971): ``(MSB - MSW) / (MSB + (n0 - 1) MSW)`` with
  ``n0 = (N - sum n_i^2 / N) / (k - 1)``; unbiased in its mean squares (dividing the within-prompt
  sum by ``N - k``, not ``N``).
- the naive ranking ceiling: Spearman of the scored sample against the mean ``z`` of its prompt's
  other samples. It is attenuated, because that mean is itself noisy: its reliability is
  ``m rho / (1 + (m - 1) rho)`` for ``m`` other samples (Spearman-Brown), and dividing by the square
  root of it (Spearman's correction for attenuation) estimates the correlation with the prompt's
  true mean, the best a predictor that knows only the prompt can reach.
- the same ceiling from ``rho`` alone: a draw correlates with its prompt's mean by ``sqrt(rho)``
  (Pearson, on ``z``), which is ``(6 / pi) asin(sqrt(rho) / 2)`` as a Spearman coefficient when
  ``z`` is normal (Pearson 1907's relation).
- the noise floor: the scored sample's static error against the median of its prompt's others.

Only finished samples have a length; a prompt counts when its scored response finished and at
least one other sample did.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Sequence

import numpy as np

from specforge_outlets.evaluation import metrics


def icc_oneway(groups: Sequence[Sequence[float]]) -> float:
    """ICC(1) of the values in ``groups`` (each at least two values), unequal group sizes allowed."""
    groups = [np.asarray(group, np.float64) for group in groups]
    assert len(groups) >= 2 and all(group.size >= 2 for group in groups), "need two groups of two or more"
    sizes = np.array([group.size for group in groups], np.float64)
    total, k = sizes.sum(), len(groups)
    grand = np.concatenate(groups).mean()
    between = sum(group.size * (group.mean() - grand) ** 2 for group in groups) / (k - 1)
    within = sum(((group - group.mean()) ** 2).sum() for group in groups) / (total - k)
    n0 = (total - (sizes**2).sum() / total) / (k - 1)
    return float((between - within) / (between + (n0 - 1) * within))


def ceiling_rows(samples: Mapping[str, Sequence[float]], scored: Sequence[str]) -> list[str]:
    """The scored ids whose prompt has another finished sample (``samples[id][0]`` is the scored one)."""
    return [row_id for row_id in scored if len(samples.get(row_id, ())) >= 2]


def ranking_ceiling(samples: Mapping[str, Sequence[float]], rows: Sequence[str], *, seed: int = 0) -> Dict[str, object]:
    """``rho``, the naive and corrected Spearman ceilings and the noise floor on ``rows``."""
    assert len(rows) >= 3, "need three prompts with two finished samples"
    z = {row_id: np.log1p(np.asarray(samples[row_id], np.float64)) for row_id in rows}
    rho = icc_oneway(list(z.values()))
    scored = np.array([z[row_id][0] for row_id in rows])
    others = np.array([z[row_id][1:].mean() for row_id in rows])
    other_counts = np.array([z[row_id].size - 1 for row_id in rows], np.float64)
    naive = metrics.spearman(scored, others)
    m = float(other_counts.mean())
    reliability = m * rho / (1 + (m - 1) * rho) if rho > 0 else float("nan")
    floor_errors = [abs(samples[row_id][0] - float(np.median(samples[row_id][1:]))) for row_id in rows]
    return {
        "n_prompts": len(rows),
        "samples_per_prompt_mean": float(other_counts.mean() + 1),
        "icc_log_length": rho,
        "spearman_naive": naive,
        "other_samples_reliability": reliability,
        "spearman_corrected": (naive / math.sqrt(reliability)) if naive is not None and reliability > 0 else None,
        "spearman_from_icc": (6 / math.pi) * math.asin(math.sqrt(rho) / 2) if rho > 0 else None,
        # the 800+ separation the prompt allows, naive (finished samples only, the others' mean not corrected for
        # its noise: a lower estimate of the ceiling, on these rows only)
        "long_auc": metrics.long_auc([samples[row_id][0] for row_id in rows], others),
        "floor_static_mae": float(np.mean(floor_errors)),
        "floor_static_mae_ci": metrics.bootstrap_interval(floor_errors, seed=seed),
    }
