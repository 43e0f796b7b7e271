"""Scoring predictions and writing the report: report.json, report.md, plots, predictions files.

``predictions/<predictor>.jsonl`` has one line per scored test request, ``{"id", "predictor",
"predicted_output_len", "true_output_len"}``: the format ``outlets simulate --predictor file
--predictions`` reads (it needs a positive ``predicted_output_len``, so predictions are written
as at least 1 token). ``predictions.jsonl`` holds all predictors' lines together.

``predictions.jsonl.gz`` is the complete record, small enough to commit for the serving study:
one line per test request, censored ones included, ``{"id", "true_output_len", "censored",
"static": {predictor: r_hat_0}, "dynamic": {predictor: [r_hat_t, t = 0 .. L-1]}}``; ``dynamic``
holds the predictors that re-predict (not the countdowns, which follow from ``static``); a
censored request's ``true_output_len`` is the tokens generated before the cut, a lower bound.
Written with a zero gzip timestamp, so the same predictions give the same bytes.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from specforge_outlets.evaluation.predictions_file import PredictionRow
from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation import ceiling, censoring, metrics
from specforge_outlets.evaluation.report_file import recorded_path
from specforge_outlets.evaluation.predictor_api import Prediction
from specforge_outlets.evaluation.noise import NoiseSamples
from specforge_outlets.evaluation.requests import Split

MIN_WRITTEN_PREDICTION = 1.0


def score(test: Split, predictions: List[Prediction], dynamic_source: str, *,
          short_max: int = metrics.SHORT_MAX, long_min: int = metrics.LONG_MIN, seed: int = 0,
          share_threshold: int = metrics.SHARE_THRESHOLD) -> Dict[str, Any]:
    lengths = test.lengths
    static = [p.static for p in predictions]
    dynamic = [p.dynamic if p.dynamic is not None else metrics.countdown(p.static, L)
               for p, L in zip(predictions, lengths)]
    source = dynamic_source if predictions[0].dynamic is not None else "countdown"
    static_errors = metrics.static_abs_errors(lengths, static)
    dynamic_errors = metrics.dynamic_request_errors(lengths, dynamic)
    return {
        "static_mae": float(static_errors.mean()),
        "static_mae_ci": metrics.bootstrap_interval(static_errors, seed=seed),
        "dynamic_mae": float(dynamic_errors.mean()),
        "dynamic_mae_ci": metrics.bootstrap_interval(dynamic_errors, seed=seed),
        "dynamic_source": source,
        "n_requests": len(lengths),
        "spearman": metrics.spearman(static, lengths),
        "mae_by_progress": metrics.mae_by_progress(lengths, dynamic),
        "mae_by_length_bucket": metrics.mae_by_length_bucket(lengths, static, dynamic, short_max, long_min),
        "calibration": metrics.calibration(lengths, static, threshold=share_threshold),
    }


def censoring_section(everything: Split, predictions: Dict[str, List[Prediction]], reference: str,
                      *, seed: int = 0) -> Dict[str, Any]:
    """Every predictor on every test request, censored ones included, and its paired difference from ``reference``."""
    requests = censoring.CensoredRequests.of(everything.lengths, [r.censored for r in everything.requests])
    static = {name: [p.static for p in values] for name, values in predictions.items()}
    dynamic = {name: censoring.dynamic_error_bounds(requests, [
        p.dynamic if p.dynamic is not None else metrics.countdown(p.static, r.length)
        for p, r in zip(values, everything.requests)]) for name, values in predictions.items()}
    finished = ~requests.censored
    return {
        "reference": reference,
        "scores": {name: {**censoring.censored_scores(requests, static[name], dynamic[name], seed=seed),
                          "log_slope": metrics.log_slope(requests.lengths[finished], np.asarray(static[name])[finished]),
                          "long_predicted_long": metrics.long_predicted_long(requests.lengths, static[name]),
                          "long_auc": metrics.long_auc(requests.lengths, static[name])}
                   for name in static},
        "paired_differences": censoring.paired_differences(requests, static, dynamic, reference, seed=seed),
    }


def ceiling_section(samples: NoiseSamples, test: Split, predictions: Dict[str, List[Prediction]],
                    *, seed: int = 0) -> Optional[Dict[str, Any]]:
    """The floor and ranking ceiling on the scored prompts with repeated samples, each predictor on those rows."""
    first_turns = {r.row_id: index for index, r in enumerate(test.requests) if r.turn == 0}
    rows = ceiling.ceiling_rows(samples.lengths, list(first_turns))
    if len(rows) < 3:
        return None
    lengths = [samples.lengths[row_id][0] for row_id in rows]
    same_rows = {}
    for name, values in predictions.items():
        static = [values[first_turns[row_id]].static for row_id in rows]
        same_rows[name] = {"static_mae": metrics.static_mae(lengths, static), "spearman": metrics.spearman(static, lengths),
                           "long_auc": metrics.long_auc(lengths, static)}
    return {**ceiling.ranking_ceiling(samples.lengths, rows, seed=seed),
            "prompts_with_4_samples": sum(1 for count in samples.drawn.values() if count >= 4),
            "predictors_on_these_rows": same_rows}


def noise_floor(samples: NoiseSamples, *, seed: int = 0) -> Dict[str, Any]:
    """The noise-floor row: static MAE of each sample against the median of its prompt's others."""
    per_prompt = metrics.noise_floor_errors(samples.lengths)
    if not per_prompt:
        raise OutletsError(
            f"--noise-samples {' '.join(samples.files)}: no test prompt has two finished samples "
            f"({samples.unfinished} first turns were cut by the token limit); regenerate more samples"
        )
    errors = list(per_prompt.values())
    return {
        "static_mae": float(np.mean(errors)),
        "static_mae_ci": metrics.bootstrap_interval(errors, seed=seed),
        "n_prompts": len(per_prompt),
        "n_samples": sum(len(samples.lengths[key]) for key in per_prompt),
        "unfinished_samples": samples.unfinished,
        "ignored_rows": samples.ignored_rows,
        "files": [recorded_path(path) for path in samples.files],
    }


