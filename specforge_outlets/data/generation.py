"""Turn-by-turn regeneration, shared by the ``hf``, ``llama`` and ``openai`` backends.

Each user turn is answered by the target given the *regenerated* history, so the lengths are the
target's own. A turn stopped by the token limit is right-censored: its true length is unknown, it
is recorded with ``finish_reason: "length"`` and never becomes a length label, and the turns after
it are dropped (a truncated answer followed by the next question is no longer a real conversation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from specforge_outlets.data.conversations import user_questions

STOP, LENGTH = "stop", "length"


@dataclass(frozen=True)
class SamplingSettings:
    """Defaults measured on SmolLM2-135M-Instruct: see docs/data.md ("Sampling settings")."""

    max_new_tokens: int = 2048
    temperature: float = 0.7
    top_p: float = 0.9
    repetition_penalty: float = 1.1
    seed: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TurnResult:
    content: str
    num_tokens: int  # generated tokens, the end-of-turn token included when the turn ended
    finish_reason: str  # STOP or LENGTH
    token_ids: Optional[List[int]] = field(default=None)  # the generated ids, where the engine returns them


class TurnError(Exception):
    """A turn that could not be generated (server error after retries, prompt too long, ...)."""


Messages = List[Dict[str, str]]
# Answers a batch of chat histories; a failed item is a TurnError in its place.
CompleteFn = Callable[[Sequence[Messages]], List[Union[TurnResult, TurnError]]]


def context_overflow(prompt_tokens: int, max_new_tokens: int, context: int) -> Optional[TurnError]:
    """The error for a prompt that cannot be answered in full within the target's context, if any."""
    if context and prompt_tokens + max_new_tokens > context:
        return TurnError(
            f"prompt of {prompt_tokens} tokens + --max-new-tokens {max_new_tokens} exceeds "
            f"the target's context of {context} tokens"
        )
    return None


def turn_from_tokens(
    tokens: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int, decode: Callable[[List[int]], str]
) -> TurnResult:
    """The label semantics of every local engine: finished at the first stop token (counted), else censored."""
    stop = next((position for position, token in enumerate(tokens) if token in stop_ids), None)
    if stop is None:
        kept = list(tokens[:max_new_tokens])
        return TurnResult(decode(kept), len(kept), LENGTH, kept)
    return TurnResult(decode(list(tokens[:stop])), stop + 1, STOP, list(tokens[: stop + 1]))


def complete_each(
    complete_one: Callable[[Messages], TurnResult], batch: Sequence[Messages]
) -> List[Union[TurnResult, TurnError]]:
    """One request per history, for servers that batch by themselves; a failed one is its TurnError."""
    answers: List[Union[TurnResult, TurnError]] = []
    for messages in batch:
        try:
            answers.append(complete_one(messages))
        except TurnError as exc:
            answers.append(exc)
    return answers


def regenerate_rows(rows: Sequence[Dict[str, Any]], complete: CompleteFn) -> List[Union[Dict[str, Any], TurnError]]:
    """Regenerate every assistant turn of ``rows`` (normalised conversations), batching turn k."""
    states = [_State(row) for row in rows]
    while True:
        active = [state for state in states if state.pending()]
        if not active:
            break
        answers = complete([state.next_prompt() for state in active])
        for state, answer in zip(active, answers):
            state.accept(answer)
    return [state.result() for state in states]


class _State:
    def __init__(self, row: Dict[str, Any]) -> None:
        turns = row["conversations"]
        self.row = row
        self.history: Messages = [dict(turns[0])] if turns and turns[0]["role"] == "system" else []
        self.questions = user_questions(turns)
        self.answered = 0
        self.error: Optional[TurnError] = None
        self.censored = False

    def pending(self) -> bool:
        return self.error is None and not self.censored and self.answered < len(self.questions)

    def next_prompt(self) -> Messages:
        return [*self.history, {"role": "user", "content": self.questions[self.answered]}]

    def accept(self, answer: Union[TurnResult, TurnError]) -> None:
        if isinstance(answer, TurnError):
            self.error = TurnError(f"turn {self.answered + 1}: {answer}")
            return
        self.history.append({"role": "user", "content": self.questions[self.answered]})
        turn = {
            "role": "assistant",
            "content": answer.content,
            "num_tokens": answer.num_tokens,
            "finish_reason": answer.finish_reason,
        }
        if answer.token_ids is not None:
            turn["token_ids"] = answer.token_ids
        self.history.append(turn)
        self.answered += 1
        self.censored = answer.finish_reason == LENGTH

    def result(self) -> Union[Dict[str, Any], TurnError]:
        if self.error is not None:
            return self.error
        return {"id": self.row["id"], "conversations": self.history}


def assistant_turns(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [turn for turn in row["conversations"] if turn["role"] == "assistant"]


def censoring_flags(row: Dict[str, Any]) -> List[bool]:
    """One flag per assistant turn: True when it was stopped by the token limit.

    Turns without a ``finish_reason`` (not regenerated) count as finished.
    """
    return [turn.get("finish_reason") == LENGTH for turn in assistant_turns(row)]


def filter_reason(row: Dict[str, Any], max_response_tokens: int) -> Optional[str]:
    """Why a regenerated row is dropped: a response known to be longer than the limit.

    A finished turn is longer when its count exceeds the limit; a censored turn when it was cut at
    or beyond the limit (its true length is larger than its count). Censored turns cut below the
    limit (``--max-new-tokens`` smaller than the filter) are kept, unlabelled.
    """
    for index, turn in enumerate(assistant_turns(row), start=1):
        count = int(turn.get("num_tokens", 0))
        if count > max_response_tokens or (turn.get("finish_reason") == LENGTH and count >= max_response_tokens):
            return f"turn {index} response is longer than {max_response_tokens} tokens"
    return None
