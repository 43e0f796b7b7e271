"""``outlets eval``: OUTLETS' length predictions against the baselines, drafting quality, overhead.

    outlets eval --draft EXPORT [--sd-only-draft EXPORT] [--lp-only-draft EXPORT] --features TEST \
        [--train-features TRAIN] --target T --output OUT [--baselines constant,probe,bert,lm-classifier,pia,egtp,estp] \
        [--noise-samples A.jsonl B.jsonl ...]

Every predictor is fitted on the train split and scored on the test split (``metrics``). The report
is written into a temporary directory next to ``--output`` and renamed at the end, so a failed run
never leaves a directory that looks like a finished report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from specforge_outlets import wandb_report
from specforge_outlets.data.jsonl import write_jsonl
from specforge_outlets.evaluation.predictions_file import write_predictions
from specforge_outlets.training.settings import CENSORED_TARGETS
from specforge_outlets.evaluation.report_file import REPORT_VERSION, recorded_path, write_report
from specforge_outlets.errors import OutletsError

# name -> "module:class"; each baseline is its own module implementing evaluation.predictor_api.Predictor
BASELINES = {
    "constant": "specforge_outlets.evaluation.baselines.constant:ConstantPredictor",
    "probe-mid": "specforge_outlets.evaluation.baselines.probe:MidProbePredictor",
    "probe-last": "specforge_outlets.evaluation.baselines.probe:LastProbePredictor",
    "bert": "specforge_outlets.evaluation.baselines.prompt_encoder:PromptEncoderPredictor",
    "lm-classifier": "specforge_outlets.evaluation.baselines.lm_classifier:BucketClassifierPredictor",
    "pia": "specforge_outlets.evaluation.baselines.instruction:InstructionPredictor",
    "egtp": "specforge_outlets.evaluation.baselines.egtp:EgtpPredictor",
    "estp": "specforge_outlets.evaluation.baselines.estp:EstpPredictor",
}
ALIASES = {"probe": ("probe-mid", "probe-last")}  # the probe at both depths, as TRAIL compares them
PREDICTIONS_GZ = "predictions.jsonl.gz"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate length prediction (static/dynamic MAE) against baselines, drafting quality, overhead",
        description="Score an exported OUTLETS draft and the baselines on captured test features.",
    )
    parser.add_argument("--draft", help="`outlets export` directory of the OUTLETS draft (omit: baselines only)")
    parser.add_argument("--sd-only-draft", help="export of a draft trained without the length loss, for drafting quality")
    parser.add_argument("--lp-only-draft", help="export of a draft trained without the drafting loss: the lp-only row")
    parser.add_argument("--features", required=True, help="test split: feature directory from `outlets capture`")
    parser.add_argument("--train-features", help="train split the baselines are fitted on (not needed with --baselines none)")
    parser.add_argument("--target", help="target model (directory, hub name or smollm2-135m); default: the test manifest's")
    parser.add_argument("--output", required=True, help="report directory (must not exist unless --overwrite)")
    parser.add_argument("--baselines",
                        help=f"comma list of {', '.join(BASELINES)} (probe: both probes), or 'none' (default: all "
                             "whose packages are installed; the report names any left out)")
    parser.add_argument("--noise-samples", nargs="+", default=[], metavar="JSONL",
                        help="the test prompts regenerated with other seeds (rows keyed by the test ids): "
                             "adds the sampling-noise floor to the table")
    parser.add_argument("--max-new-tokens", type=int,
                        help="the test responses' generation limit (pia clips to it); default: the regeneration summary's")
    parser.add_argument("--share-threshold", type=int, default=800,
                        help="calibration: share of requests predicted / truly at or above this many tokens")
    parser.add_argument("--censored-training", choices=CENSORED_TARGETS, default=CENSORED_TARGETS[0],
                        help="learned baselines: leave censored training responses out (drop), or fit them "
                             "one-sided, as at least their generated length (one_sided; OUTLETS' own head is set "
                             "by its recipe's outlets.length_censored)")
    parser.add_argument("--quantile-levels", type=parse_levels, metavar="LEVELS",
                        help="the probes also fit a quantile head (OUTLETS' output form and loss) at these levels (e.g. 0.1,0.25,0.5,0.75,0.9; "
                             "a draft trained with outlets.quantile_levels brings its own): coverage and PIT in the report")
    parser.add_argument("--calibration-features",
                        help="responses no predictor trained on (a prompt-group split of the train capture): the "
                             "split-conformal correction of every quantile predictor, scored beside the raw one")
    parser.add_argument("--classifier-lm", help="lm-classifier: another causal LM directory (default: the target's states)")
    parser.add_argument("--ttt-length", type=int, default=3, help="drafting: TTT steps unrolled (default 3, the CPU recipes')")
    parser.add_argument("--no-drafting", action="store_true", help="skip the drafting-quality pass")
    parser.add_argument("--timing-repeats", type=int, default=200, help="overhead: timed repeats (after 20 warm-up)")
    parser.add_argument("--short-max", type=int, default=200, help="length bucket: short is L < this")
    parser.add_argument("--long-min", type=int, default=500, help="length bucket: long is L > this")
    parser.add_argument("--compile", action="store_true",
                        help="keep SpecForge's torch.compile kernels (default: eager; compiling costs minutes on CPU)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice; 1 gives steadier timings on a shared CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing report directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    wandb_report.add_arguments(parser)
    parser.set_defaults(func=run)


def parse_levels(text: str) -> tuple:
    """``0.1,0.5,0.9`` or ``[0.1,0.5,0.9]``: strictly increasing levels in (0, 1)."""
    from specforge_outlets.model.quantile_head import check_levels

    try:
        return check_levels(float(part) for part in text.strip("[] ").split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def parse_baselines(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["none"]:
        return []
    unknown = [name for name in names if name not in BASELINES and name not in ALIASES]
    if unknown or not names:
        raise OutletsError(f"--baselines {text!r}: unknown {unknown or 'empty list'}; choose from "
                           f"{', '.join([*BASELINES, *ALIASES])} or none")
    return list(dict.fromkeys(member for name in names for member in ALIASES.get(name, (name,))))


def baseline_class(name: str):
    module, cls = BASELINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_baseline(name: str, context):
    return baseline_class(name)(context)


def runnable_baselines(names: List[str], chosen: bool) -> Tuple[List[str], Dict[str, str]]:
    """(the baselines to run, those left out -> the install each lacks), decided before anything is
    fitted: a baseline named in --baselines whose package is missing is refused; the default list
    leaves it out, and the report names it."""
    missing = {name: lack for name in names if (lack := baseline_class(name).missing_dependency())}
    if missing and chosen:
        raise OutletsError("; ".join(f"--baselines {name} needs {lack}" for name, lack in missing.items())
                           + f"; install it or leave {', '.join(missing)} out of --baselines")
    for name, lack in missing.items():
        print(f"warning: baseline {name} left out: it needs {lack}", file=sys.stderr)
    return [name for name in names if name not in missing], missing


def run(args: argparse.Namespace) -> int:
    wandb_report.check_login(args)
    baselines, skipped = runnable_baselines(parse_baselines(args.baselines or ",".join(BASELINES)),
                                            chosen=args.baselines is not None)
    if baselines and not args.train_features:
        raise OutletsError(f"--train-features is needed to fit the baselines ({', '.join(baselines)}): pass the train "
                           "split's feature directory, or --baselines none to score the drafts alone")
    for name in ("max_new_tokens", "share_threshold"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise OutletsError(f"--{name.replace('_', '-')} must be >= 1 token, got {getattr(args, name)}")
    output = os.path.abspath(args.output)
    if os.path.exists(output) and os.listdir(output) and not args.overwrite:
        raise OutletsError(f"--output {args.output} exists and is not empty; choose a new directory or pass --overwrite")
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(output)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        import torch._dynamo

        with torch._dynamo.config.patch(disable=not args.compile):
            report = evaluate(args, baselines, tmp, skipped)
        if os.path.exists(output):
            shutil.rmtree(output)
        os.replace(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_summary(report, output)
    wandb_report.log_run(args, "eval", output, {key: report[key] for key in REPORT_CONFIG},
                         {"predictors": predictors_table(report)}, wandb_report.plots_in(output))
    return 0


REPORT_CONFIG = ("features", "train_features", "target", "draft", "sd_only_draft", "lp_only_draft", "n_requests",
                 "n_censored", "n_train_requests", "settings")
PREDICTOR_COLUMNS = ("static_mae", "dynamic_mae", "dynamic_source", "spearman", "n_requests", "fit_seconds",
                     "predict_seconds")


def predictors_table(report: Dict[str, Any]) -> "wandb_report.Table":
    """The report's predictors, one row each: the markdown table's numbers, for wandb."""
    rows = [[name, *(entry.get(key) for key in PREDICTOR_COLUMNS)] for name, entry in report["predictors"].items()]
    return ["predictor", *PREDICTOR_COLUMNS], rows


def _resolve_target(args, manifest: Dict[str, Any]) -> Optional[str]:
    from specforge_outlets.data.targets import resolve_target

    target = args.target or manifest.get("target_path") or manifest.get("target")
    return resolve_target(target) if target else None


def _check_target(target_path: Optional[str], test) -> None:
    config = os.path.join(target_path or "", "config.json")
    if not target_path or not os.path.isfile(config):
        return
    with open(config, encoding="utf-8") as handle:
        hidden = json.load(handle).get("hidden_size")
    if hidden and int(hidden) != test.hidden_size:
        raise OutletsError(
            f"{test.requests[0].file}: hidden size {test.hidden_size} does not match --target {target_path} "
            f"(hidden_size {hidden}); these features were captured from another target model"
        )


def _noise_samples(paths: List[str], test, target_path: Optional[str]):
    """The noise samples, tokenised as the test responses were (the target's tokenizer and end token)."""
    from transformers import AutoTokenizer

    from specforge_outlets.evaluation.noise import load_noise_samples

    end_id = test.manifest.get("end_of_turn_token_id")
    if target_path is None or end_id is None:
        raise OutletsError("--noise-samples counts tokens as capture did: it needs --target and the test "
                           f"{test.directory}/manifest.json's end_of_turn_token_id (written by `outlets capture`)")
    return load_noise_samples(paths, test, AutoTokenizer.from_pretrained(target_path), int(end_id))


def check_no_shared_prompts(train, test) -> None:
    """Refuse a train and test split that share a prompt group (a twin scored on what was trained on).

    Read from the prompts the manifests' regenerated JSONL holds; requests without prompt text are
    not checked.
    """
    from specforge_outlets.data.prompt_groups import check_split_groups

    def prompts(split):
        rows = {r.row_id: r.messages for r in split.with_censored().requests if r.turn == 0 and r.messages}
        return [(row_id, "\n".join(t["content"] for t in messages if t["role"] == "user"))
                for row_id, messages in rows.items()]

    check_split_groups({"train": prompts(train), "test": prompts(test)})


def evaluate(args: argparse.Namespace, baselines: List[str], out: str,
             skipped: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    import torch

    from specforge_outlets.evaluation import drafting, metrics, overhead, report as reporting
    from specforge_outlets.evaluation.outlets_predictor import (LP_ONLY, OutletsPredictor, check_export_matches_features,
                                                                check_features_match_draft, load_draft)
    from specforge_outlets.evaluation.predictor_api import EvalContext, check_predictions
    from specforge_outlets.evaluation.requests import generation_limit, load_split

    progress = not args.no_progress
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    test = load_split(args.features, name="features")
    target_path = _resolve_target(args, test.manifest)
    _check_target(target_path, test)
    if (args.draft or args.lp_only_draft) and target_path is None:
        raise OutletsError("--draft and --lp-only-draft need the target (its token embedding): pass --target")
    options = (("draft", args.draft), ("sd_only_draft", args.sd_only_draft), ("lp_only_draft", args.lp_only_draft))
    for option, directory in options:
        if directory:
            check_export_matches_features(directory, f"--{option.replace('_', '-')}", test)
    drafts = {option: load_draft(directory, target_path, f"--{option.replace('_', '-')}") if directory else None
              for option, directory in options}
    for option, model in drafts.items():
        if model is not None:
            check_features_match_draft(model, getattr(args, option), test)
    draft, sd_only = drafts["draft"], drafts["sd_only_draft"]
    train = None  # --baselines none: the drafts fit nothing
    if args.train_features:
        train = load_split(args.train_features, hidden_size=test.hidden_size, name="train-features")
        check_no_shared_prompts(train, test)
    calibration = None
    if args.calibration_features:
        calibration = load_split(args.calibration_features, hidden_size=test.hidden_size, name="calibration-features")
        check_no_shared_prompts(calibration, test)
        if train is not None:
            check_no_shared_prompts(train, calibration)  # calibrating on training prompts under-corrects
    context = EvalContext(target_path=target_path, max_new_tokens=args.max_new_tokens or generation_limit(test),
                          device=args.device, seed=args.seed, progress=progress,
                          options={"classifier_lm": args.classifier_lm, "censored_training": args.censored_training,
                                   "quantile_levels": args.quantile_levels})
    predictors = ([OutletsPredictor(context, draft, args.draft)] if draft is not None else [])
    if drafts["lp_only_draft"] is not None:
        predictors.append(OutletsPredictor(context, drafts["lp_only_draft"], args.lp_only_draft, *LP_ONLY))
    predictors += [build_baseline(name, context) for name in baselines]
    if not predictors:
        raise OutletsError("nothing to evaluate: pass --draft or at least one baseline")
    everything = test.with_censored()  # predicted once; only the labelled requests are scored
    for predictor in predictors:  # a missing requirement is named before minutes of fitting
        predictor.check(everything)
    noise = _noise_samples(args.noise_samples, test, target_path) if args.noise_samples else None

    from tqdm import tqdm

    scored = [not request.censored for request in everything.requests]
    results: Dict[str, Any] = {}
    all_predictions: Dict[str, Any] = {}
    every_prediction: Dict[str, Any] = {}
    all_rows: List[Dict[str, Any]] = []
    calibrations: Dict[str, Any] = {}
    conformal: Dict[str, Any] = {}  # name+conformal -> the corrected predictions (quantiles only)
    os.makedirs(os.path.join(out, "predictions"))
    for predictor in tqdm(predictors, desc="predictors", unit="predictor", disable=not progress):
        torch.manual_seed(args.seed)
        started = time.perf_counter()
        predictor.fit(train)
        fitted = time.perf_counter()
        predictions = predictor.predict(everything)
        done = time.perf_counter()
        check_predictions(predictor.name, everything, predictions)
        every_prediction[predictor.name] = predictions
        if predictor.quantile_levels:
            levels = {tuple(entry["levels"]) for entry in calibrations.values()} | {tuple(predictor.quantile_levels)}
            if len(levels) > 1:
                raise OutletsError(f"predictor {predictor.name}: quantile levels {list(predictor.quantile_levels)} differ "
                                   f"from another predictor's {[list(l) for l in levels]}: pass --quantile-levels "
                                   "equal to the draft's outlets.quantile_levels")
            calibrations[predictor.name], corrected = quantile_calibration(predictor, everything, predictions,
                                                                           calibration)
            if corrected is not None:
                conformal[f"{predictor.name}+conformal"] = corrected
        predictions = [p for p, keep in zip(predictions, scored) if keep]
        entry = reporting.score(test, predictions, predictor.dynamic_source, short_max=args.short_max,
                                long_min=args.long_min, seed=args.seed, share_threshold=args.share_threshold)
        entry.update(description=predictor.description, fit_seconds=round(fitted - started, 2),
                     predict_seconds=round(done - fitted, 2), info=predictor.info)
        results[predictor.name] = entry
        all_predictions[predictor.name] = predictions
        rows = reporting.prediction_rows(test, predictions)
        write_predictions(os.path.join(out, "predictions", f"{predictor.name}.jsonl"), rows)
        all_rows += [(predictor.name, row) for row in rows]
    if (args.calibration_features or args.quantile_levels) and not calibrations:
        raise OutletsError("--calibration-features / --quantile-levels: no predictor gave quantiles; pass a --draft "
                           "trained with outlets.quantile_levels, or --quantile-levels with the probe baselines")
    write_jsonl(os.path.join(out, "predictions.jsonl"), [  # every predictor's rows in one file, named
        {"id": row.id, "predictor": name, "predicted_output_len": row.predicted_output_len,
         "true_output_len": row.true_output_len} for name, row in all_rows])
    reporting.write_jsonl_gz(os.path.join(out, PREDICTIONS_GZ),
                             reporting.request_rows(everything, every_prediction, conformal,
                                                    next(iter(calibrations.values()))["levels"] if calibrations else None))

    drafting_report = None
    if not args.no_drafting and (draft is not None or sd_only is not None):
        head = drafting.load_target_head(target_path)
        drafting_report = {}
        for name, model in (("outlets", draft), ("sd_only", sd_only)):
            if model is not None:
                drafting_report[name] = drafting.drafting_metrics(
                    model, head, test.files(), ttt_length=args.ttt_length, progress=progress, desc=f"drafting: {name}")
        if draft is not None and sd_only is not None:
            drafting_report["comparison"] = drafting.compare(drafting_report["outlets"], drafting_report["sd_only"])
    overhead_report = None
    if draft is not None:
        overhead_report = {"parameters": overhead.parameter_counts(draft),
                           "timing": overhead.measure(draft, repeats=args.timing_repeats, device=args.device)}

    ranked = lambda key: sorted(results, key=lambda name: results[name][key])  # noqa: E731
    report = {
        "version": REPORT_VERSION,
        "features": recorded_path(args.features),
        "train_features": recorded_path(args.train_features),
        "target": recorded_path(target_path),
        "draft": recorded_path(args.draft),
        "sd_only_draft": recorded_path(args.sd_only_draft),
        "lp_only_draft": recorded_path(args.lp_only_draft),
        "n_requests": len(test),
        "n_censored": len(test.censored),
        "n_train_requests": len(train) if train is not None else 0,
        "settings": {"buckets": {"short": args.short_max, "long": args.long_min}, "ttt_length": args.ttt_length,
                     "seed": args.seed, "baselines": baselines, "baselines_left_out": skipped or {},
                     "compile": args.compile,
                     "max_new_tokens": context.max_new_tokens, "share_threshold": args.share_threshold,
                     "censored_training": args.censored_training,
                     "bootstrap": {"resamples": metrics.BOOTSTRAP_RESAMPLES, "confidence": metrics.CONFIDENCE,
                                   "seed": args.seed}},
        "predictors": results,
        "ranking": {"static_mae": ranked("static_mae"), "dynamic_mae": ranked("dynamic_mae")},
        "noise_floor": reporting.noise_floor(noise, seed=args.seed) if noise else None,
        "ceiling": reporting.ceiling_section(noise, test, all_predictions, seed=args.seed) if noise else None,
        "censoring": reporting.censoring_section(everything, every_prediction, next(iter(every_prediction)),
                                                 seed=args.seed),
        "calibration": calibrations or None,
        "predictions_file": PREDICTIONS_GZ,
        "drafting": drafting_report,
        "overhead": overhead_report,
    }
    report["plots"] = reporting.plots(report, test, all_predictions, out)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(reporting.markdown(report))
    write_report(out, report)  # last: its presence means finished
    return report


def quantile_calibration(predictor, everything, predictions, calibration):
    """Coverage and PIT of a quantile predictor on the test split; with a calibration split, its
    conformal shifts and the corrected predictions' coverage and PIT too."""
    from specforge_outlets.evaluation import calibration as calib
    from specforge_outlets.evaluation.predictor_api import check_predictions

    levels = predictor.quantile_levels
    entry: Dict[str, Any] = {"levels": list(levels), "raw": calib.summary(everything.requests, predictions, levels)}
    if calibration is None:
        return entry, None
    held = calibration.with_censored()
    held_predictions = predictor.predict(held)
    check_predictions(predictor.name, held, held_predictions)
    shifts = calib.calibrate(held.requests, held_predictions, levels)
    corrected = [calib.shifted(p, shifts["static"], shifts["dynamic"]) for p in predictions]
    entry.update(calibration_requests=len(held), shifts=shifts,
                 conformal=calib.summary(everything.requests, corrected, levels))
    return entry, corrected


def print_summary(report: Dict[str, Any], output: str) -> None:
    print(f"\nlength prediction on {report['n_requests']} test requests (MAE, tokens):")
    for name, entry in report["predictors"].items():
        print(f"  {name:14s} static {entry['static_mae']:8.1f}   dynamic {entry['dynamic_mae']:8.1f} ({entry['dynamic_source']})")
    if report.get("noise_floor"):
        print(f"  {'noise floor':14s} static {report['noise_floor']['static_mae']:8.1f}   (same prompt, other samples)")
    if report.get("drafting") and report["drafting"].get("comparison"):
        c = report["drafting"]["comparison"]
        print(f"drafting: acceptance rate vs SD-only {100 * c['acceptance_rate_relative_change']:+.2f}%")
    if report.get("overhead"):
        p, t = report["overhead"]["parameters"], report["overhead"]["timing"]
        print(f"overhead: length head {p['length_head']:,} params ({100 * p['head_share']:.2f}%), "
              f"{t['length_head_step_ms']:.3f} ms/step ({100 * t['head_time_share']:.2f}% of a draft step)")
    print(f"report: {os.path.join(output, 'report.md')}", file=sys.stdout)
