"""The routing-rule study on a tiny synthetic record: its plan, resumability, ratios and the 1.02x bar."""

import argparse
import json

import pytest

from specforge_outlets.studies import routing_rule
from tests.test_regime_map import TinyRecord


def test_the_bar_holds_every_headline_figure_within_two_percent_goodput_included():
    within = {metric: 1.02 for metric in routing_rule.HEADLINE} | {"goodput_rps": 1 / 1.02}
    assert routing_rule.verdict(within)
    assert not routing_rule.verdict(within | {"short_p99_s": 1.021})
    assert not routing_rule.verdict(within | {"goodput_rps": 0.98})


def test_cells_resume_and_the_report_rates_every_run_against_the_best_peer(tmp_path):
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps({routing_rule.CLUSTER: {"capacity_rps": 10.0}}))
    args = argparse.Namespace(output=str(tmp_path / "out"), capacity=str(capacity), loads=[0.7, 1.2], seeds=[0, 1],
                              requests=40, stacks=["fcfs"])
    work = TinyRecord()
    routing_rule.simulate(args, work)
    path = routing_rule.cell_path(args.output, 1.2, 1)
    assert routing_rule.simulate_cell(work, 1.2, 1, 10.0, 40, ["fcfs"], path) == 0  # nothing left to run
    plan = routing_rule.run_plan(["fcfs"])
    assert len(plan) == len(routing_rule.PEERS) + len(routing_rule.PREDICTED) * len(routing_rule.RUNGS)
    result = routing_rule.report(args)
    assert [cell["load"] for cell in result["cells"]] == [0.7, 1.2]
    for verdicts in result["within_bar_with_outlets_r0"].values():
        assert set(verdicts) == {f"{routing} · fcfs | outlets r0" for routing in routing_rule.PREDICTED}
    for cell in result["cells"]:
        assert set(cell["runs"]) == {label for label, *_ in plan}
        for metric in ("ttft_mean_s", "ttft_p99_s"):  # the tiny record has no long request: no long P99
            best = cell["best_peer"][metric]
            assert best in routing_rule.PEERS and cell["runs"][best]["ratio"][metric] == pytest.approx(1.0)
            assert cell["runs"][routing_rule.TOTAL_REQUESTS]["ratio_to_total_requests"][metric] == 1.0
    table = (tmp_path / "out" / "table.md").read_text()
    assert table.count("| 1.2 (12 rps) |") == len(plan)
    # a cell holding another stack's runs too: the report reads only the stacks asked for
    routing_rule.simulate(argparse.Namespace(**{**vars(args), "stacks": ["fcfs", "plugin default"]}), work)
    assert set(routing_rule.report(args)["cells"][0]["runs"]) == {label for label, *_ in plan}
