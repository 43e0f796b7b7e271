"""A draft's validation curve over training, and when to stop it.

Whether OUTLETS beats the probes is a question about trained drafts, so each draft (OUTLETS,
SD-only, LP-only) is evaluated on the held-out validation split (``data.feature_subset.split_validation``)
at checkpoints spaced by doubling steps (250, 500, 1,000, ...): the length loss it is trained on,
ranking (Spearman of r̂₀ on finished responses, C-index on all), static MAE, and drafting
acceptance per TTT step. A draft stops when the last doubling improved each of its own objectives
by under ``TOLERANCE`` relative: OUTLETS has two (length loss and acceptance), SD-only and LP-only
one each. The test split is never read here.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from specforge_outlets.evaluation import censoring, metrics
from specforge_outlets.evaluation.requests import Split

FIRST_STEP = 250  # the first evaluated checkpoint; then every doubling
TOLERANCE = 0.02  # stop when the last doubling improved every objective by under 2% relative
# Each draft's own objectives: (metric, higher is better).
OBJECTIVES = {
    "outlets": (("length_loss", False), ("mean_acceptance_rate", True)),
    "sd-only": (("mean_acceptance_rate", True),),
    "lp-only": (("length_loss", False),),
}


def doubling_steps(budget: int, first: int = FIRST_STEP) -> List[int]:
    """``first, 2 first, 4 first, ...`` up to ``budget`` optimizer steps, and the budget itself: a run that
    reaches its budget ends there, and its last checkpoint is the one a user would take."""
    assert budget >= first > 0, (budget, first)
    steps = [first]
    while steps[-1] * 2 <= budget:
        steps.append(steps[-1] * 2)
    return steps if steps[-1] == budget else [*steps, budget]


def relative_improvement(previous: float, current: float, higher_is_better: bool) -> float:
    gain = current - previous if higher_is_better else previous - current
    return gain / abs(previous) if previous else float("inf")


def stop_reason(points: Sequence[Dict[str, Any]], draft: str, tolerance: float = TOLERANCE) -> Optional[str]:
    """Why ``draft`` should stop after its last point, or None while an objective still improves."""
    if len(points) < 2:
        return None
    before, last = points[-2], points[-1]
    gains = {name: relative_improvement(before[name], last[name], higher) for name, higher in OBJECTIVES[draft]}
    if all(gain < tolerance for gain in gains.values()):
        detail = ", ".join(f"{name} {100 * gain:+.2f}%" for name, gain in gains.items())
        return f"step {before['step']} -> {last['step']}: {detail}, each under {100 * tolerance:.0f}%"
    return None


def validation_length_loss(requests: Sequence, dynamic: Sequence[np.ndarray], one_sided: bool) -> float:
    """The length loss as trained (``training.objective``, per-response weighting, static weight 1, step 0).

    Per response: the mean over its positions of the squared log-space error, plus once more the
    error at its static position, halved; a censored response's errors are one-sided (predicting
    at least its bound costs nothing) with ``one_sided``, and it is left out otherwise.
    """
    losses = []
    for request, predicted in zip(requests, dynamic):
        if request.censored and not one_sided:
            continue
        z_true = np.log1p(request.length - np.arange(request.length, dtype=np.float64))
        error = np.log1p(np.maximum(np.asarray(predicted, np.float64), 0.0)) - z_true
        if request.censored:
            error = np.minimum(error, 0.0)
        losses.append(0.5 * (np.mean(error**2) + error[0] ** 2))
    return float(np.mean(losses))


def length_metrics(validation: Split, predictions: List, *, one_sided: bool) -> Dict[str, Any]:
    """The length head's side of a point, from the draft's predictions on every validation request."""
    everything = validation.with_censored()
    assert len(predictions) == len(everything.requests)
    static = np.array([p.static for p in predictions])
    censored = np.array([r.censored for r in everything.requests])
    lengths = np.array(everything.lengths, np.float64)
    requests = censoring.CensoredRequests.of(lengths, censored)
    dynamic = [p.dynamic if p.dynamic is not None else metrics.countdown(p.static, r.length)
               for p, r in zip(predictions, everything.requests)]
    return {
        "length_loss": validation_length_loss(everything.requests, dynamic, one_sided),
        "spearman": metrics.spearman(static[~censored], lengths[~censored]),
        "c_index": censoring.c_index(requests, static),
        "static_mae": metrics.static_mae(lengths[~censored], static[~censored]),
        "log_slope": metrics.log_slope(lengths[~censored], static[~censored]),
        "long_predicted_long": metrics.long_predicted_long(lengths, static),
        "validation_requests": len(everything.requests),
        "validation_censored": int(censored.sum()),
    }


def checkpoint_point(step: int, validation: Split, predictions: List, drafting: Dict[str, Any],
                     *, one_sided: bool) -> Dict[str, Any]:
    """One point of the curve from the draft's predictions on every validation request and its drafting metrics."""
    return {
        "step": step,
        **length_metrics(validation, predictions, one_sided=one_sided),
        "mean_acceptance_rate": drafting["mean_acceptance_rate"],
        "first_step_acceptance": drafting["acceptance_rate_per_step"][0],
        "acceptance_rate_per_step": drafting["acceptance_rate_per_step"],
    }


def plot_curves(curves: Dict[str, List[Dict[str, Any]]], path: str) -> None:
    """Length loss, Spearman, C-index, log slope and acceptance against optimizer steps, one line per run.

    A run keeps its colour in every panel and is drawn only in the panels of its draft's own objectives
    (SD-only's untrained length head and LP-only's untrained drafter would only stretch the axes).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("length_loss", "validation length loss (log space)", "length_loss"),
              ("spearman", "Spearman of r̂₀ (finished)", "length_loss"),
              ("c_index", "C-index (censored included)", "length_loss"),
              ("log_slope", "slope of log r̂₀ on log length", "length_loss"),
              ("mean_acceptance_rate", "mean acceptance rate", "mean_acceptance_rate"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (key, title, objective) in zip(axes, panels):
        for index, (run, points) in enumerate(curves.items()):
            if objective not in {name for name, _ in OBJECTIVES[draft_of(run)]}:
                continue
            values = [(p["step"], p[key]) for p in points if p.get(key) is not None]
            if values:
                ax.plot(*zip(*values), marker="o", color=f"C{index % 10}", label=run)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    handles = {line.get_label(): line for ax in axes for line in ax.get_lines()}
    axes[0].legend(handles.values(), handles.keys(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draft_of(run: str) -> str:
    """The draft a run trains (``outlets-float32``: ``outlets``)."""
    return next(draft for draft in sorted(OBJECTIVES, key=len, reverse=True) if run == draft or run.startswith(f"{draft}-"))


def plot_scaling(points: Sequence[Dict[str, Any]], path: str) -> None:
    """Validation length loss, Spearman and C-index against training responses: OUTLETS beside the N/2 probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("length_loss", "validation length loss (log space)"), ("spearman", "Spearman of r̂₀ (finished)"),
              ("c_index", "C-index (censored included)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        sizes = [p["train_files"] for p in points]
        for predictor in ("outlets", "probe-mid"):
            ax.plot(sizes, [p[predictor][key] for p in points], marker="o", label=predictor)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(size) for size in sizes])
        ax.minorticks_off()
        ax.set_xlabel("training conversations (nested subsets)")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
