"""What ``outlets bench-serving`` sends, and when.

Two sources:

- a prompt **dataset** (JSONL: ``prompt``, or ``messages``/``conversations`` whose first user turn is
  the prompt; optional ``id`` and ``output_length``), sent at a seeded Poisson rate (or all at once).
  Prompts are rendered with the target's chat template (``--tokenizer``) and sent as token ids, so the
  server sees exactly what a chat client would send and the prompt length is known; ``--raw-prompts``
  sends the text as is (the server reports the prompt length).
- a **trace** (Azure CSV or JSONL, :func:`specforge_outlets.serving.trace.load_trace`) replayed at its
  own arrival times (``--rate-scale`` divides them), as in the simulator. A trace has lengths but no
  text, so each request is ``input_length`` random token ids and must generate exactly
  ``output_length`` tokens (``ignore_eos``), like SGLang's ``random`` dataset: the load matches the
  trace's, whatever the model would have said.

A request's *expected* output length (dataset ``output_length``, trace ``output_length``, else
``max_new_tokens``) classifies it as short or long when it fails before finishing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.errors import OutletsError
from specforge_outlets.serving.trace import poisson_arrival_times

# Token ids for synthetic trace prompts when no tokenizer says which ids exist: inside any real
# vocabulary (Llama 3: 128k, Qwen: 151k, SmolLM2: 49k) and clear of the special tokens at its ends.
SAFE_TOKEN_RANGE = (1000, 5000)
USER_ROLES = ("user", "human")
MAX_REPORTED_BAD_ROWS = 5


@dataclass(frozen=True)
class BenchRequest:
    """One request: when to send it (s after the start) and what to send."""

    id: str
    arrival_s: float
    max_new_tokens: int
    expected_output_len: int
    text: Optional[str] = None  # exactly one of text / input_ids
    input_ids: Optional[Tuple[int, ...]] = None
    ignore_eos: bool = False
    predicted_output_len: Optional[float] = None  # sent to the plugin as an external prediction (--oracle-prediction)
    quantiles: Optional[Tuple[float, ...]] = None  # the total length's quantiles sent with it (--predictions)
    end_token_id: Optional[int] = None  # --end-at-output-len: the server ends it after expected_output_len tokens

    @property
    def prompt_len(self) -> Optional[int]:
        """Known client-side only for token ids; the server reports it for text."""
        return len(self.input_ids) if self.input_ids is not None else None


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, where they came from, and the rows that were skipped."""

    source: Dict[str, object]
    requests: List[BenchRequest]
    offered_rps: float
    skipped_rows: int = 0


