"""The committed ShareGPT evaluation rescored honestly: deduplicated test rows, censored ones counted.

The drafts and baselines of ``benchmarks/data/sharegpt-smollm2/eval/predictions.jsonl.gz`` were
trained before the label set was split by prompt group. This scores their recorded predictions
without running a model: only on the test rows of the group split (``--split-dir``) whose prompt
group holds no response they trained on (``--trained-on``, the packed train file they trained on;
``eval/trained-on.jsonl.gz`` keeps its ids), with the censoring-aware scores and paired intervals
of ``outlets eval`` and the floor and ranking ceiling on the rows that have repeated samples.

With ``--fresh``, the baselines come from ``outlets eval`` runs on the group split itself
(retrained there, EGTP and ESTP among them, with and without one-sided censored training) and
only the drafts, too costly to retrain on a CPU, from the recorded file; every predictor is scored
on the requests all files hold, and the merged record goes to ``eval/group-split/``.

    python benchmarks/rescore_committed_eval.py --split-dir RUN/data                  # eval/dedup-rescore.*
    python benchmarks/rescore_committed_eval.py --split-dir RUN/data --fresh RUN/report-drop RUN/report-one-sided:+one-sided
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Tuple

import numpy as np

from specforge_outlets.studies.committed_data import LABEL_SET, SHAREGPT_PROMPTS, shared

from specforge_outlets.atomic import write_text_atomic
from specforge_outlets.data.jsonl import iter_jsonl
from specforge_outlets.data.label_set import read_packed
from specforge_outlets.data.prompt_groups import prompt_groups
from specforge_outlets.evaluation import metrics, report as reporting
from specforge_outlets.evaluation.noise import NoiseSamples
from specforge_outlets.evaluation.predictions_file import iter_record
from specforge_outlets.evaluation.report_file import recorded_path
from specforge_outlets.evaluation.predictor_api import Prediction
from specforge_outlets.evaluation.requests import Request, Split
from specforge_outlets.studies.label_set_drafts import NOISE_SEEDS

PACKED = LABEL_SET
EVAL = os.path.join(PACKED, "eval")


def recorded_fresh(spec: str) -> str:
    """A ``--fresh DIR[:SUFFIX]`` as the report records it: its directory named without a machine path."""
    directory, colon, suffix = spec.partition(":")
    return recorded_path(directory) + colon + suffix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split-dir", required=True, help="the group split's prepare output (test.jsonl)")
    parser.add_argument("--trained-on", default=os.path.join(EVAL, "trained-on.jsonl.gz"),
                        help="ids the predictions' predictors trained on (one JSON object with 'id' a line)")
    parser.add_argument("--fresh", nargs="+", default=[], metavar="DIR[:SUFFIX]",
                        help="`outlets eval` reports on the group split (baselines retrained there): their "
                             "predictors replace the recorded baselines, names suffixed with SUFFIX when given; "
                             "the recorded file then only supplies the drafts")
    parser.add_argument("--drafts", default="outlets,pia",
                        help="with --fresh: the recorded predictors kept: the draft, too costly to retrain here, "
                             "and PIA, which trains on nothing (the target asked), so its answers hold on any row")
    parser.add_argument("--output", help=f"report directory (default: {EVAL}, or {EVAL}/group-split with --fresh)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trained = {row["id"] for _, row in iter_jsonl(args.trained_on)}
    prompts = {row["id"]: row["prompt"] for _, row in iter_jsonl(shared(SHAREGPT_PROMPTS, "the rescoring (prompt groups)"))}
    ids = sorted(prompts)
    groups = dict(zip(ids, (ids[g] for g in prompt_groups([prompts[i] for i in ids]))))
    seen_groups = {groups[i] for i in trained}
    test_ids = {row["id"] for _, row in iter_jsonl(os.path.join(args.split_dir, "test.jsonl"))}
    recorded = read_rows(os.path.join(EVAL, "predictions.jsonl.gz"), "the recorded evaluation")
    kept = [r for r in recorded if r["id"] in test_ids and groups[r["id"]] not in seen_groups]
    left_out = {"not in the group split's test": sum(r["id"] not in test_ids for r in recorded),
                "prompt group trained on": sum(r["id"] in test_ids and groups[r["id"]] in seen_groups for r in recorded)}
    if args.fresh:
        kept = merge_fresh(kept, [read_fresh(spec) for spec in args.fresh], args.drafts.split(","))
    output = args.output or (os.path.join(EVAL, "group-split") if args.fresh else EVAL)
    names = list(kept[0]["static"])
    requests = [Request(r["id"], "", 1, int(r["true_output_len"]), None, r["id"], 0, bool(r["censored"])) for r in kept]
    predictions = {name: [Prediction(r["static"][name], np.asarray(r["dynamic"][name]) if name in r["dynamic"] else None)
                          for r in kept] for name in names}
    everything = Split("recorded", requests, {}, 0)
    scored = [i for i, r in enumerate(requests) if not r.censored]
    finished = Split("recorded", [requests[i] for i in scored], {}, 0)
    finished_scores = {}
    for name in names:
        values = [predictions[name][i] for i in scored]
        dynamic = [p.dynamic if p.dynamic is not None else metrics.countdown(p.static, r.length)
                   for p, r in zip(values, finished.requests)]
        finished_scores[name] = {"static_mae": metrics.static_mae(finished.lengths, [p.static for p in values]),
                                 "dynamic_mae": metrics.dynamic_mae(finished.lengths, dynamic),
                                 "spearman": metrics.spearman([p.static for p in values], finished.lengths)}
    result = {
        "recorded_requests": len(recorded),
        "kept_requests": len(kept),
        "left_out": left_out,
        "fresh_reports": [recorded_fresh(spec) for spec in args.fresh],
        "finished_only": finished_scores,
        "censoring": reporting.censoring_section(everything, predictions, "outlets", seed=args.seed),
        "ceiling": reporting.ceiling_section(noise_samples(kept), finished,
                                             {n: [predictions[n][i] for i in scored] for n in names}, seed=args.seed),
    }
    os.makedirs(output, exist_ok=True)
    stem = "report" if args.fresh else "dedup-rescore"
    write_text_atomic(os.path.join(output, f"{stem}.json"), json.dumps(result, indent=2))
    write_text_atomic(os.path.join(output, f"{stem}.md"), markdown(result))
    if args.fresh:
        reporting.write_jsonl_gz(os.path.join(output, "predictions.jsonl.gz"), kept)
    print(markdown(result))
    return 0


def read_rows(path: str, flag: str) -> List[Dict]:
    return [row for _, row in iter_record(path, flag)]


def read_fresh(spec: str) -> Tuple[str, List[Dict]]:
    """``DIR[:SUFFIX]``: the suffix and the rows of that report's ``predictions.jsonl.gz``."""
    directory, _, suffix = spec.partition(":")
    path = os.path.join(directory, "predictions.jsonl.gz")
    if not os.path.isfile(path):
        raise SystemExit(f"--fresh {spec}: no {path}; run `outlets eval --output {directory}` first")
    return suffix, read_rows(path, f"--fresh {spec}")


