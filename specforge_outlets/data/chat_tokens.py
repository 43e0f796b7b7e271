"""Tokenise a regenerated conversation through the chat template, with its loss mask.

The loss mask is 1 on each assistant turn's content tokens and on the end-of-turn token that
closes it (the target generated that token; predicting it is predicting the end). Spans are found
by tokenising prefixes of the conversation: the rendered history up to the assistant header gives
the start, the rendered history through the turn gives the end. This works for any template that
renders a conversation's prefixes as prefixes of its tokens (ChatML, Llama 3, ...); a template
that rewrites earlier turns (e.g. one that strips reasoning from old turns) is detected and the
conversation is reported instead of being mislabelled.

A censored turn (stopped by the token limit, always the last kept turn) is tokenised as the model
produced it: content without an end-of-turn token, since the target never ended it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from specforge_outlets.data.conversations import RowError
from specforge_outlets.data.generation import LENGTH


@dataclass
class ChatTokens:
    input_ids: List[int]
    loss_mask: List[int]
    censored: List[bool]  # one flag per assistant span, in order


def generation_prompt_ids(tokenizer: Any, messages: List[Dict[str, Any]]) -> List[int]:
    """The prompt a backend sends: the history through the chat template, then the assistant header.

    Only role and content reach the template (not our bookkeeping fields), and every backend
    tokenises here, so all engines see the same prompt tokens.
    """
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    text = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenise_conversation(tokenizer: Any, conversations: List[Dict[str, Any]], end_id: int) -> ChatTokens:
    messages = [{"role": turn["role"], "content": turn["content"]} for turn in conversations]
    assistant = [index for index, turn in enumerate(conversations) if turn["role"] == "assistant"]
    if not assistant:
        raise RowError("no assistant turn", "regenerate the conversation first")
    censored = [conversations[index].get("finish_reason") == LENGTH for index in assistant]
    if any(censored[:-1]):  # turns after a censored one are not a real conversation
        cut = censored.index(True)
        assistant, censored = assistant[: cut + 1], censored[: cut + 1]
        messages = messages[: assistant[-1] + 1]

    def encode(text: str) -> List[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(upto: int, generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=generation_prompt)

    last = assistant[-1]
    if censored[-1]:
        input_ids = encode(render(last, True) + messages[last]["content"])
    else:
        input_ids = encode(render(len(messages), False))
    loss_mask = [0] * len(input_ids)
    for index, cut in zip(assistant, censored):
        prefix = encode(render(index, True))
        through = input_ids if cut else encode(render(index + 1, False))
        if input_ids[: len(through)] != through or through[: len(prefix)] != prefix:
            raise RowError(
                "template not prefix-stable",
                f"turn {index} tokenises differently inside the whole conversation; "
                "pass a --chat-template that renders earlier turns unchanged",
            )
        start, end = len(prefix), len(through)
        if not cut:
            closing = [position for position in range(start, end) if through[position] == end_id]
            end = closing[-1] + 1 if closing else end
        if end <= start:
            raise RowError("empty response", f"assistant turn {index} has no tokens")
        loss_mask[start:end] = [1] * (end - start)
    return ChatTokens(input_ids, loss_mask, censored)
