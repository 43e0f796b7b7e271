"""``outlets capture``: regenerated conversations -> feature files with length labels.

Two modes:
  ``--target T --input REGENERATED --output DIR``: teacher-forced capture with transformers (CPU,
  small GPUs), one ``data_<i>.ckpt`` per conversation plus ``manifest.json``.
  ``--add-labels DIR --input REGENERATED``: add labels to files from SpecForge's SGLang capture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

from specforge_outlets.atomic import directory_replaced, partial_path
from specforge_outlets.data.conversations import RowError
from specforge_outlets.data.features import FEATURE_SUFFIX, save_features
from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.data.manifest import LABELS_SUMMARY, write_manifest
from specforge_outlets.errors import OutletsError

MAX_REPORTED = 50
TURN_ROLES = ("system", "user", "assistant")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("capture", help="capture target features and length labels for training")
    parser.add_argument("--input", help="regenerated JSONL (from `outlets regenerate`)")
    parser.add_argument("--target", help="model directory, hub name or smollm2-135m")
    parser.add_argument("--output", help="directory for the feature files and manifest.json")
    parser.add_argument("--add-labels", metavar="DIR", help="instead: label SpecForge-captured files in DIR")
    parser.add_argument("--specforge-ranks", type=int, default=1, metavar="R",
                        help="--add-labels: the data-parallel ranks SpecForge's capture ran on (torchrun processes "
                             "/ its --tp-size; default 1): they decide which conversation each file holds")
    parser.add_argument("--specforge-batch-size", type=int, default=32, metavar="B",
                        help="--add-labels: SpecForge's --batch-size (default 32, its own)")
    parser.add_argument("--num-samples", type=int, metavar="N", help="--add-labels: SpecForge's --num-samples, if given")
    parser.add_argument("--specforge-draft-config", metavar="DRAFT_JSON",
                        help="instead: write DRAFT_JSON (a recipe's model.draft_model_config) to --output as the stock "
                             "EAGLE-3 draft config SpecForge's prepare_hidden_states.py --draft-model-config takes, "
                             "capturing --fusion-layers of --target (docs/data.md)")
    parser.add_argument("--fusion-layers", help="three hidden_states indices a,b,c (default 2,N/2,N-2)")
    parser.add_argument("--max-length", type=int, default=2048, help="skip longer conversations (tokens)")
    parser.add_argument("--chat-template", help="Jinja file replacing the tokenizer's chat template")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="stored hidden states")
    parser.add_argument("--split", help="split name for the manifest (default: the input file's stem)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--resume", action="store_true",
                        help="keep the feature files already in --output (checked against their rows), capture the rest")
    parser.add_argument("--shard", metavar="K/N",
                        help="capture only rows K, K+N, K+2N, ... (one process per core); writes no manifest: "
                             "a last run with --resume and no --shard writes it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.specforge_draft_config:
        return _specforge_draft_config(args)
    if not args.input:
        raise OutletsError("capture needs --input (the regenerated JSONL)")
    if args.add_labels:
        return _add_labels(args)
    if not args.target or not args.output:
        raise OutletsError("capture needs --target and --output (or --add-labels DIR)")
    return _capture(args)


def _specforge_draft_config(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from specforge_outlets.data.specforge_draft_config import write_specforge_draft_config
    from specforge_outlets.data.targets import resolve_target
    from specforge_outlets.data.fusion_layers import default_fusion_layers, validate_fusion_layers

    if not args.target or not args.output:
        raise OutletsError("--specforge-draft-config needs --target (its depth decides the fusion layers) and --output FILE")
    num_layers = int(AutoConfig.from_pretrained(resolve_target(args.target)).num_hidden_layers)
    layers = _fusion_layers(args.fusion_layers, num_layers, default_fusion_layers, validate_fusion_layers)
    path = write_specforge_draft_config(args.specforge_draft_config, layers, args.output)
    print(f"wrote {path}: SpecForge's capture takes hidden_states{list(layers)} (pass it as --draft-model-config)")
    return 0


def read_rows(path: str) -> List[Dict[str, Any]]:
    """Regenerated rows in file order; a line that is not one is refused with its number, before any work."""
    if not os.path.isfile(path):
        raise OutletsError(f"--input {path}: no such file")
    rows = []
    for number, row in iter_jsonl(path):
        if isinstance(row, BadLine):
            raise OutletsError(f"{row}; fix or remove the line")
        if not isinstance(row.get("conversations"), list):
            raise OutletsError(
                f"{path}:{number} (id {row.get('id', '?')}): no 'conversations' list; capture reads "
                "regenerated conversations: run `outlets prepare` and `outlets regenerate` on prompts first"
            )
        problem = _turns_problem(row["conversations"])
        if problem:
            raise OutletsError(f"{path}:{number} (id {row.get('id', '?')}): {problem}; fix or remove the row "
                               "(`outlets prepare` and `outlets regenerate` write conversations capture reads)")
        rows.append(row)
    return rows


def _turns_problem(turns: List[Any]) -> Optional[str]:
    """What makes a conversation unreadable for the chat template, or None: turns must be role/content
    objects, and the first after an optional system turn is the user's (a prompt precedes every response)."""
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in TURN_ROLES or not isinstance(turn.get("content"), str):
            return f"turn {index} is not a {{'role': {'|'.join(TURN_ROLES)}, 'content': text}} object"
    spoken = [turn["role"] for turn in turns if turn["role"] != "system"]
    if spoken and spoken[0] != "user":
        return f"the conversation starts with an {spoken[0]} turn, before any user turn"
    return None


