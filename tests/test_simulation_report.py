"""``outlets simulate``'s summary.md and plots (simulation/report.py), from rows built without a simulation."""

import math

import numpy as np

from specforge_outlets.serving.metrics import summarize_requests
from specforge_outlets.simulation.report import markdown_summary, study_figure
from specforge_outlets.simulation.study import POLICY_STUDY

HEADER = {"trace": "t.jsonl", "requests": 4}
POLICIES = ("round-robin + fcfs", "round-robin + sjf", "least-predicted-work + sjf")


def row(queue: str, rate_scale: float, slowdown: float, outputs=(900, 1000, 50, 60), slo=None):
    """A summary row of four requests, their latencies stretched by ``slowdown``."""
    arrivals = np.array([0.0, 0.5, 1.0, 1.5]) * 2 / rate_scale
    metrics = summarize_requests(arrivals, arrivals + 0.1 * slowdown, arrivals + np.array([3.0, 4.0, 1.0, 2.0]) * slowdown,
                                 np.array(outputs), queue_delays=np.zeros(4), slo=slo,
                                 token_gaps=lambda mask: (np.full(int(mask.sum()), 0.02), np.ones(int(mask.sum()))))
    routing, order = queue.split(" + ")
    return {"study": POLICY_STUDY, "routing": routing, "queue": order, "predictor": "noisy", "rate_scale": rate_scale,
            "offered_rps": 2.0 * rate_scale, "metrics": metrics}


def series(row_):
    return f"{row_['routing']} + {row_['queue']}"


def test_summary_md_prints_a_dash_for_an_empty_class_and_goodput_columns_with_slo_targets():
    only_long = [row(POLICIES[0], 1.0, 1.0, outputs=(900, 1000, 850, 1200))]
    text = markdown_summary(HEADER, only_long)
    assert "nan" not in text and "| – |" in text  # no short request: its latencies are undefined
    assert "goodput" not in text  # no --goodput: no goodput columns

    with_slo = markdown_summary(HEADER, [row(POLICIES[0], 1.0, 1.0, slo={"e2el": 2.5})])
    header = next(line for line in with_slo.splitlines() if line.startswith("| rate x"))
    assert header.endswith("| goodput req/s | SLO attainment | short goodput req/s | short SLO attainment |")
    # 2 of 4 within 2.5 s (the short ones), over a 5 s makespan
    assert with_slo.splitlines()[-1].endswith("| 0.40 | 0.50 | 0.40 | 1.00 |")
    assert "| – |" not in with_slo  # every class has requests


def test_one_load_level_draws_a_bar_per_policy_on_an_axis_from_zero_and_a_goodput_panel():
    rows = [row(policy, 1.0, 1.0 + index, slo={"e2el": 3.5}) for index, policy in enumerate(POLICIES)]
    figure = study_figure(rows, series)
    p99, goodput = figure.axes
    assert [label.get_text() for label in p99.get_xticklabels()] == list(POLICIES)
    heights = [bar.get_height() for bar in p99.patches]
    assert heights == [r["metrics"]["short"]["e2e_p99_s"] for r in rows]
    assert p99.get_ylim()[0] == 0 and p99.get_ylim()[1] > max(heights)  # not a needle-thin axis around one dot
    assert "goodput" in goodput.get_title() and len(goodput.patches) == len(POLICIES)
    assert "2.00 requests/s" in p99.get_xlabel()


def test_several_load_levels_draw_one_line_per_policy_with_its_own_marker_against_load():
    rows = [row(policy, scale, scale * (1 + index)) for scale in (0.5, 1.0, 2.0) for index, policy in enumerate(POLICIES)]
    figure = study_figure(rows, series)
    p99, throughput = figure.axes
    assert [line.get_label() for line in p99.lines] == list(POLICIES)
    assert len({line.get_marker() for line in p99.lines}) == len(POLICIES)
    assert list(p99.lines[0].get_xdata()) == [1.0, 2.0, 4.0] and p99.get_xlabel() == "offered load (requests/s)"
    assert "throughput" in throughput.get_title() and throughput.get_ylim()[0] == 0  # no --goodput
    assert all(math.isfinite(y) for line in p99.lines for y in line.get_ydata())
