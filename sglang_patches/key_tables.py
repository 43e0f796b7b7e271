"""The order keys of waiting requests: tables by request, one per scheduling config (kept in ``state.PLUGIN``).

A leaf but for ``state``, so that whatever changes a request's prediction (``predictions.py``) drops its keys
without importing the order that computes them (``order_keys.py``).
"""

from __future__ import annotations

from typing import Dict

from sglang_patches import state
from specforge_outlets.scheduling import RecentPredictions, SchedulingConfig

# Entries a key table may hold beyond the list it last ordered (requests that left the queue:
# admitted, finished) before it is cut back to that list; bounds the finished requests it keeps alive.
KEY_TABLE_SLACK = 1024


class KeyTable:
    """The order keys of waiting requests under one scheduling config, by request.

    Each order computes only the keys it reads: the SJF and longest-first orders their sort key, the
    tail-safe orders a request's class, merge key and arrival stamp (a request that has its class has
    all three). The ranked tail-safe order's window of recent predictions lives here too, so that it
    outlives the rounds, as the classes it gave do."""

    def __init__(self, config: SchedulingConfig) -> None:
        self.sjf: Dict[object, tuple] = {}  # request -> sjf_sort_key
        self.longest: Dict[object, tuple] = {}  # request -> longest_first_sort_key
        self.long: Dict[object, bool] = {}  # request -> is_predicted_long
        self.rank_long: Dict[object, bool] = {}  # request -> its tail-safe-ranks class, given when it joined
        self.merge: Dict[object, int] = {}  # request -> tail-safe merge key
        self.arrival: Dict[object, float] = {}  # request -> its arrival stamp (tail-safe)
        self.recent = RecentPredictions(config)  # tail-safe-ranks: the predictions of the requests that joined

    def drop(self, req) -> None:
        for table in (self.sjf, self.longest, self.long, self.rank_long, self.merge, self.arrival):
            table.pop(req, None)

    def keep_only(self, reqs) -> None:
        for name in ("sjf", "longest", "long", "rank_long", "merge", "arrival"):
            table = getattr(self, name)
            setattr(self, name, {req: table[req] for req in reqs if req in table})


def key_table(config: SchedulingConfig) -> KeyTable:
    """The key table of ``config`` in this process (``state.PLUGIN.key_tables``), shared by its providers, so that
    keys computed for another config are never read."""
    tables = state.PLUGIN.key_tables
    if config not in tables:
        tables[config] = KeyTable(config)
    return tables[config]


def drop_order_keys(req) -> None:
    """Forget a request's cached order keys: its prediction changed, or it ran and may come back with more tokens."""
    for table in state.PLUGIN.key_tables.values():
        table.drop(req)
