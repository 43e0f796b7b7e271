"""``GET /get_load``: the instance's predicted remaining work, in the format ``sglang-router`` polls.

The router's power_of_two policy (sglang-router 0.3.2, ``LoadMonitor``) polls ``GET {worker}/get_load``
and reads a JSON array with one object per data-parallel rank, summing each object's integer
``num_tokens``. SGLang 0.5.23 no longer serves that route (a poll reads as -1, the least load there
is, so power_of_two routes at random). With an OUTLETS policy this module serves it, with
``num_tokens`` = the rank's predicted remaining output tokens: the ``outlets_predicted_work`` its
scheduler puts in each load snapshot (``routing.get_loads_around``: the sum over its running,
waiting and PD-queued requests of ``predictions.predicted_remaining``, the quantity the data-parallel router
balances). It is read in the HTTP process from SGLang's load-snapshot shared memory, the source of
``/v1/loads``, so a poll costs no round trip to the scheduler.

It never fails: a snapshot without the plugin's field, or any error, reports SGLang's own token
load for that rank (``num_total_tokens``: KV in use plus tokens waiting for prefill, the old
``/get_load``'s ``num_tokens``). A PD prefill instance reports SGLang's token load too: its work is
the prompts, which SGLang counts exactly; the output a prediction counts is the decode side's.

Served only by the Python HTTP server with one tokenizer process (not with ``SGLANG_RUST_SERVER``
or ``--tokenizer-worker-num`` > 1: there is no ``TokenizerManager`` beside the FastAPI app).
"""

from __future__ import annotations

import logging
import math
import sys
from typing import List, Optional, Sequence

from sglang_patches import state
from sglang_patches.snapshots import install_decoder

logger = logging.getLogger("sglang_patches")

ROUTE = "/get_load"
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
# A failing load read is logged on its first occurrence and then every this many polls (the router
# polls every --worker-startup-check-interval seconds, 1 s in the recipe: one line a minute or so).
LOG_EVERY_N_FAILURES = 100
# Where each entry's num_tokens came from (the entry's "load" field, for people reading the route).
PREDICTED = "predicted_remaining"
SGLANG_TOKENS = "sglang_tokens"

def sglang_token_load(snapshot) -> int:
    """SGLang's own token load of a rank: KV tokens in use plus tokens waiting for prefill."""
    return int(getattr(snapshot, "num_total_tokens", 0) or 0)


def _is_prefill(snapshot) -> bool:
    section = getattr(snapshot, "disaggregation", None)
    return getattr(section, "mode", None) == "prefill"


def rank_entry(snapshot) -> dict:
    """One rank's ``/get_load`` object from its load snapshot (SGLang's, or the plugin's subclass)."""
    waiting = int(getattr(snapshot, "num_waiting_reqs", 0) or 0)
    entry = {"dp_rank": int(getattr(snapshot, "dp_rank", 0) or 0),
             "num_reqs": int(getattr(snapshot, "num_running_reqs", 0) or 0) + waiting,
             "num_waiting_reqs": waiting, "num_tokens": sglang_token_load(snapshot), "load": SGLANG_TOKENS}
    work = getattr(snapshot, "outlets_predicted_work", None)
    if work is not None and not _is_prefill(snapshot):
        work = float(work)
        if math.isfinite(work) and work >= 0:
            entry.update(num_tokens=int(round(work)), load=PREDICTED)
    return entry


def _empty_entry(rank: int) -> dict:
    # a rank whose scheduler has published nothing yet (starting up): nothing is known to be queued
    return {"dp_rank": rank, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "load": SGLANG_TOKENS}


def payload(snapshots: Sequence, num_ranks: int) -> List[dict]:
    """The ``/get_load`` array: one object per rank ``0 .. num_ranks - 1``, ordered by rank."""
    by_rank = {}
    for snapshot in snapshots:
        try:
            entry = rank_entry(snapshot)
        except Exception as error:  # a malformed snapshot: SGLang's own figure for it
            _record_failure(error)
            entry = {**_empty_entry(int(getattr(snapshot, "dp_rank", 0) or 0)),
                     "num_tokens": _safe_token_load(snapshot)}
        by_rank[entry["dp_rank"]] = entry
    return [by_rank.get(rank) or _empty_entry(rank) for rank in range(max(num_ranks, len(by_rank)))]


def _safe_token_load(snapshot) -> int:
    try:
        return sglang_token_load(snapshot)
    except Exception:
        return 0


def read_payload(reader) -> List[dict]:
    """``payload`` of what ``reader`` (SGLang's load-snapshot reader) holds now; never raises."""
    num_ranks = 1
    try:
        num_ranks = max(1, int(getattr(reader, "dp_size", 1) or 1))
        install_decoder()  # the reader decodes the plugin's snapshot fields (once per process; then a check)
        return payload(reader.read_all(), num_ranks)
    except Exception as error:
        _record_failure(error)
        return [_empty_entry(rank) for rank in range(num_ranks)]


def _record_failure(error: BaseException) -> None:
    state.PLUGIN.load_failures += 1
    failures = state.PLUGIN.load_failures
    if failures == 1 or failures % LOG_EVERY_N_FAILURES == 0:
        logger.warning("OUTLETS /get_load fell back to SGLang's token load (%d times so far): %r", failures, error)


def install_route(app, reader) -> bool:
    """Add ``GET /get_load`` to ``app`` reading ``reader``; False if the app already has the route."""
    if any(getattr(route, "path", None) == ROUTE for route in getattr(app, "routes", ())):
        return False

    async def get_load():
        return read_payload(reader)

    app.add_api_route(ROUTE, get_load, methods=["GET"], include_in_schema=False)
    return True


def tokenizer_manager_init_after(result, self, *args, **kwargs):
    """In the HTTP server's process: serve ``/get_load`` beside SGLang's routes (OUTLETS policies only)."""
    if not (state.schedule_policy_is_outlets() or state.load_balance_is_outlets()):
        return result
    http_server = sys.modules.get(HTTP_SERVER_MODULE)  # absent for sglang.Engine (no HTTP server)
    app: Optional[object] = getattr(http_server, "app", None)
    reader = getattr(self, "load_snapshot_reader", None)
    if app is None or reader is None:
        return result
    try:
        if install_route(app, reader):
            logger.info("OUTLETS serves GET %s: predicted remaining output tokens per rank (sglang-router "
                        "power_of_two)", ROUTE)
    except Exception as error:  # serving stays up without the route (the router then reads -1)
        logger.warning("OUTLETS could not add GET %s: %r", ROUTE, error)
    return result


_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"

HOOK_TARGETS = [
    (f"{_TOKENIZER}.__init__", tokenizer_manager_init_after, "AFTER", {state.ORDERING, state.ROUTING}),
]
