"""Normalise dataset rows to SpecForge's conversation format.

    {"id": "...", "conversations": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}

Accepted inputs: ShareGPT (``conversations`` with ``from``/``value``), LMSYS-Chat
(``conversation`` with ``role``/``content``), OpenAI-style ``messages``, SpecForge's own format,
Alpaca (``instruction``/``input``/``output``) and this project's prompt sets (``{"id", "prompt"}``).
Real chat dumps are messy (turns of the same role in a row, conversations that open with the
assistant, empty turns); the rules below make every kept row alternate user/assistant, starting
with a user turn, so regeneration can answer each user turn in order.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

ROLE_NAMES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "system": "system",
}


class RowError(Exception):
    """A row that cannot be used: a short ``reason`` for counting and a message for the user."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def row_id(raw: Dict[str, Any], fallback: str) -> str:
    for key in ("id", "conversation_id", "question_id"):
        value = raw.get(key)
        if value not in (None, ""):
            return str(value)
    return fallback


def raw_messages(raw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The row's messages in ``{"role", "content"}`` form, before cleaning."""
    if isinstance(raw.get("prompt"), str):
        return [{"role": "user", "content": raw["prompt"]}]
    if "instruction" in raw:
        instruction = str(raw.get("instruction") or "")
        extra = str(raw.get("input") or "")
        messages = [{"role": "user", "content": f"{instruction}\n\n{extra}" if extra.strip() else instruction}]
        if raw.get("output"):
            messages.append({"role": "assistant", "content": str(raw["output"])})
        return messages
    for key in ("conversations", "conversation", "messages"):
        if key in raw:
            turns = raw[key]
            if not isinstance(turns, list):
                raise RowError("bad turns", f"'{key}' must be a list of turns, got {type(turns).__name__}")
            return [_turn(turn, index) for index, turn in enumerate(turns)]
    raise RowError(
        "no user turn",
        "no 'prompt', 'instruction', 'conversations', 'conversation' or 'messages' field; "
        "see docs/data.md for the accepted formats",
    )


def _turn(turn: Any, index: int) -> Dict[str, Any]:
    if not isinstance(turn, dict):
        raise RowError("bad turns", f"turn {index} is not an object")
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if not isinstance(role, str) or role.lower() not in ROLE_NAMES:
        raise RowError("bad turns", f"turn {index} has unknown role {role!r}; expected one of {sorted(ROLE_NAMES)}")
    if not isinstance(content, str):
        content = "" if content is None else str(content)
    return {"role": ROLE_NAMES[role.lower()], "content": content}


def clean_messages(messages: List[Dict[str, Any]], first_turn_only: bool = False) -> List[Dict[str, Any]]:
    """Alternate user/assistant from a user turn; an optional leading system turn is kept.

    Consecutive turns of one role are joined; assistant turns before the first user turn and
    system turns after the start are dropped; the conversation ends before an empty user turn.
    """
    system: Optional[Dict[str, Any]] = None
    if messages and messages[0]["role"] == "system" and messages[0]["content"].strip():
        system = dict(messages[0])
    cleaned: List[Dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system" or (role == "assistant" and not cleaned):
            continue
        if cleaned and cleaned[-1]["role"] == role:
            cleaned[-1]["content"] = f"{cleaned[-1]['content']}\n\n{content}".strip("\n")
            continue
        if role == "user" and not content.strip():
            break
        cleaned.append({"role": role, "content": content})
    if not cleaned:
        if any(message["role"] == "user" for message in messages):
            raise RowError("empty prompt", "the first user turn has no text")
        raise RowError("no user turn")
    if first_turn_only:
        cleaned = cleaned[:2]
    return ([system] if system else []) + cleaned


def normalise_row(raw: Dict[str, Any], fallback_id: str, first_turn_only: bool = False) -> Dict[str, Any]:
    return {
        "id": row_id(raw, fallback_id),
        "conversations": clean_messages(raw_messages(raw), first_turn_only),
    }


def user_questions(conversations: List[Dict[str, Any]]) -> List[str]:
    """The user turns' texts, in order: what a regenerated conversation answers."""
    return [turn["content"] for turn in conversations if turn["role"] == "user"]


def user_turn_count(conversations: List[Dict[str, Any]]) -> int:
    return len(user_questions(conversations))