def merge_fresh(recorded: List[Dict], fresh: List[Tuple[str, List[Dict]]], drafts: List[str]) -> List[Dict]:
    """The recorded drafts joined by id to the fresh reports' predictors, on the requests all of them hold.

    The same id must carry the same response in every file (length and censoring): the label set's
    seed-0 responses are reassigned, never regenerated, so a mismatch means a file of another label set.
    """
    missing = [name for name in drafts if name not in recorded[0]["static"]]
    if missing:
        raise SystemExit(f"--drafts {','.join(drafts)}: the recorded file has no {', '.join(missing)} "
                         f"(it holds {', '.join(recorded[0]['static'])})")
    merged = {r["id"]: {"id": r["id"], "true_output_len": r["true_output_len"], "censored": r["censored"],
                        "static": {n: r["static"][n] for n in drafts},
                        "dynamic": {n: r["dynamic"][n] for n in drafts if n in r["dynamic"]}} for r in recorded}
    for suffix, rows in fresh:
        by_id = {r["id"]: r for r in rows}
        for request_id in list(merged):
            row, into = by_id.get(request_id), merged[request_id]
            if row is None:
                del merged[request_id]
                continue
            if (row["true_output_len"], row["censored"]) != (into["true_output_len"], into["censored"]):
                raise SystemExit(f"request {request_id}: {row['true_output_len']} tokens (censored {row['censored']}) "
                                 f"in a fresh report, {into['true_output_len']} ({into['censored']}) recorded; "
                                 "both must come from the same label set")
            into["static"].update({name + suffix: value for name, value in row["static"].items()})
            into["dynamic"].update({name + suffix: value for name, value in row["dynamic"].items()})
    if not merged:
        raise SystemExit("no request is in every file: the fresh reports and the recorded one share no test id")
    return list(merged.values())


def noise_samples(kept: List[Dict]) -> NoiseSamples:
    """Each kept prompt's finished first-turn lengths, the scored response first, from the packed noise files."""
    lengths = {r["id"]: ([] if r["censored"] else [int(r["true_output_len"])]) for r in kept}
    drawn = {r["id"]: 1 for r in kept}
    for seed in NOISE_SEEDS:
        for row in read_packed(os.path.join(PACKED, f"noise-seed{seed}.jsonl.gz")):
            if row["id"] in lengths:
                drawn[row["id"]] += 1
                if "filtered" not in row:
                    lengths[row["id"]].append(int(row["turns"][0]["num_tokens"]))
    return NoiseSamples(lengths, drawn=drawn)


def markdown(result: Dict) -> str:
    title = ("# Every predictor on the group split's test requests" if result["fresh_reports"]
             else "# The committed evaluation on the deduplicated test split")
    lines = [title, "",
             f"{result['kept_requests']} of the {result['recorded_requests']} recorded test requests: left out "
             + ", ".join(f"{count} {why}" for why, count in result["left_out"].items()) + ".", "",
             "## Finished responses only", "", "| predictor | static MAE | dynamic MAE | Spearman |", "|---|---:|---:|---:|"]
    for name, entry in result["finished_only"].items():
        spearman = "–" if entry["spearman"] is None else f"{entry['spearman']:.3f}"
        lines.append(f"| {name} | {entry['static_mae']:.1f} | {entry['dynamic_mae']:.1f} | {spearman} |")
    return "\n".join(lines + reporting.censoring_markdown(result)) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
