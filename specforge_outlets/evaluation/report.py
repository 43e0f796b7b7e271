"""Scoring predictions and writing the report: report.json, report.md, plots, predictions JSONL.

``predictions/<predictor>.jsonl`` has one line per test request, ``{"id", "predictor",
"predicted_output_len", "true_output_len"}``: the format ``outlets simulate --predictor file
--predictions`` reads (it needs a positive ``predicted_output_len``, so predictions are written
as at least 1 token). ``predictions.jsonl`` holds all predictors' lines together.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

from specforge_outlets.evaluation import metrics
from specforge_outlets.evaluation.predictor import Prediction
from specforge_outlets.evaluation.requests import Split

REPORT_VERSION = 1
MIN_WRITTEN_PREDICTION = 1.0


def score(test: Split, predictions: List[Prediction], dynamic_source: str, *,
          short_max: int = metrics.SHORT_MAX, long_min: int = metrics.LONG_MIN) -> Dict[str, Any]:
    lengths = test.lengths
    static = [p.static for p in predictions]
    dynamic = [p.dynamic if p.dynamic is not None else metrics.countdown(p.static, L)
               for p, L in zip(predictions, lengths)]
    source = dynamic_source if predictions[0].dynamic is not None else "countdown"
    return {
        "static_mae": metrics.static_mae(lengths, static),
        "dynamic_mae": metrics.dynamic_mae(lengths, dynamic),
        "dynamic_source": source,
        "n_requests": len(lengths),
        "mae_by_progress": metrics.mae_by_progress(lengths, dynamic),
        "mae_by_length_bucket": metrics.mae_by_length_bucket(lengths, static, dynamic, short_max, long_min),
    }


def prediction_rows(name: str, test: Split, predictions: List[Prediction]) -> List[Dict[str, Any]]:
    return [
        {"id": r.id, "predictor": name, "predicted_output_len": round(max(p.static, MIN_WRITTEN_PREDICTION), 3),
         "true_output_len": r.length}
        for r, p in zip(test.requests, predictions)
    ]


def write_jsonl(path: str, rows: List[Dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and not np.isfinite(value)) else f"{value:.{digits}f}"


def markdown(report: Dict[str, Any]) -> str:
    lines = ["# OUTLETS evaluation", ""]
    lines += [f"- test features: `{report['features']}` ({report['n_requests']} requests)",
              f"- train features: `{report['train_features']}` ({report['n_train_requests']} requests)",
              f"- target: `{report['target']}`", f"- draft: `{report['draft']}`", ""]
    lines += ["## Length prediction (tokens; lower is better)", "",
              "| predictor | static MAE | dynamic MAE | dynamic from | n | short | medium | long |",
              "|---|---:|---:|---|---:|---:|---:|---:|"]
    for name, entry in report["predictors"].items():
        buckets = entry["mae_by_length_bucket"]
        cells = [f"{_fmt(buckets[b]['static_mae'])} (n={buckets[b]['n_requests']})" for b in metrics.BUCKETS]
        lines.append(f"| {name} | {_fmt(entry['static_mae'])} | {_fmt(entry['dynamic_mae'])} | "
                     f"{entry['dynamic_source']} | {entry['n_requests']} | " + " | ".join(cells) + " |")
    lines += ["", "Length buckets (static MAE): short L < {short}, long L > {long}.".format(**report["settings"]["buckets"]),
              "Dynamic from: `model` = re-predicted at every position; `countdown` = max(static - t, 1); "
              "`conditional-median` = training median of the remaining length of responses still running.", ""]
    lines += ["## Dynamic MAE by decoding progress (deciles of t/L)", "",
              "| predictor | " + " | ".join(f"{10 * i}-{10 * (i + 1)}%" for i in range(metrics.NUM_PROGRESS_BINS)) + " |",
              "|---|" + "---:|" * metrics.NUM_PROGRESS_BINS]
    for name, entry in report["predictors"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(v) for v in entry["mae_by_progress"]) + " |")
    notes = {name: entry["info"] for name, entry in report["predictors"].items() if entry.get("info")}
    if "pia" in notes:
        info = notes["pia"]
        lines += ["", f"PIA: {info.get('unparseable', 0)} of {report['predictors']['pia']['n_requests']} answers had "
                  f"no usable number and count as the training median ({_fmt(info.get('fallback'))})."]
    drafting = report.get("drafting")
    if drafting:
        lines += ["", "## Drafting quality (SpecForge EAGLE-3 metrics on the test features)", "",
                  "| draft | mean acceptance rate | mean top-1 acc | per-step acceptance | per-step top-1 |",
                  "|---|---:|---:|---|---|"]
        for name in ("outlets", "sd_only"):
            if drafting.get(name):
                d = drafting[name]
                lines.append(f"| {name} | {d['mean_acceptance_rate']:.4f} | {d['mean_top1_acc']:.4f} | "
                             + ", ".join(f"{v:.3f}" for v in d["acceptance_rate_per_step"]) + " | "
                             + ", ".join(f"{v:.3f}" for v in d["top1_acc_per_step"]) + " |")
        if drafting.get("comparison"):
            c = drafting["comparison"]
            lines += ["", f"OUTLETS vs SD-only: acceptance rate {100 * c['acceptance_rate_relative_change']:+.2f}%, "
                      f"top-1 accuracy {100 * c['top1_acc_relative_change']:+.2f}%."]
    overhead = report.get("overhead")
    if overhead:
        p, t = overhead["parameters"], overhead["timing"]
        lines += ["", "## Overhead of the length head", "",
                  "| | draft backbone | length head | head share |", "|---|---:|---:|---:|",
                  f"| parameters | {p['backbone']:,} | {p['length_head']:,} | {100 * p['head_share']:.2f}% |",
                  f"| time per decoding step ({t['device']}, {t['threads']} threads, median of {t['repeats']}) | "
                  f"{t['backbone_step_ms']:.3f} ms | {t['length_head_step_ms']:.3f} ms | {100 * t['head_time_share']:.2f}% |",
                  "", f"The backbone excludes the token embedding shared with the target ({p['embedding_shared_with_target']:,} parameters)."]
    lines += ["", "## Predictors", ""]
    for name, entry in report["predictors"].items():
        lines.append(f"- **{name}**: {entry['description']}")
    return "\n".join(lines) + "\n"


def plots(report: Dict[str, Any], test: Split, predictions: Dict[str, List[Prediction]], directory: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    centres = [10 * i + 5 for i in range(metrics.NUM_PROGRESS_BINS)]
    for name, entry in report["predictors"].items():
        values = [np.nan if v is None else v for v in entry["mae_by_progress"]]
        style = "-" if entry["dynamic_source"] != "countdown" else "--"
        ax.plot(centres, values, style, marker="o", label=f"{name} ({entry['dynamic_source']})")
    ax.set_xlabel("decoding progress t/L (%)")
    ax.set_ylabel("MAE of remaining length (tokens)")
    ax.set_title("Dynamic MAE by decoding progress")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(directory, "mae_vs_progress.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(os.path.basename(path))

    names = list(predictions)
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.8 * rows), squeeze=False)
    true = np.asarray(test.lengths, np.float64)
    low, high = max(1.0, true.min() / 2), true.max() * 2
    for ax, name in zip(axes.flat, names):
        pred = np.maximum([p.static for p in predictions[name]], MIN_WRITTEN_PREDICTION)
        ax.scatter(true, pred, s=10, alpha=0.7)
        ax.plot([low, high], [low, high], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{name}: static MAE {report['predictors'][name]['static_mae']:.1f}", fontsize=9)
        ax.set_xlabel("true length L")
        ax.set_ylabel("predicted r_hat_0")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(directory, "predicted_vs_true.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(os.path.basename(path))
    return written