def _capture(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specforge_outlets.data.capture import TargetCapture
    from specforge_outlets.data.chat_tokens import tokenise_conversation
    from specforge_outlets.data.targets import end_of_turn_token_id, resolve_target
    from specforge_outlets.data.fusion_layers import default_fusion_layers, to_specforge_layer_ids, validate_fusion_layers

    shard, shards = _shard(args.shard)
    if not args.resume and _own_feature_files(args.output, shard, shards):
        whose = f" of shard {shard}/{shards}" if shards > 1 else ""
        raise OutletsError(f"--output {args.output} already holds feature files{whose}; choose a new directory "
                           "(or --resume to keep them)")
    if args.resume and not os.path.exists(args.output) and os.path.isdir(partial_path(args.output)):
        os.replace(partial_path(args.output), args.output)  # a new capture that was stopped: resumed in place
    counts: Counter[str] = Counter()
    rows = read_rows(args.input)
    path = resolve_target(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if args.chat_template:
        with open(args.chat_template, "r", encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    if not tokenizer.chat_template:
        raise OutletsError(f"--target {args.target}: the tokenizer has no chat template; pass --chat-template FILE")
    model = AutoModelForCausalLM.from_pretrained(path).to(args.device)
    config = model.config
    num_layers = int(config.num_hidden_layers)
    layers = _fusion_layers(args.fusion_layers, num_layers, default_fusion_layers, validate_fusion_layers)
    end_id = end_of_turn_token_id(tokenizer, model.generation_config)
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    limit = min(args.max_length, context) if context else args.max_length
    capture = TargetCapture(model, layers, getattr(torch, args.dtype))
    # A new directory is written beside itself and renamed when complete; resumed and sharded runs add to it.
    fresh = not args.resume and shards == 1 and not (os.path.isdir(args.output) and os.listdir(args.output))
    with directory_replaced(args.output) if fresh else nullcontext(args.output) as directory:
        os.makedirs(directory, exist_ok=True)
        files: List[Dict[str, Any]] = []
        started = time.time()
        for index, row in enumerate(tqdm(rows, desc="capture", unit="conv")):
            if index % shards != shard:
                continue
            row_id = row.get("id", f"row-{index}")
            try:
                tokens = tokenise_conversation(tokenizer, row["conversations"], end_id)
            except RowError as exc:
                _skip(counts, exc.reason, f"row {row_id}: skipped: {exc}")
                continue
            if len(tokens.input_ids) > limit:
                _skip(counts, "too long", f"row {row_id}: skipped: {len(tokens.input_ids)} tokens > limit {limit} (--max-length / context)")
                continue
            name = f"data_{index}{FEATURE_SUFFIX}"
            file_path = os.path.join(directory, name)
            features = _resumed(file_path, tokens, row_id) if args.resume and os.path.exists(file_path) else None
            if features is None:
                features = capture.features(tokens)
                save_features(file_path, features)
            else:
                counts["resumed"] += 1
            labelled = int((features["remaining_length"] > 0).sum())
            counts["written"] += 1
            counts["labelled_tokens"] += labelled
            counts["response_spans"] += len(tokens.censored)
            counts["censored_spans"] += sum(tokens.censored)
            files.append({"file": name, "id": row_id, "tokens": len(tokens.input_ids), "labelled_tokens": labelled})
        manifest = {
            "target": args.target,
            "target_path": path,
            "split": args.split or os.path.splitext(os.path.basename(args.input))[0],
            "input": args.input,
            "fusion_layers": list(layers),
            "specforge_layer_ids": to_specforge_layer_ids(layers),
            "hidden_size": int(config.hidden_size),
            "num_hidden_layers": num_layers,
            "vocab_size": int(config.vocab_size),
            "end_of_turn_token_id": end_id,
            "max_length": limit,
            "dtype": args.dtype,
            "seconds": round(time.time() - started, 1),
            "conversations": len(rows),
            "counts": dict(sorted(counts.items())),
            "files": files,
        }
        if shards > 1:
            print(f"shard {shard}/{shards}: wrote {counts['written']} feature files; run once more with --resume "
                  "and without --shard to check every file and write manifest.json")
            return 0
        write_manifest(directory, manifest)
        print(
            f"wrote {counts['written']} feature files ({counts['labelled_tokens']} labelled tokens, "
            f"{counts['censored_spans']} censored responses), skipped {counts['skipped']} -> {args.output}"
        )
        return 0


def _shard(text: Optional[str]) -> Tuple[int, int]:
    if not text:
        return 0, 1
    try:
        shard, shards = (int(part) for part in text.split("/"))
    except ValueError:
        raise OutletsError(f"--shard {text!r}: expected K/N, e.g. 0/2") from None
    if not 0 <= shard < shards:
        raise OutletsError(f"--shard {text}: K must be in 0..N-1")
    return shard, shards


def _own_feature_files(output: str, shard: int, shards: int) -> List[str]:
    """The feature files in ``output`` this run would write: all of them, or with ``--shard K/N`` those of rows
    K, K+N, ... (``data_<row>``), so that shards of one directory start independently."""
    if not os.path.isdir(output):
        return []
    names = [name for name in os.listdir(output) if name.endswith(FEATURE_SUFFIX)]
    if shards == 1:
        return names
    return [name for name in names
            if (match := re.fullmatch(rf"data_(\d+){re.escape(FEATURE_SUFFIX)}", name)) and int(match.group(1)) % shards == shard]


def _resumed(path: str, tokens, row_id: str) -> Optional[Dict[str, Any]]:
    """The features already in ``path`` when they are this row's (same tokens), else None (recaptured)."""
    from specforge_outlets.data.features import FeatureFileError, load_features

    try:
        features = load_features(path)
    except FeatureFileError as exc:
        print(f"row {row_id}: {exc}; capturing it again")
        return None
    if features["input_ids"].tolist() != list(tokens.input_ids):
        raise OutletsError(f"{path} holds another conversation than row {row_id} of --input; "
                           "--resume needs the same --input file, in the same order")
    return features


def _fusion_layers(text, num_layers, default, validate) -> tuple:
    try:
        if not text:
            return default(num_layers)
        layers = tuple(int(part) for part in text.split(","))
        validate(layers, num_layers)
    except ValueError as exc:
        raise OutletsError(f"--fusion-layers {text or '(default)'}: {exc}") from exc
    return layers


def _add_labels(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specforge_outlets.data.add_labels import JoinError, label_file, specforge_feature_files, specforge_file_rows

    counts: Counter[str] = Counter()
    rows = read_rows(args.input)
    found = specforge_feature_files(args.add_labels)
    if not found:
        raise OutletsError(f"--add-labels {args.add_labels}: no data_<i>.ckpt or data_<i>.ckpt.gz files found")
    read = min(args.num_samples or len(rows), len(rows))
    for flag, value in (("--specforge-ranks", args.specforge_ranks), ("--specforge-batch-size", args.specforge_batch_size)):
        if value < 1:
            raise OutletsError(f"{flag} must be >= 1, got {value}")
    file_rows = specforge_file_rows(read, args.specforge_ranks, args.specforge_batch_size)
    unknown = [path for index, path in found if index not in file_rows]
    if unknown:
        raise OutletsError(f"--add-labels {args.add_labels}: {unknown[0]} (and {len(unknown) - 1} more) is not a file "
                           f"SpecForge writes for {read} rows on {args.specforge_ranks} rank(s) at batch size "
                           f"{args.specforge_batch_size}; give its --data-path JSONL and its --num-samples, "
                           "--specforge-ranks and --specforge-batch-size")
    for index, path in tqdm(found, desc="add labels", unit="file"):
        if len(file_rows[index]) > 1:
            _skip(counts, "ambiguous", f"{path}: skipped: two SpecForge ranks wrote rows {file_rows[index]} under "
                                       "this name; either may be in it")
            continue
        try:
            result = label_file(path, rows[file_rows[index][0]], args.max_length)
        except (JoinError, OutletsError) as exc:
            _skip(counts, "join mismatch", f"{path}: skipped: {exc}")
            continue
        counts["labelled_files"] += 1
        counts.update(result)
    without = read - len({row for index, _ in found for row in file_rows[index]})
    if without:
        print(f"{without} of the {read} rows SpecForge read have no feature file (its ranks drop their last partial "
              "batch of --batch-size)")
    summary = {"input": args.input, "directory": args.add_labels, "files": len(found), "rows_read": read,
               "rows_without_file": without, **dict(sorted(counts.items()))}
    with open(os.path.join(args.add_labels, LABELS_SUMMARY), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    print(f"labelled {counts['labelled_files']} of {len(found)} files, skipped {counts['skipped']}")
    return 0


def _skip(counts: Counter, reason: str, message: str) -> None:
    counts["skipped"] += 1
    counts[f"skipped_{reason.replace(' ', '_')}"] += 1
    if counts["skipped"] <= MAX_REPORTED:
        print(message)
