"""One streaming request to SGLang's native ``/generate``, timed and recorded.

Why not ``sglang.benchmark.serving.async_request_sglang_generate``: it reads the module-global
``args`` of SGLang's own CLI, throws ``meta_info`` away (we need the server's
``predicted_output_len`` and ``finish_reason``), and needs SGLang and aiohttp, which live only in the
serve environment while ``outlets`` runs in the training one. This client follows the same protocol
and keeps the same record fields (``ttft``, ``latency`` -> ``e2e_s``, ``prompt_len``, ``output_len``,
``success``, ``error``), plus the server's prediction and finish reason.

Protocol: ``POST {url}/generate`` with ``{"text" | "input_ids", "sampling_params", "stream": true}``;
the server answers Server-Sent Events ``data: {json}`` whose ``text`` and
``meta_info.completion_tokens`` are cumulative, and ends with ``data: [DONE]``. TTFT is the time to
the first event with a token; each later event that brings tokens adds its gap since the last
one to ``itl_s``, split evenly over its tokens (a chunk of several tokens has that many gaps), as
``sglang.benchmark.serving`` records inter-token latency. A request succeeds only if the stream ends with ``[DONE]`` and the
finish reason is not ``abort``; anything else (HTTP error, connection dropped mid-stream, timeout,
malformed event) is a failure whose ``error`` says what happened, and it is recorded, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import httpx

from specforge_outlets.loadgen.end_at_length import end_at_params, serialized_processor
from specforge_outlets.loadgen.workload import BenchRequest

# The plugin's key (sglang_patches/settings.py META_INFO_KEY); read, never required.
PREDICTION_KEY = "predicted_output_len"
# The plugin's per-request external prediction (sglang_patches/settings.py CUSTOM_PARAM_KEY).
PREDICTION_PARAM = "outlets_predicted_output_len"
# The plugin's per-request quantiles of the total output length (sglang_patches/settings.py QUANTILES_PARAM_KEY).
QUANTILES_PARAM = "outlets_predicted_quantiles"
MAX_ERROR_CHARS = 300


@dataclass
class SamplingSettings:
    """Sampling parameters shared by every request (per-request: max_new_tokens, ignore_eos)."""

    temperature: float = 0.7
    top_p: float = 1.0


@dataclass
class RequestRecord:
    """What happened to one request (times in s; ``sent_s`` from the start of the run)."""

    id: str
    url: str
    scheduled_s: float
    sent_s: float
    ttft_s: Optional[float] = None  # None: no token arrived
    e2e_s: Optional[float] = None  # until the last event, or until the failure was seen
    prompt_len: Optional[int] = None
    output_len: int = 0
    expected_output_len: int = 0
    predicted_output_len: Optional[float] = None
    finish_reason: Optional[str] = None
    success: bool = False
    error: str = ""
    itl_s: List[float] = field(default_factory=list)  # gaps between consecutive tokens
    last_token_s: Optional[float] = None  # when the latest token arrived (from sending)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def generate_payload(request: BenchRequest, sampling: SamplingSettings, through_router: bool = False) -> Dict[str, Any]:
    """The native ``/generate`` body of a request.

    The request's own settings (its prediction and quantiles, where it ends) go in
    ``sampling_params.custom_params``; ``through_router``: in ``custom_labels`` as strings instead, the
    one field of ``/generate`` that sglang-router 0.3.2 passes on (it drops ``custom_params``), which the
    plugin moves back into ``custom_params`` on the worker (``sglang_patches/client_predictions.py``).
    """
    params: Dict[str, Any] = {"max_new_tokens": request.max_new_tokens, "temperature": sampling.temperature}
    if sampling.top_p < 1.0:
        params["top_p"] = sampling.top_p
    if request.ignore_eos:
        params["ignore_eos"] = True
    custom_params: Dict[str, Any] = {}
    if request.predicted_output_len is not None:  # the wire's spelling: custom_params.outlets_predicted_output_len
        custom_params[PREDICTION_PARAM] = request.predicted_output_len
    if request.quantiles is not None:
        custom_params[QUANTILES_PARAM] = list(request.quantiles)
    extra: Dict[str, Any] = {}
    if request.end_token_id is not None:
        custom_params.update(end_at_params(request.expected_output_len, request.end_token_id))
        extra["custom_logit_processor"] = serialized_processor()
    if custom_params and through_router:
        extra["custom_labels"] = {key: _label(value) for key, value in custom_params.items()}
    elif custom_params:
        params["custom_params"] = custom_params
    prompt = {"text": request.text} if request.input_ids is None else {"input_ids": list(request.input_ids)}
    return {**prompt, "sampling_params": params, **extra, "stream": True}


def _label(value) -> str:
    """A ``custom_labels`` value: the router's map holds strings, so a list travels as "q1,q2,...", the
    form the plugin parses quantiles from."""
    return ",".join(str(item) for item in value) if isinstance(value, list) else str(value)


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    request: BenchRequest,
    sampling: SamplingSettings,
    run_start: float,
    timeout_s: Optional[float],
    through_router: bool = False,
) -> RequestRecord:
    """Send one request and record it; never raises for a server-side failure."""
    sent = time.perf_counter()
    record = RequestRecord(
        id=request.id, url=url, scheduled_s=request.arrival_s, sent_s=sent - run_start,
        prompt_len=request.prompt_len, expected_output_len=request.expected_output_len,
    )
    try:
        await asyncio.wait_for(_stream(client, url, generate_payload(request, sampling, through_router), record, sent), timeout_s)
    except asyncio.TimeoutError:
        record.error = f"timeout: no complete answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    except _Failed as exc:
        record.error = str(exc)[:MAX_ERROR_CHARS]
    except Exception as exc:  # a malformed event fails this request only, never the whole run
        record.error = f"unreadable response: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    record.e2e_s = time.perf_counter() - sent
    record.success = not record.error
    return record


class _Failed(Exception):
    """The server answered, but not with a complete generation."""


async def _stream(client: httpx.AsyncClient, url: str, payload: Dict, record: RequestRecord, sent: float) -> None:
    done = False
    async with client.stream("POST", f"{url}/generate", json=payload) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode("utf-8", "replace")
            raise _Failed(f"HTTP {response.status_code}: {body.strip()}")
        async for line in response.aiter_lines():
            line = line.strip()
            if not line:
                continue
            data = line[len("data:"):].strip() if line.startswith("data:") else line
            if data == "[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise _Failed(f"malformed event from the server: {data[:100]!r}") from None
            _read_event(event, record, sent)
    if not done:
        raise _Failed(f"stream ended without [DONE] after {record.output_len} token(s) (connection closed by the server)")
    if record.finish_reason == "abort":
        raise _Failed("the server aborted the request (finish_reason abort)")


def _read_event(event: Dict, record: RequestRecord, sent: float) -> None:
    if "error" in event:
        raise _Failed(f"server error: {event['error']}")
    meta = event.get("meta_info") or {}
    tokens = meta.get("completion_tokens")
    if tokens is not None:
        now = time.perf_counter() - sent
        if record.ttft_s is None and (tokens > 0 or event.get("text")):
            record.ttft_s = record.last_token_s = now
        elif tokens > record.output_len and record.last_token_s is not None:
            new = int(tokens) - record.output_len
            record.itl_s.extend([round((now - record.last_token_s) / new, 6)] * new)
            record.last_token_s = now
        record.output_len = int(tokens)
    if meta.get("prompt_tokens") is not None:
        record.prompt_len = int(meta["prompt_tokens"])
    if meta.get(PREDICTION_KEY) is not None:
        record.predicted_output_len = float(meta[PREDICTION_KEY])
    reason = meta.get("finish_reason")
    if reason is not None:
        record.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)


def check_server(url: str, timeout_s: float = 10.0) -> None:
    """Fail before the run, naming the URL, when a server does not answer ``GET /health``."""
    from specforge_outlets.errors import OutletsError

    try:
        response = httpx.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise OutletsError(
            f"--base-url {url}: server not reachable (GET {url}/health: {type(exc).__name__}: {exc}); "
            "start it or fix the URL"
        ) from None
    if response.status_code != 200:
        raise OutletsError(
            f"--base-url {url}: GET {url}/health answered HTTP {response.status_code}; wait until the server is "
            "ready or fix the URL"
        )
