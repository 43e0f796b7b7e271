"""Values as strict JSON holds them: ``inf`` as the string ``"inf"``, NaN as ``null``, numpy scalars as Python's.

Serving summaries carry infinite latencies (a failed request) and undefined ones (an empty class);
``json.dumps(..., allow_nan=False)`` refuses both, so every writer of a summary, a request record or a
wandb run config passes its values through :func:`json_safe` first.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INF_JSON = "inf"


def json_safe(value: Any) -> Any:
    """A copy that strict JSON can hold: ``inf`` -> ``"inf"``, NaN -> ``null`` (nested dicts/lists)."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return None
        if math.isinf(number):
            return INF_JSON if number > 0 else "-inf"
        return number
    if isinstance(value, np.integer):
        return int(value)
    return value