def prediction_rows(test: Split, predictions: List[Prediction]) -> List[PredictionRow]:
    """The rows of ``predictions/<name>.jsonl``: r̂₀ as the serving side reads it (at least one token)."""
    return [PredictionRow(r.id, round(max(p.static, MIN_WRITTEN_PREDICTION), 3), r.length)
            for r, p in zip(test.requests, predictions)]


def request_rows(everything: Split, predictions: Dict[str, List[Prediction]],
                 quantile_only: Optional[Dict[str, List[Prediction]]] = None,
                 quantile_levels: Optional[Sequence[float]] = None) -> List[Dict[str, Any]]:
    """The ``predictions.jsonl.gz`` rows: every request, every predictor (tokens, 0.1 precision).

    Predictors with quantiles add ``quantile_levels`` and ``quantiles``: by predictor, ``static``
    (the whole length's quantiles) and ``dynamic`` (row k: the remaining tokens' quantiles after k
    tokens, like ``dynamic``), in whole tokens; ``quantile_only`` predictors (the conformally
    corrected ones) appear there and in ``static`` (their base predictor's point), not in ``dynamic``.
    """
    with_quantiles = {name: values for name, values in {**predictions, **(quantile_only or {})}.items()
                      if values and values[0].dynamic_quantiles is not None}
    rows = []
    for index, request in enumerate(everything.requests):
        own = {name: values[index] for name, values in predictions.items()}
        row = {
            "id": request.id, "true_output_len": request.length, "censored": request.censored,
            # a quantile-only predictor (NAME+conformal) keeps its base predictor's point: listed so
            # that readers can name it (``--file-predictor``) and find a point beside its quantiles
            "static": {name: round(values[index].static, 1) for name, values in {**predictions, **(quantile_only or {})}.items()},
            "dynamic": {name: np.round(p.dynamic, 1).tolist() for name, p in own.items() if p.dynamic is not None},
        }
        if with_quantiles:
            assert quantile_levels is not None and all(
                len(values[index].dynamic_quantiles[0]) == len(quantile_levels) for values in with_quantiles.values())
            row["quantile_levels"] = list(quantile_levels)
            quantiles = {name: np.round(values[index].dynamic_quantiles).astype(int).tolist()
                         for name, values in with_quantiles.items()}
            row["quantiles"] = {name: {"static": q[0], "dynamic": q} for name, q in quantiles.items()}
        rows.append(row)
    return rows


