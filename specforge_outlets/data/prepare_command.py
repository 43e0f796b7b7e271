"""``outlets prepare``: a dataset -> normalised conversations, split into train.jsonl / test.jsonl.

``--max-samples N`` keeps the first N usable rows (what "the first 64 prompts" means), or with
``--sample random`` N rows drawn with ``--seed`` from all usable rows, kept in input order: prompt
files are often sorted (the ShareGPT set in ../shared/data is sorted longest first), so the first N
are not representative. The 4:1 split is then seeded and made by prompt group
(``data/prompt_groups.py``): twins and near-duplicates always land in one split, and summary.json
says how many groups there are and how many rows the grouping moved. Bad rows are skipped, named
and counted in summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any, Dict, List

from specforge_outlets.data.conversations import RowError, normalise_row, user_questions
from specforge_outlets.data.jsonl import BadLine, write_jsonl
from specforge_outlets.data.sources import DATASETS, iter_source
from specforge_outlets.data.prompt_groups import group_sizes, prompt_groups
from specforge_outlets.data.split import sample_rows, split_rows
from specforge_outlets.errors import OutletsError

MAX_REPORTED = 20  # skipped rows printed one by one; the rest are only counted


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare", help="normalise a prompt dataset to conversations and split it train/test 4:1"
    )
    parser.add_argument("--dataset", required=True, help=f"one of {', '.join(DATASETS)}")
    parser.add_argument("--path", help="local JSON or JSONL file (instead of the hub)")
    parser.add_argument("--output", required=True, help="directory for train.jsonl, test.jsonl, summary.json")
    parser.add_argument("--first-turn-only", action="store_true", help="keep only the first user turn")
    parser.add_argument("--max-samples", type=int, help="keep N usable rows (see --sample)")
    parser.add_argument("--sample", choices=("first", "random"), default="first",
                        help="with --max-samples: the first N rows, or N rows drawn with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_samples is not None and args.max_samples < 1:
        raise OutletsError(f"--max-samples must be >= 1, got {args.max_samples}")
    summary = prepare(
        args.dataset, args.path, args.output, args.first_turn_only, args.max_samples, args.seed, args.sample
    )
    print(
        f"prepared {summary['kept']} conversations ({summary['train']} train, {summary['test']} test), "
        f"skipped {summary['skipped']} -> {args.output}"
    )
    return 0


def prepare(
    dataset: str,
    path: str | None,
    output: str,
    first_turn_only: bool,
    max_samples: int | None,
    seed: int,
    sample: str = "first",
) -> Dict[str, Any]:
    rows: List[Dict[str, Any]] = []
    seen: set[str] = set()
    reasons: Counter[str] = Counter()
    read = 0
    for where, raw in iter_source(dataset, path):
        if sample == "first" and max_samples is not None and len(rows) >= max_samples:
            break
        read += 1
        try:
            if isinstance(raw, BadLine):
                reasons["malformed JSON"] += 1
                _report(reasons, str(raw))
                continue
            row = normalise_row(raw, fallback_id=f"{dataset}-{read - 1}", first_turn_only=first_turn_only)
        except RowError as exc:
            reasons[exc.reason] += 1
            _report(reasons, f"{where} (id {raw.get('id', '?')}): skipped: {exc}")
            continue
        if row["id"] in seen:
            reasons["duplicate id"] += 1
            _report(reasons, f"{where}: skipped: id {row['id']!r} already used by an earlier row")
            continue
        seen.add(row["id"])
        rows.append(row)
    if not rows:
        raise OutletsError(f"--dataset {dataset}: no usable rows (skipped {sum(reasons.values())})")
    if sample == "random" and max_samples is not None and len(rows) > max_samples:
        rows = sample_rows(rows, max_samples, seed)
    groups = prompt_groups([prompt_text(row) for row in rows])
    train, test = split_rows(rows, seed=seed, groups=groups)
    empty = [name for name, split in (("train", train), ("test", test)) if not split]
    if empty:
        raise OutletsError(
            f"--dataset {dataset}: {len(rows)} usable rows in {len(set(groups))} prompt group(s) leave the "
            f"{' and '.join(empty)} split empty (skipped {sum(reasons.values())}); give at least 5 distinct "
            "prompts (the split is 4:1 by prompt group)"
        )
    ungrouped_test = {row["id"] for row in split_rows(rows, seed=seed)[1]}
    os.makedirs(output, exist_ok=True)
    write_jsonl(os.path.join(output, "train.jsonl"), train)
    write_jsonl(os.path.join(output, "test.jsonl"), test)
    summary = {
        "dataset": dataset,
        "path": path,
        "first_turn_only": first_turn_only,
        "max_samples": max_samples,
        "sample": sample,
        "seed": seed,
        "read": read,
        "kept": len(rows),
        "skipped": sum(reasons.values()),
        "skipped_by_reason": dict(reasons),
        "train": len(train),
        "test": len(test),
        "prompt_groups": group_sizes(groups),
        "moved_by_grouping": len(ungrouped_test.symmetric_difference(row["id"] for row in test)),
    }
    with open(os.path.join(output, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    return summary


def prompt_text(row: Dict[str, Any]) -> str:
    """The text a row's group is decided on: its user turns, in order."""
    return "\n".join(user_questions(row["conversations"]))


def _report(reasons: Counter[str], message: str) -> None:
    total = sum(reasons.values())
    if total <= MAX_REPORTED:
        print(message)
    elif total == MAX_REPORTED + 1:
        print("... further skipped rows are counted in summary.json only")