def load_tokenizer(path: str):
    """A local Hugging Face tokenizer directory (the target's), for chat templates and vocabulary."""
    if not os.path.isdir(path):
        raise OutletsError(f"--tokenizer {path}: no such directory; give the target model's (or its tokenizer's) local directory")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many types for a bad directory
        raise OutletsError(f"--tokenizer {path}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from None


def poisson_arrivals(count: int, rate_rps: float, seed: int) -> np.ndarray:
    """Seeded Poisson arrival times, the first at 0; ``rate_rps = inf`` sends everything at 0 (a burst)."""
    if not rate_rps > 0:
        raise OutletsError(f"--rate must be a positive number of requests/s (or inf for a burst), got {rate_rps}")
    if math.isinf(rate_rps) or count == 0:
        return np.zeros(count)
    return poisson_arrival_times(np.random.default_rng(seed), rate_rps, count)


def load_dataset_workload(
    path: str,
    rate_rps: float,
    max_new_tokens: int,
    tokenizer=None,
    num_requests: Optional[int] = None,
    seed: int = 0,
    warn=print,
    fixed_output_len: bool = False,
    oracle_prediction: bool = False,
    predictions: Optional[Dict[str, float]] = None,
    end_token_id: Optional[int] = None,
    quantiles: Optional[Dict[str, Tuple[float, ...]]] = None,
) -> Workload:
    """Prompts from a JSONL dataset at a Poisson rate; bad rows are named, skipped and counted.

    ``fixed_output_len``: each request generates exactly its row's ``output_length`` (``ignore_eos``),
    as SGLang's benchmark does with ShareGPT, so that runs under different policies do the same work
    and compare request by request; rows without ``output_length`` are refused. ``end_token_id``: the
    same work, but ``max_new_tokens`` stays the cap and the server ends each request at its length by
    forcing this token (``end_at_length``), so that the server does not know the lengths in advance;
    rows longer than the cap are refused. ``oracle_prediction`` (with either): the exact length goes to
    the server as the request's prediction, the upper bound any predictor can reach. ``predictions`` (id -> predicted output length, e.g. from
    ``outlets eval``'s ``predictions/<name>.jsonl``): sent with the requests they name, as a router or
    a prefill instance would send them before the request is admitted; ``quantiles`` (id -> the total
    output length's quantiles, at the server's quantile levels) with them, the same way.
    """
    if not os.path.isfile(path):
        raise OutletsError(f"dataset {path}: no such file")
    if not math.isinf(rate_rps):
        poisson_arrivals(0, rate_rps, seed)  # validate the rate before reading anything
    prompts: List[Tuple[str, str, int]] = []  # (id, prompt, expected output length)
    problems: List[str] = []
    seen_ids = set()
    for line_number, row in iter_jsonl(path):
        if num_requests is not None and len(prompts) >= num_requests:
            break
        if isinstance(row, BadLine):
            problems.append(f"{row}; fix or delete the line")
            continue
        where = f"{path}:{line_number}" + (f" (id {row['id']})" if "id" in row else "")
        prompt, problem = _prompt_of(row)
        if problem is None:
            expected, problem = _output_length_of(row, max_new_tokens)
        exact = "--fixed-output-len" if fixed_output_len else "--end-at-output-len" if end_token_id is not None else None
        if problem is None and exact and "output_length" not in row:
            problem = f"no output_length (needed by {exact}); add it or drop the flag"
        if problem is None and end_token_id is not None and expected > max_new_tokens:
            problem = (f"output_length {expected} is over --max-new-tokens {max_new_tokens} (--end-at-output-len "
                       "keeps it as the cap); raise the cap")
        if problem is None and str(row.get("id", line_number)) in seen_ids:
            problem = "duplicate id; give each row its own id"
        if problem is not None:
            problems.append(f"{where}: {problem}")
            continue
        request_id = str(row.get("id", line_number))
        seen_ids.add(request_id)
        prompts.append((request_id, prompt, expected))
    _report_skipped(path, problems, usable=len(prompts), warn=warn)
    if not prompts:
        raise OutletsError(f"dataset {path}: no rows; give a JSONL with one prompt per line")
    if num_requests is not None and len(prompts) < num_requests:
        warn(f"warning: dataset {path} has only {len(prompts)} usable prompt(s); --num-requests {num_requests} asked for more")

    arrivals = poisson_arrivals(len(prompts), rate_rps, seed)
    requests = []
    for (request_id, prompt, expected), arrival in zip(prompts, arrivals):
        if tokenizer is None:
            content = {"text": prompt}
        else:
            content = {"input_ids": tuple(_chat_ids(tokenizer, prompt))}
        budget = expected if fixed_output_len else max_new_tokens
        requests.append(BenchRequest(request_id, float(arrival), budget, expected, ignore_eos=fixed_output_len,
                                     predicted_output_len=(float(expected) if oracle_prediction
                                                           else (predictions or {}).get(request_id)),
                                     quantiles=(quantiles or {}).get(request_id), end_token_id=end_token_id, **content))
    output_len = ("dataset output_length (ignore_eos)" if fixed_output_len
                  else f"dataset output_length, ended by the server at token {end_token_id} under max_new_tokens"
                  if end_token_id is not None else "until end of turn or max_new_tokens")
    source = {"kind": "dataset", "path": path, "prompts": "raw text" if tokenizer is None else "chat template, token ids",
              "output_len": output_len}
    return Workload(source, requests, rate_rps, skipped_rows=len(problems))


def load_trace_workload(
    path: str,
    rate_scale: float = 1.0,
    tokenizer=None,
    num_requests: Optional[int] = None,
    seed: int = 0,
) -> Workload:
    """A trace replayed at its arrival times / ``rate_scale``, with synthetic token-id prompts."""
    from specforge_outlets.serving.trace import load_trace

    trace = load_trace(path)
    if num_requests is not None:
        trace = trace.head(num_requests)
    trace = trace.scaled(rate_scale)
    vocabulary = _usable_ids(tokenizer)
    rng = np.random.default_rng(seed)
    requests = []
    for index, request_id in enumerate(trace.ids):
        input_len, output_len = int(trace.input_lens[index]), int(trace.output_lens[index])
        if vocabulary is None:
            ids = rng.integers(*SAFE_TOKEN_RANGE, size=input_len)
        else:
            ids = rng.choice(vocabulary, size=input_len)
        requests.append(BenchRequest(
            str(request_id), float(trace.arrival_times[index]), output_len, output_len,
            input_ids=tuple(int(i) for i in ids), ignore_eos=True,
        ))
    source = {"kind": "trace", "path": path, "trace": trace.name, "rate_scale": rate_scale,
              "trace_duration_s": trace.duration_s}
    return Workload(source, requests, trace.offered_rps)


def _prompt_of(row: Dict) -> Tuple[Optional[str], Optional[str]]:
    """(prompt, None) or (None, what is wrong and how to fix it)."""
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            return None, "prompt must be a non-empty string"
        return prompt, None
    turns = row.get("messages", row.get("conversations"))
    if turns is None:
        return None, "no prompt; give a 'prompt' string or a 'messages'/'conversations' list"
    if not isinstance(turns, list):
        return None, "messages/conversations must be a list of turns"
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role in USER_ROLES:
            if not isinstance(content, str) or not content.strip():
                return None, "the first user turn has no text content"
            return content, None
    return None, "no user turn (role 'user' or from 'human') in messages/conversations"


def _output_length_of(row: Dict, default: int) -> Tuple[int, Optional[str]]:
    if "output_length" not in row:
        return default, None
    value = row["output_length"]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value < 1):
        return default, f"output_length must be a positive integer, got {value!r}; fix it or drop the field"
    return int(value), None


def _report_skipped(path: str, problems: Sequence[str], usable: int, warn) -> None:
    if not problems:
        return
    if usable == 0:
        raise OutletsError(f"dataset {path}: no usable prompt; first problem: {problems[0]}")
    warn(f"warning: dataset {path}: skipping {len(problems)} bad row(s):")
    for problem in problems[:MAX_REPORTED_BAD_ROWS]:
        warn(f"  {problem}")
    if len(problems) > MAX_REPORTED_BAD_ROWS:
        warn(f"  ... and {len(problems) - MAX_REPORTED_BAD_ROWS} more")


def _chat_ids(tokenizer, prompt: str) -> List[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise OutletsError("--tokenizer has no chat template; use the instruct model's tokenizer or pass --raw-prompts")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def _usable_ids(tokenizer) -> Optional[np.ndarray]:
    """Every id of the tokenizer's vocabulary except its special tokens."""
    if tokenizer is None:
        return None
    special = set(tokenizer.all_special_ids)
    ids = np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)
    if len(ids) == 0:
        raise OutletsError("--tokenizer has no non-special tokens to build trace prompts from")
    return ids
