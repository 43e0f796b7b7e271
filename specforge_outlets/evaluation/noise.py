"""The sampling-noise floor: how well a prompt's length can be known at all.

The target samples its answers, so one prompt has many true lengths. Given the test prompts
regenerated with other seeds (``outlets regenerate`` JSONL files, rows keyed by the test rows'
``id``), each prompt's samples are its first assistant turn in every file, the test response
included, finished ones only (``finish_reason: "stop"``; a cut response has no length). A sample's
length is counted as the test lengths are: the tokens of its loss-mask span when the target's chat
template tokenises the conversation (``data.chat_tokens``, the end-of-turn token included).
``metrics.noise_floor_errors`` then predicts each sample by the median of the prompt's others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.requests import Split

STOP = "stop"


@dataclass
class NoiseSamples:
    lengths: Dict[str, List[int]]  # row id -> finished first-turn lengths (the test response first)
    unfinished: int = 0  # first turns cut by the token limit, left out
    ignored_rows: int = 0  # rows whose id is not a test row
    files: List[str] = field(default_factory=list)
    drawn: Dict[str, int] = field(default_factory=dict)  # row id -> samples drawn, cut ones included


def _first_turn(row: Dict[str, Any], where: str) -> int:
    turns = row.get("conversations")
    index = next((i for i, t in enumerate(turns or []) if isinstance(t, dict) and t.get("role") == "assistant"), None)
    if index is None:
        raise OutletsError(f"{where}: no 'conversations' list with an assistant turn; pass `outlets regenerate` output")
    if "finish_reason" not in turns[index]:
        raise OutletsError(f"{where}: the first assistant turn has no 'finish_reason'; pass `outlets regenerate` output")
    return index


def load_noise_samples(paths: Sequence[str], test: Split, tokenizer, end_id: int) -> NoiseSamples:
    """Every prompt's finished first-turn lengths; errors name the file and line."""
    from specforge_outlets.data.chat_tokens import tokenise_conversation
    from specforge_outlets.data.conversations import RowError
    from specforge_outlets.data.jsonl import BadLine, iter_jsonl

    first_turns = {r.row_id: r for r in test.with_censored().requests if r.turn == 0}
    samples = NoiseSamples({row_id: [] if r.censored else [r.length] for row_id, r in first_turns.items()},
                           drawn={row_id: 1 for row_id in first_turns})
    for path in paths:
        seen = set()
        try:
            lines = list(iter_jsonl(path))
        except OSError as exc:
            raise OutletsError(f"--noise-samples {path}: not readable ({exc})") from exc
        for number, row in lines:
            where = f"--noise-samples {path}:{number}"
            if isinstance(row, BadLine):
                raise OutletsError(f"{where}: {row}")
            row_id = str(row.get("id"))
            if row_id not in first_turns:
                samples.ignored_rows += 1
                continue
            if row_id in seen:
                raise OutletsError(f"{where}: id {row_id} appears twice in this file; one sample per prompt and file")
            seen.add(row_id)
            samples.drawn[row_id] += 1
            index = _first_turn(row, where)
            turns = row["conversations"][: index + 1]
            expected = first_turns[row_id].messages
            prompt = tuple({"role": t["role"], "content": t["content"]} for t in turns[:index])
            if expected is not None and prompt != expected:
                raise OutletsError(f"{where}: id {row_id} has another prompt than the test row {row_id}; "
                                   "the noise samples must regenerate the same test prompts")
            if turns[index]["finish_reason"] != STOP:
                samples.unfinished += 1
                continue
            try:
                tokens = tokenise_conversation(tokenizer, turns, end_id)
            except RowError as exc:
                raise OutletsError(f"{where}: id {row_id}: {exc}") from exc
            samples.lengths[row_id].append(sum(tokens.loss_mask))
        if not seen:
            raise OutletsError(f"--noise-samples {path}: no row has the id of a test row "
                               f"(e.g. {next(iter(first_turns))}); regenerate the test prompts themselves")
        samples.files.append(path)
    return samples
