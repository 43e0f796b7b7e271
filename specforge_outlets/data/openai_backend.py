"""Regeneration through any OpenAI-compatible chat-completions server (SGLang on GPU servers).

Servers fail in ordinary ways: overload (429, 5xx), dropped connections, requests that hang.
Those are retried with exponential back-off under a per-request timeout; other client errors
(400: prompt longer than the context, bad model name) are final at once. A failed turn is a
``TurnError`` for its row and never stops the run.
"""

from __future__ import annotations

import random
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import requests

from specforge_outlets.data.generation import (
    LENGTH, STOP, Messages, SamplingSettings, TurnError, TurnResult, complete_each,
)

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIBackend:
    def __init__(
        self,
        base_url: str,
        model: str,
        settings: SamplingSettings,
        api_key: Optional[str] = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff: float = 1.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.settings = settings
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff

    def complete(self, batch: Sequence[Messages]) -> List[Union[TurnResult, TurnError]]:
        return complete_each(self.complete_one, batch)

    def complete_one(self, messages: Messages) -> TurnResult:
        body = self._body(messages)
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1) * (1 + random.random() / 4))
            try:
                response = requests.post(self.url, json=body, headers=self.headers, timeout=self.timeout)
            except requests.Timeout:
                last_error = f"no answer within {self.timeout:g} s"
                continue
            except requests.ConnectionError as exc:
                last_error = f"connection failed ({exc.__class__.__name__})"
                continue
            if response.status_code in RETRYABLE_STATUS:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code != 200:
                raise TurnError(f"HTTP {response.status_code} (not retried): {response.text[:300]}")
            return self._parse(response)
        raise TurnError(f"gave up after {self.max_retries + 1} attempts; last error: {last_error}")

    def _body(self, messages: Messages) -> Dict[str, Any]:
        settings = self.settings
        body: Dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "seed": settings.seed,
        }
        if settings.repetition_penalty != 1.0:  # SGLang and vLLM extension of the OpenAI API
            body["repetition_penalty"] = settings.repetition_penalty
        return body

    def _parse(self, response: requests.Response) -> TurnResult:
        try:
            payload = response.json()
            choice = payload["choices"][0]
            content = choice["message"]["content"] or ""
            finish = choice["finish_reason"]
            count = int(payload["usage"]["completion_tokens"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TurnError(f"malformed chat-completions answer ({exc!r}): {response.text[:200]}") from exc
        if finish not in (STOP, LENGTH):
            raise TurnError(f"finish_reason {finish!r} is neither 'stop' nor 'length'")
        return TurnResult(content, count, finish)
