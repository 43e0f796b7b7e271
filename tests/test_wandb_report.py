"""``outlets simulate --report-to wandb``: its summary table and plots in an offline wandb run."""

import json

import pytest

from specforge_outlets.cli import main
from tests.data_fixtures import write_jsonl
from tests.wandb_offline import logged_images, logged_tables, offline_run, run_records


def test_simulate_logs_its_summary_table_and_plots_to_wandb(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    trace = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": i * 0.1, "input_length": 100 + 50 * (i % 4),
                                                "output_length": 20 + 300 * (i % 5)} for i in range(40)])
    out = tmp_path / "sim"
    assert main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(out),
                 "--routing", "round-robin", "--queue", "fcfs", "sjf", "--no-controlled-study",
                 "--goodput", "e2el:30000", "--report-to", "wandb"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    run = offline_run(str(out))
    table = logged_tables(run)["summary"]
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(row["routing"], row["queue"]) for row in rows] == [("round-robin", "fcfs"), ("round-robin", "sjf")]
    for row, written in zip(rows, summary["runs"]):
        assert row["short/e2e_p99_s"] == pytest.approx(written["metrics"]["short"]["e2e_p99_s"])
        assert row["all/goodput_rps"] == pytest.approx(written["metrics"]["all"]["goodput_rps"])
    assert logged_images(run) == ["policies"]
    records = run_records(run)
    assert b"kv_capacity_tokens_per_instance" in records and b"e2el" in records  # the header is the run's config
    assert "wandb: logged summary, policies" in capsys.readouterr().out
    assert main(["simulate", "--trace", trace, "--config", "recipes/cluster-h100-1p3d.yaml", "--output",
                 str(tmp_path / "plain"), "--routing", "round-robin", "--queue", "fcfs", "--no-controlled-study"]) == 0
    assert not (tmp_path / "plain" / "wandb").exists()  # the default logs nothing