def write_jsonl_gz(path: str, rows: List[Dict[str, Any]]) -> None:
    """Written to a temporary name, then renamed: a reader sees the old file or the whole new one."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        for row in rows:
            handle.write((json.dumps(row) + "\n").encode("utf-8"))
    os.replace(tmp, path)


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and not np.isfinite(value)) else f"{value:.{digits}f}"


def _share(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _with_ci(value: float, interval) -> str:
    return f"{_fmt(value)} [{_fmt(interval[0])}, {_fmt(interval[1])}]"


def markdown(report: Dict[str, Any]) -> str:
    lines = ["# OUTLETS evaluation", ""]
    lines += [f"- test features: `{report['features']}` ({report['n_requests']} requests)",
              f"- train features: `{report['train_features']}` ({report['n_train_requests']} requests)",
              f"- target: `{report['target']}`", f"- draft: `{report['draft']}`",
              f"- LP-only draft: `{report['lp_only_draft']}`", ""]
    left_out = report["settings"].get("baselines_left_out") or {}
    lines += [f"**Baseline {name} left out**: it needs {lack}." for name, lack in left_out.items()]
    lines += [""] if left_out else []
    lines += ["## Length prediction (tokens; lower is better)", "",
              f"95% bootstrap intervals over the test requests ({report['settings']['bootstrap']['resamples']} resamples, "
              f"seed {report['settings']['bootstrap']['seed']}); Spearman: rank correlation of r̂₀ with L. "
              f"{report['n_censored']} censored test responses are predicted (predictions file) but not scored.", "",
              "| predictor | static MAE [95% CI] | dynamic MAE [95% CI] | dynamic from | Spearman | n |",
              "|---|---:|---:|---|---:|---:|"]
    for name, entry in report["predictors"].items():
        lines.append(f"| {name} | {_with_ci(entry['static_mae'], entry['static_mae_ci'])} | "
                     f"{_with_ci(entry['dynamic_mae'], entry['dynamic_mae_ci'])} | {entry['dynamic_source']} | "
                     f"{_fmt(entry['spearman'], 3)} | {entry['n_requests']} |")
    floor = report.get("noise_floor")
    if floor:
        lines.append(f"| sampling-noise floor | {_with_ci(floor['static_mae'], floor['static_mae_ci'])} | – | – | – | "
                     f"{floor['n_prompts']} prompts |")
    lines += ["", "Dynamic from: `model` = re-predicted at every position; `countdown` = max(static - t, 1); "
              "`conditional-median` = training median of the remaining length of responses still running."]
    if floor:
        lines += ["", f"Sampling-noise floor: each of {floor['n_samples']} finished first-turn samples of {floor['n_prompts']} "
                  f"test prompts (the test response and {len(floor['files'])} regenerated file(s)) predicted by the median "
                  f"of the same prompt's other samples; {floor['unfinished_samples']} cut samples left out."]
    lines += censoring_markdown(report)
    lines += ["", "## MAE by true length (static / dynamic)", "",
              "Short L < {short}, long L > {long}.".format(**report["settings"]["buckets"]), "",
              "| predictor | " + " | ".join(metrics.BUCKETS) + " |", "|---|" + "---:|" * len(metrics.BUCKETS)]
    for name, entry in report["predictors"].items():
        buckets = entry["mae_by_length_bucket"]
        lines.append(f"| {name} | " + " | ".join(
            f"{_fmt(buckets[b]['static_mae'])} / {_fmt(buckets[b]['dynamic_mae'])} (n={buckets[b]['n_requests']})"
            for b in metrics.BUCKETS) + " |")
    threshold = report["settings"]["share_threshold"]
    lines += ["", "## Calibration of r̂₀ (quantiles predicted / true; see calibration_qq.png)", "",
              f"| predictor | share ≥ {threshold} predicted / true | P10 | P25 | P50 | P75 | P90 |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, entry in report["predictors"].items():
        c = entry["calibration"]
        cells = [f"{_fmt(c['predicted_quantiles'][i], 0)} / {_fmt(c['true_quantiles'][i], 0)}"
                 for i in (c["levels"].index(level) for level in (0.1, 0.25, 0.5, 0.75, 0.9))]
        lines.append(f"| {name} | {100 * c['predicted_share_at_or_above']:.1f}% / {100 * c['true_share_at_or_above']:.1f}% | "
                     + " | ".join(cells) + " |")
    lines.append("")
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
    lines += quantile_markdown(report)
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


def quantile_markdown(report: Dict[str, Any]) -> List[str]:
    """Coverage of each predicted quantile and the PIT histogram, raw and conformally corrected."""
    section = report.get("calibration")
    if not section:
        return []
    lines = ["", "## Predicted length quantiles: coverage and PIT", "",
             "Coverage: share of requests whose remaining length is at or below the quantile (a calibrated q_tau "
             "covers tau), among the requests it is known for, with the interval the censored ones leave; the upper "
             "end is the served coverage, a censored request covered by a quantile at or past its cap (the length the "
             "server runs, the quantile the scheduler reads clipped at max_new_tokens). Static: before the first token; "
             "at_25/50/75: after that share of the response. Conformal: shifted in log(1 + r) on the calibration "
             "responses to their served lengths (`evaluation/calibration.py`).", ""]
    for name, entry in section.items():
        levels = entry["levels"]
        lines += [f"### {name}" + (f" (calibration: {entry['calibration_requests']} requests)" if "shifts" in entry else ""),
                  "", "| point | variant | " + " | ".join(f"q{round(100 * l)}" for l in levels) + " | PIT bins (expected " +
                  ", ".join(f"{100 * e:.0f}" for e in entry["raw"]["static"]["pit"]["expected"]) + "%) |",
                  "|---|---|" + "---:|" * len(levels) + "---|"]
        for variant in ("raw", "conformal"):
            for point, scores in entry.get(variant, {}).items():
                cells = [f"{_fmt(100 * c['coverage'])}% [{_fmt(100 * c['lower'], 0)}, {_fmt(100 * c['upper'], 0)}]"
                         for c in scores["coverage"]]
                pit = ", ".join(f"{100 * v:.0f}" for v in scores["pit"]["observed"])
                lines.append(f"| {point} | {variant} | " + " | ".join(cells) + f" | {pit} |")
        if "shifts" in entry:
            lines += ["", "Conformal shifts in log(1 + r): static " + ", ".join(f"{v:+.3f}" for v in entry["shifts"]["static"])
                      + "; dynamic " + ", ".join(f"{v:+.3f}" for v in entry["shifts"]["dynamic"]) + "."]
        lines.append("")
    return lines


def censoring_markdown(report: Dict[str, Any]) -> List[str]:
    """The censoring-aware table, the paired differences from the reference and the ceiling on the same rows."""
    section = report.get("censoring")
    if not section:
        return []
    scores = section["scores"]
    first = next(iter(scores.values()))
    lines = ["", f"## Every test request, censored ones included ({first['n_requests']} requests, "
             f"{first['n_censored']} cut by the token limit)", "",
             "C-index: Harrell's concordance of r̂₀ with the length (a censored response is longer than every finished "
             "one at or below its bound). MAE bounds: a censored response's error is max(0, cap − r̂), the least it can "
             f"be. Said long: share of censored requests above the predictor's own {int(100 * censoring.SAYS_LONG_QUANTILE)}th "
             "percentile (10% by chance). Slope: least-squares slope of log r̂₀ on log L over the finished requests (1 "
             f"follows the lengths' spread, 0 predicts one length). Long said long: share of the requests of "
             f"{metrics.SHARE_THRESHOLD}+ tokens, censored ones included, with r̂₀ above {metrics.LONG_MIN}. Long AUC: the "
             f"chance a {metrics.SHARE_THRESHOLD}+ request's r̂₀ exceeds a shorter one's (0.5: no separation).", "",
             "| predictor | C-index | Spearman (cut at cap) | static MAE ≥ [95% CI] | dynamic MAE ≥ [95% CI] | censored said long "
             "| slope | long said long | long AUC |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entry in scores.items():
        said = entry["censored_said_long"]  # reports written before the slope columns have no slope: shown as –
        lines.append(f"| {name} | {_fmt(entry['c_index'], 3)} | {_fmt(entry['spearman_censored_at_cap'], 3)} | "
                     f"{_with_ci(entry['static_mae_lower_bound'], entry['static_mae_lower_bound_ci'])} | "
                     f"{_with_ci(entry['dynamic_mae_lower_bound'], entry['dynamic_mae_lower_bound_ci'])} | "
                     f"{_share(said)} | {_fmt(entry.get('log_slope'), 2)} | {_share(entry.get('long_predicted_long'))} | "
                     f"{_fmt(entry.get('long_auc'), 3)} |")
    columns = (("spearman", "Spearman (finished)"), ("static_mae", "static MAE (finished)"), ("c_index", "C-index"),
               ("static_mae_censored", "static MAE ≥"), ("dynamic_mae_censored", "dynamic MAE ≥"))
    lines += ["", f"### Paired differences from {section['reference']} (predictor − {section['reference']}; 95% paired "
              "bootstrap interval; bold: the interval excludes 0)", "",
              "| predictor | " + " | ".join(title for _, title in columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, entry in section["paired_differences"].items():
        cells = [censoring.interval_text(entry[key], 3 if key in ("spearman", "c_index") else 1) for key, _ in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    floor = report.get("ceiling")
    if floor:
        lines += ["", f"### Floor and ceiling on the same rows ({floor['n_prompts']} scored prompts with another finished "
                  f"sample; {floor['prompts_with_4_samples']} test prompts have 4 or more samples)", "",
                  f"Intraclass correlation of log(1 + L) (ICC(1), unbiased): {floor['icc_log_length']:.3f}. Ranking ceiling: "
                  f"naive {_fmt(floor['spearman_naive'], 3)} (the scored sample against the mean log length of "
                  f"{floor['samples_per_prompt_mean'] - 1:.1f} other samples), corrected for the attenuation of that mean "
                  f"(reliability {floor['other_samples_reliability']:.3f}) {_fmt(floor['spearman_corrected'], 3)}, from the "
                  f"ICC alone {_fmt(floor['spearman_from_icc'], 3)}. Floor: the scored sample against the median of its "
                  f"prompt's others, static MAE {_with_ci(floor['floor_static_mae'], floor['floor_static_mae_ci'])}.", "",
                  "| predictor | Spearman on these rows | static MAE on these rows | long AUC on these rows |",
                  "|---|---:|---:|---:|"]
        for name, entry in floor["predictors_on_these_rows"].items():
            lines.append(f"| {name} | {_fmt(entry['spearman'], 3)} | {_fmt(entry['static_mae'])} | "
                         f"{_fmt(entry.get('long_auc'), 3)} |")
        lines.append(f"| ceiling (corrected) / floor / the others' mean (naive) | {_fmt(floor['spearman_corrected'], 3)} | "
                     f"{_fmt(floor['floor_static_mae'])} | {_fmt(floor.get('long_auc'), 3)} |")
    return lines


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
    written.append(_save(fig, directory, "mae_vs_progress.png"))

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
    written.append(_save(fig, directory, "predicted_vs_true.png"))

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for name, entry in report["predictors"].items():
        c = entry["calibration"]
        ax.plot(c["true_quantiles"], np.maximum(c["predicted_quantiles"], MIN_WRITTEN_PREDICTION), marker=".", label=name)
    ax.plot([low, high], [low, high], "k--", lw=0.8, label="calibrated")
    threshold = report["settings"]["share_threshold"]
    ax.axhline(threshold, color="grey", lw=0.6, ls=":")
    ax.axvline(threshold, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("true length quantile (tokens)")
    ax.set_ylabel("predicted r_hat_0 quantile (tokens)")
    ax.set_title("Calibration: quantiles 5%..95% (dotted: share threshold)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, directory, "calibration_qq.png"))
    if report.get("calibration"):
        written.append(pit_plot(report["calibration"], directory))
    return written


def pit_plot(section: Dict[str, Any], directory: str) -> str:
    """PIT histograms (share per inter-quantile bin over the bin's expected share; 1 is calibrated),
    static and at half of decoding, raw and conformal, one panel per predictor."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(section), figsize=(4.5 * len(section), 3.6), squeeze=False)
    for ax, (name, entry) in zip(axes.flat, section.items()):
        series = [(variant, point) for variant in ("raw", "conformal") if variant in entry for point in ("static", "at_50")]
        width = 0.8 / len(series)
        for i, (variant, point) in enumerate(series):
            pit = entry[variant][point]["pit"]
            ratio = np.asarray(pit["observed"]) / np.asarray(pit["expected"])
            ax.bar(np.arange(len(ratio)) + (i - (len(series) - 1) / 2) * width, ratio, width, label=f"{variant}, {point}")
        edges = [0, *entry["levels"], 1]
        ax.set_xticks(range(len(edges) - 1), [f"{lo:g}-{hi:g}" for lo, hi in zip(edges, edges[1:])], fontsize=7)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("PIT bin (quantile levels)")
        ax.set_ylabel("observed / expected share")
        ax.legend(fontsize=7)
    return _save(fig, directory, "pit.png")


def _save(fig, directory: str, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=120)
    plt.close(fig)
    return name
