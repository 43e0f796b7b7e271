"""One bar per run, its value written on it: the figures that set runs side by side (``outlets
compare-runs``, and ``outlets simulate`` at a single load level).

An infinite value (failed requests) is a hatched bar just above the tallest finite one, labelled
``inf (failed)``; an undefined one (a class without requests) a hatched stub at zero, labelled
``n/a``: neither may vanish from the figure nor stretch its axis.
"""

from __future__ import annotations

import math
from typing import Sequence

INF_HEIGHT = 1.05  # an infinite value's bar, over the tallest finite one


def draw_bars(axis, names: Sequence[str], values: Sequence[float], colours: Sequence[str], rotation: float) -> None:
    finite = [value for value in values if math.isfinite(value)]
    top = max(finite) if finite else 1.0
    heights = [value if math.isfinite(value) else (top * INF_HEIGHT if math.isinf(value) else 0.0) for value in values]
    bars = axis.bar(range(len(names)), heights, color=list(colours))
    for bar, value in zip(bars, values):
        if math.isfinite(value):
            label = f"{value:.4g}"
        else:
            bar.set_hatch("//")
            bar.set_alpha(0.4)
            label = "inf (failed)" if math.isinf(value) else "n/a"
        axis.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    axis.set_xticks(range(len(names)), list(names), rotation=rotation, ha="right", fontsize=7)
    axis.grid(axis="y", alpha=0.3)
