"""Static MAE against the number of training responses: the method's scaling claim, one point per report.

The points come from ``outlets eval`` reports of the same test split with predictors fitted on
nested subsets of the train split (``data/feature_subset.py``); a predictor missing from a report
(OUTLETS where no draft was trained for that size) is left out of that point, not interpolated.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from specforge_outlets.evaluation.report_file import EvalReport
from specforge_outlets.errors import OutletsError

# Predictors whose curve is drawn: the head on the draft and the probes on the target's states.
CURVE_PREDICTORS = ("outlets", "probe-mid", "probe-last")


def curve_points(reports: Sequence[EvalReport]) -> List[Dict[str, Any]]:
    """One row per (report, predictor): training responses, static MAE with its interval, Spearman."""
    test_sets = {report.features for report in reports}
    if len(test_sets) != 1:
        raise OutletsError(f"learning-curve reports must share one test split, got {sorted(test_sets)}")
    rows = []
    for report in sorted(reports, key=lambda r: r.n_train_requests):
        for name in CURVE_PREDICTORS:
            score = report.predictors.get(name)
            if score is not None:
                rows.append({"predictor": name, "train_responses": report.n_train_requests,
                             "static_mae": score.static_mae, "static_mae_ci": list(score.static_mae_ci),
                             "spearman": score.spearman})
    return rows


def plot_curve(rows: List[Dict[str, Any]], noise_floor: Optional[float], path: str) -> str:
    """Static MAE (95% interval) against training responses, log-scaled, with the noise floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in CURVE_PREDICTORS:
        points = [row for row in rows if row["predictor"] == name]
        if not points:
            continue
        x = [row["train_responses"] for row in points]
        y = [row["static_mae"] for row in points]
        low = [row["static_mae"] - row["static_mae_ci"][0] for row in points]
        high = [row["static_mae_ci"][1] - row["static_mae"] for row in points]
        ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=name)
    if noise_floor:
        ax.axhline(noise_floor, color="grey", linestyle=":", label="sampling-noise floor")
    ax.set_xscale("log")
    ax.set_xlabel("training responses")
    ax.set_ylabel("static MAE (tokens)")
    ax.set_title("Learning curve (test split, 95% bootstrap intervals)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
