"""``outlets regenerate``: answer every user turn with the target model, recording lengths.

Output is append-only JSONL, one finished row per line; rows whose responses are longer than
``--max-response-tokens`` go to ``<output>.filtered.jsonl`` and the run's counts to
``<output>.summary.json``. ``--resume`` skips the ids found in both files (after cutting off a
partial last line), so an interrupted run loses nothing and duplicates nothing. Rows that failed
(server errors, prompts too long) are reported by id and retried by the next ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Dict, List, Optional, Set, Union

from specforge_outlets.data.conversations import RowError, normalise_row
from specforge_outlets.data.generation import (
    LENGTH,
    SamplingSettings,
    TurnError,
    assistant_turns,
    filter_reason,
    regenerate_rows,
)
from specforge_outlets.data.jsonl import AppendWriter, BadLine, iter_jsonl, recover_jsonl
from specforge_outlets.data.llama_backend import REQUEST_TIMEOUT_S, default_threads
from specforge_outlets.errors import OutletsError

MAX_REPORTED_ERRORS = 100
# Requests in flight unless --concurrency says otherwise. llama: the server's parallel slots;
# 8-16 give the best throughput on 2 cores (docs/data.md), and each holds a whole context of KV.
DEFAULT_CONCURRENCY = {"openai": 32, "llama": 8}
# Seconds per request unless --timeout says otherwise (openai: retried; llama: llama_backend's
# REQUEST_TIMEOUT_S, fatal, its own server being checked for life on any failure).
DEFAULT_TIMEOUT_S = {"openai": 600.0, "llama": REQUEST_TIMEOUT_S}
COUNT_KEYS = ("kept", "filtered", "errors", "bad_lines", "turns", "censored_turns")


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = SamplingSettings()
    parser = subparsers.add_parser("regenerate", help="regenerate every assistant turn with the target model")
    parser.add_argument(
        "--backend", required=True, choices=("llama", "hf", "openai"),
        help="llama: llama.cpp server on a GGUF target, started by the run (the fast CPU engine); "
        "hf: transformers in process; openai: an OpenAI-compatible server you run",
    )  # fmt: skip
    parser.add_argument(
        "--target", required=True,
        help="hf: model directory, hub name or smollm2-135m; llama: a .gguf file or smollm2-135m; openai: served model name",
    )  # fmt: skip
    parser.add_argument("--input", required=True, help="JSONL of conversations (from `outlets prepare`) or prompts")
    parser.add_argument("--output", required=True, help="append-only JSONL of regenerated conversations")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="per turn; a turn cut here is censored")
    parser.add_argument("--max-response-tokens", type=int, default=2048, help="drop rows with a longer response")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--resume", action="store_true", help="skip rows already in --output")
    parser.add_argument("--batch-size", type=int, default=16, help="hf: prompts generated together")
    parser.add_argument("--device", default="cpu", help="hf: torch device")
    parser.add_argument("--base-url", default="http://127.0.0.1:30000/v1", help="openai: server URL")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="openai: default $OPENAI_API_KEY")
    parser.add_argument(
        "--concurrency", type=int, help="requests in flight (openai: default 32; llama: the server's parallel slots, default 8)"
    )
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="llama: CPU threads of the server (default: one core fewer than this process may use, "
                             "so that another busy process does not stall it; at least 1)")
    parser.add_argument(
        "--timeout", type=float,
        help="seconds per request (openai: default 600, retried; llama: default 7200, fatal: a 2,048-token answer "
        "from one of 16 slots on a shared CPU core takes over 10 minutes)",
    )  # fmt: skip
    parser.add_argument("--max-retries", type=int, default=5, help="openai: retries per request")
    parser.add_argument("--backoff", type=float, default=1.0, help="openai: first retry delay, doubled each time")
    parser.set_defaults(func=run)


def side_paths(output: str) -> Dict[str, str]:
    stem = output[: -len(".jsonl")] if output.endswith(".jsonl") else output
    return {"filtered": f"{stem}.filtered.jsonl", "summary": f"{stem}.summary.json", "engine_log": f"{stem}.engine.log"}


def answered_ids(output: str) -> Set[str]:
    """Ids already in ``output`` or its filtered file: what ``--resume`` skips."""
    return {row.get("id") for path in (output, side_paths(output)["filtered"]) for row in recover_jsonl(path)}


def run(args: argparse.Namespace) -> int:
    if args.concurrency is None:
        args.concurrency = DEFAULT_CONCURRENCY.get(args.backend, 1)
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT_S.get(args.backend, 600.0)
    for name in ("max_new_tokens", "max_response_tokens", "batch_size", "concurrency", "threads"):
        if getattr(args, name) < 1:
            raise OutletsError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    settings = SamplingSettings(args.max_new_tokens, args.temperature, args.top_p, args.repetition_penalty, args.seed)
    paths = side_paths(args.output)
    if not args.resume and os.path.exists(args.output) and os.path.getsize(args.output) > 0:
        raise OutletsError(f"--output {args.output} exists; pass --resume to continue it, or remove it")
    if args.resume:
        _check_resumed_settings(paths["summary"], {**settings.as_dict(), "max_response_tokens": args.max_response_tokens})
        done = answered_ids(args.output)
    else:
        done = set()
        if os.path.exists(paths["filtered"]):  # left by an earlier run of a removed output
            os.remove(paths["filtered"])
    record = _Recorder(args.max_response_tokens)
    pending = _pending_rows(args.input, done, record)
    print(f"{len(pending)} conversations to regenerate ({len(done)} already done)")
    started = time.time()
    if pending:
        with AppendWriter(args.output) as kept, AppendWriter(paths["filtered"]) as filtered:
            record.kept, record.filtered = kept, filtered
            if args.backend == "hf":
                _run_hf(args, settings, pending, record)
            elif args.backend == "llama":
                _run_llama(args, settings, pending, record, paths["engine_log"])
            else:
                _run_openai(args, settings, pending, record)
    counts = record.counts
    summary = {
        "input": args.input,
        "output": args.output,
        "backend": args.backend,
        "target": args.target,
        "settings": settings.as_dict(),
        "max_response_tokens": args.max_response_tokens,
        "already_done": len(done),
        "seconds": round(time.time() - started, 1),
        **dict(sorted(counts.items())),
        "errors_by_row": dict(list(record.errors.items())[:MAX_REPORTED_ERRORS]),
    }
    with open(paths["summary"], "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    print(
        f"kept {counts['kept']}, filtered {counts['filtered']}, errors {counts['errors']}; "
        f"turns {counts['turns']} of which censored {counts['censored_turns']} -> {args.output}"
    )
    return 0


def _check_resumed_settings(summary_path: str, current: Dict[str, Any]) -> None:
    """Refuse ``--resume`` with other generation settings than the summary of the run it continues records:
    the new rows would sit beside rows generated otherwise, under one summary. An interrupted first run
    has no summary yet; nothing is compared then."""
    if not os.path.isfile(summary_path):
        return
    try:
        with open(summary_path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutletsError(f"{summary_path}: not readable JSON ({exc}); remove it to resume without the check") from None
    recorded = {**summary.get("settings", {}), "max_response_tokens": summary.get("max_response_tokens")}
    differing = [(name, recorded[name], value) for name, value in current.items()
                 if recorded.get(name) is not None and recorded[name] != value]
    if differing:
        was = ", ".join(f"--{name.replace('_', '-')} {old}" for name, old, _ in differing)
        now = ", ".join(f"--{name.replace('_', '-')} {new}" for name, _, new in differing)
        raise OutletsError(f"--resume: the rows so far were generated with {was} ({summary_path}), this run asks "
                           f"for {now}; resume with the same settings, or write the new ones to another --output")


class _Recorder:
    """Writes each finished row where it belongs and keeps the counts; used from one thread."""

    def __init__(self, max_response_tokens: int) -> None:
        self.limit = max_response_tokens
        self.counts: Counter[str] = Counter({key: 0 for key in COUNT_KEYS})
        self.errors: Dict[str, str] = {}
        self.kept: Optional[AppendWriter] = None
        self.filtered: Optional[AppendWriter] = None

    def error(self, key: str, message: str, kind: str, say: Callable[[str], None] = print) -> None:
        self.counts[kind] += 1
        self.errors[key] = message
        if self.counts[kind] <= MAX_REPORTED_ERRORS:
            say(message)

    def result(self, row: Dict[str, Any], result: Union[Dict[str, Any], TurnError], say: Callable[[str], None]) -> None:
        if isinstance(result, TurnError):
            self.error(row["id"], f"row {row['id']}: {result}", "errors", say)
            return
        turns = assistant_turns(result)
        self.counts["turns"] += len(turns)
        self.counts["censored_turns"] += sum(turn["finish_reason"] == LENGTH for turn in turns)
        reason = filter_reason(result, self.limit)
        if reason:
            self.counts["filtered"] += 1
            self.filtered.write({**result, "filtered": reason})
        else:
            self.counts["kept"] += 1
            self.kept.write(result)


def _pending_rows(path: str, done: Set[str], record: _Recorder) -> List[Dict[str, Any]]:
    if not os.path.isfile(path):
        raise OutletsError(f"--input {path}: no such file")
    rows, seen = [], set()
    for number, raw in iter_jsonl(path):
        if isinstance(raw, BadLine):
            record.error(f"line {number}", str(raw), "bad_lines")
            continue
        try:
            row = normalise_row(raw, fallback_id=f"line-{number}")
        except RowError as exc:
            record.error(f"line {number}", f"{path}:{number} (id {raw.get('id', '?')}): {exc}", "bad_lines")
            continue
        if row["id"] in seen:
            record.error(row["id"], f"{path}:{number}: duplicate id {row['id']!r}; skipped", "bad_lines")
            continue
        seen.add(row["id"])
        if row["id"] not in done:
            rows.append(row)
    return rows


def _run_hf(args: argparse.Namespace, settings: SamplingSettings, pending: List[Dict[str, Any]], record: _Recorder) -> None:
    from tqdm import tqdm

    from specforge_outlets.data.hf_backend import HFBackend

    backend = HFBackend(args.target, settings, device=args.device)
    # Similar prompt lengths in a batch waste less padding.
    pending = sorted(pending, key=lambda row: len(backend.prompt_ids(_first_prompt(row))))
    with tqdm(total=len(pending), desc="regenerate (hf)", unit="conv") as progress:
        for start in range(0, len(pending), args.batch_size):
            batch = pending[start : start + args.batch_size]
            for row, result in zip(batch, regenerate_rows(batch, backend.complete)):
                record.result(row, result, progress.write)
            progress.update(len(batch))


def _run_openai(
    args: argparse.Namespace, settings: SamplingSettings, pending: List[Dict[str, Any]], record: _Recorder
) -> None:
    from specforge_outlets.data.openai_backend import OpenAIBackend

    backend = OpenAIBackend(
        args.base_url, args.target, settings, args.api_key, args.timeout, args.max_retries, args.backoff
    )
    _run_concurrent(backend.complete, args.concurrency, pending, record, "openai")


def _run_llama(
    args: argparse.Namespace,
    settings: SamplingSettings,
    pending: List[Dict[str, Any]],
    record: _Recorder,
    log_path: str,
) -> None:
    from specforge_outlets.data.llama_backend import LlamaBackend, LlamaServer, load_gguf_target

    target = load_gguf_target(args.target)  # refuses a target without a chat template first
    print(f"starting llama-server: {target.gguf.name}, {args.concurrency} slots, {args.threads} threads (log: {log_path})")
    with LlamaServer(target, args.concurrency, args.threads, log_path) as server:
        backend = LlamaBackend(server, settings, timeout=args.timeout)
        _run_concurrent(backend.complete, args.concurrency, pending, record, "llama")


def _run_concurrent(
    complete: Callable, concurrency: int, pending: List[Dict[str, Any]], record: _Recorder, engine: str
) -> None:
    """One conversation per worker; rows are written from this thread as they finish.

    An engine failure (``EngineError``) stops the run at once: rows already written stay, queued
    ones are cancelled, and ``--resume`` continues without duplicating any.
    """
    from tqdm import tqdm

    tokens = 0
    with ThreadPoolExecutor(max_workers=concurrency) as pool, tqdm(
        total=len(pending), desc=f"regenerate ({engine})", unit="conv"
    ) as progress:
        futures = {pool.submit(regenerate_rows, [row], complete): row for row in pending}
        try:
            for future in as_completed(futures):
                result = future.result()[0]
                record.result(futures[future], result, progress.write)
                if not isinstance(result, TurnError):
                    tokens += sum(int(turn["num_tokens"]) for turn in assistant_turns(result))
                    progress.set_postfix(tok_s=f"{tokens / max(progress.format_dict['elapsed'], 1e-9):.0f}")
                progress.update(1)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _first_prompt(row: Dict[str, Any]) -> List[Dict[str, str]]:
    turns = row["conversations"]
    head = [turns[0]] if turns[0]["role"] == "system" else []
    return head + [next(turn for turn in turns if turn["role"] == "user")]
