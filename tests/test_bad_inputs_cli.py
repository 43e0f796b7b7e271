"""Issue 46: bad inputs and reruns of `outlets simulate` that used to end in a traceback or a stale report.

The other commands' cases sit beside their own tests (test_train_command.py, test_eval.py,
test_data_regenerate.py, test_data_capture.py).
"""

import json

import pytest

from specforge_outlets.cli import main
from tests.data_fixtures import write_jsonl

CLUSTER = "recipes/cluster-h100-1p3d.yaml"


@pytest.fixture()
def trace(tmp_path):
    return write_jsonl(tmp_path / "t.jsonl", [{"timestamp": i * 0.1, "input_length": 100 + 50 * (i % 4),
                                               "output_length": 20 + 300 * (i % 5)} for i in range(40)])


def simulate(trace, out, *args):
    return main(["simulate", "--trace", trace, "--config", CLUSTER, "--output", str(out), "--routing", "round-robin",
                 "--queue", "fcfs", "--no-controlled-study", *args])


def no_wandb_login(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_an_interrupted_rerun_leaves_the_earlier_report_whole_never_mixed(trace, tmp_path, monkeypatch):
    from specforge_outlets.simulation import report

    out = tmp_path / "sim"
    assert simulate(trace, out) == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_summary", interrupted)  # stopped before the last file of the report
    with pytest.raises(KeyboardInterrupt):
        simulate(trace, out, "--rate-scale", "2")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # the earlier run, whole
    monkeypatch.undo()
    assert simulate(trace, out, "--rate-scale", "2") == 0  # the rerun replaces it
    assert [run["rate_scale"] for run in json.loads((out / "summary.json").read_text())["runs"]] == [2.0]
    assert not (tmp_path / "sim.partial").exists()


def test_an_output_that_is_a_file_or_a_directory_of_other_files_is_one_line(trace, tmp_path, capsys):
    (tmp_path / "taken").write_text("not a directory\n")
    assert simulate(trace, tmp_path / "taken") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--output {tmp_path / 'taken'} is a file" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep\n")
    assert simulate(trace, tmp_path / "mine") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds other files than an earlier simulate report" in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep\n"


def test_report_to_wandb_without_a_login_is_refused_before_the_run(trace, tmp_path, monkeypatch, capsys):
    no_wandb_login(monkeypatch, tmp_path)
    out = tmp_path / "sim"
    assert simulate(trace, out, "--report-to", "wandb") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`wandb login`" in err and "--report-to none" in err
    assert not out.exists()  # refused before anything ran
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account needed
    from specforge_outlets.wandb_report import has_login

    assert has_login()
