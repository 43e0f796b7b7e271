"""`outlets simulate` reads outlets eval's complete record (predictions.jsonl.gz) with the predictor named."""

import gzip
import json
import os

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.data.jsonl import BadLine, iter_jsonl
from specforge_outlets.errors import OutletsError
from specforge_outlets.evaluation.predictions_file import MAX_QUOTED_ROW_CHARS, iter_record, read_predictions
from specforge_outlets.simulation.predicted_lengths import PredictorKind, predict_lengths, predicted_trajectories
from specforge_outlets.serving.trace import Trace

COMMITTED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "benchmarks", "data", "sharegpt-smollm2", "eval", "predictions.jsonl.gz")


def record_row(request_id, true, censored, outlets, bert, trajectory):
    return {"id": request_id, "true_output_len": true, "censored": censored,
            "static": {"outlets": outlets, "bert": bert}, "dynamic": {"outlets": trajectory}}


def write_gz(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def record(tmp_path):
    return write_gz(tmp_path / "predictions.jsonl.gz", [
        record_row("a", 3, False, 5.0, 7.0, [5.0, 2.5, 1.0]),
        record_row("b", 2, True, 9.0, 4.0, [9.0, 8.0]),  # cut at 2 tokens: its length is unknown
    ])


def test_a_record_is_read_as_the_named_predictor_static_and_dynamic(record):
    outlets = read_predictions(record, predictor="outlets")
    assert [(r.id, r.predicted_output_len, r.true_output_len, r.trajectory) for r in outlets] == [
        ("a", 5.0, 3.0, (5.0, 2.5, 1.0)), ("b", 9.0, None, (9.0, 8.0))]
    bert = read_predictions(record, predictor="bert")
    assert [(r.predicted_output_len, r.trajectory) for r in bert] == [(7.0, None), (4.0, None)]
    trace = Trace("t", ["a", "b"], np.array([0.0, 1.0]), np.array([10, 10]), np.array([3, 2]))
    assert predict_lengths(PredictorKind.FILE, trace, 0, predictions_path=record, file_predictor="bert") == [7.0, 4.0]
    dynamic = predicted_trajectories(PredictorKind.FILE_DYNAMIC, trace, record, file_predictor="outlets")
    assert [t.tolist() for t in dynamic] == [[5.0, 2.5, 1.0], [9.0, 8.0]]
    with pytest.raises(OutletsError, match="trace id 'a' has no trajectory of --file-predictor 'bert'"):
        predicted_trajectories(PredictorKind.FILE_DYNAMIC, trace, record, file_predictor="bert")


def test_iter_jsonl_reads_a_gzip_file_as_the_plain_one(tmp_path):
    text = '{"id": "a"}\n\n[1]\n{"id": "b"}\n'
    plain = tmp_path / "rows.jsonl"
    plain.write_text(text)
    compressed = tmp_path / "rows.jsonl.gz"  # told apart by its first bytes, not its name
    compressed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, compressed):
        lines = list(iter_jsonl(str(path)))
        assert [number for number, _ in lines] == [1, 3, 4]
        assert lines[0][1] == {"id": "a"} and lines[2][1] == {"id": "b"}
        assert isinstance(lines[1][1], BadLine) and f"{path}:3: expected a JSON object, got list" in str(lines[1][1])


def test_the_record_reader_checks_every_field_and_names_the_line(record, tmp_path):
    assert [row["id"] for _, row in iter_record(record)] == ["a", "b"]
    for field, value, problem in (("dynamic", None, "no dynamic"),
                                  ("true_output_len", 0, "true_output_len must be a positive number"),
                                  ("censored", "no", "censored must be true or false"),
                                  ("static", [5.0], "static and dynamic must be maps")):
        bad = record_row("c", 3, False, 5.0, 7.0, [5.0])
        if value is None:
            del bad[field]
        else:
            bad[field] = value
        path = write_gz(tmp_path / f"bad-{field}.jsonl.gz", [record_row("a", 3, False, 5.0, 7.0, [5.0]), bad])
        with pytest.raises(OutletsError, match=f"bad-{field}.jsonl.gz line 2: {problem}"):
            list(iter_record(path))
        with pytest.raises(OutletsError, match=f"line 2: {problem}"):
            read_predictions(path, predictor="outlets")


def test_the_serving_benchmarks_read_the_committed_record_with_it(tmp_path):
    from specforge_outlets.studies.committed_data import read_eval_record

    rows = read_eval_record()
    assert len(rows) == 595 and sum(row["censored"] for row in rows) == 92
    assert rows == [row for _, row in iter_record(COMMITTED)]
    path = write_gz(tmp_path / "old.jsonl.gz", [{"id": "a", "true_output_len": 3, "censored": False, "static": {}}])
    with pytest.raises(SystemExit, match="the evaluation record .*old.jsonl.gz line 1: no dynamic"):
        read_eval_record(path)


def test_a_record_without_a_named_predictor_is_refused_listing_its_predictors(record):
    with pytest.raises(OutletsError, match="line 1: a row of outlets eval's complete record, with the predictions of "
                                           "bert, outlets; name the one to use with --file-predictor NAME"):
        read_predictions(record)
    with pytest.raises(OutletsError, match="line 1: no prediction of --file-predictor 'probe'; this row has bert, outlets"):
        read_predictions(record, predictor="probe")


def test_rows_of_several_predictors_are_filtered_by_their_predictor_field(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text('{"id": "a", "predictor": "outlets", "predicted_output_len": 5}\n'
                    '{"id": "a", "predictor": "bert", "predicted_output_len": 7}\n')
    assert [r.predicted_output_len for r in read_predictions(str(path), predictor="bert")] == [7.0]
    with pytest.raises(OutletsError, match="line 2: rows of several predictors \\('outlets' before, 'bert' here\\); "
                                           "name the one to use with --file-predictor NAME"):
        read_predictions(str(path))
    with pytest.raises(OutletsError, match="no predictions of --file-predictor 'pia' \\(predictors in the file: "
                                           "outlets, bert\\)"):
        read_predictions(str(path), predictor="pia")
    plain = tmp_path / "outlets.jsonl"
    plain.write_text('{"id": "a", "predicted_output_len": 5}\n')
    with pytest.raises(OutletsError, match="drop --file-predictor for a file of one predictor"):
        read_predictions(str(plain), predictor="outlets")


def test_a_quoted_bad_row_is_cut_to_a_readable_length(tmp_path):
    long_row = record_row("a", 3, False, 5.0, 7.0, [5.0] * 2000)
    long_row["static"]["outlets"] = 0  # not a positive prediction
    path = write_gz(tmp_path / "bad.jsonl.gz", [long_row])
    with pytest.raises(OutletsError) as caught:
        read_predictions(path, predictor="outlets")
    message = str(caught.value)
    assert "needs an id and a positive predicted_output_len" in message and "characters)" in message
    assert len(message) < MAX_QUOTED_ROW_CHARS + 300


def test_a_corrupt_gzip_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"id": "a", "predicted_output_len": 5}\n' * 100)[:40])
    with pytest.raises(OutletsError, match="cut.jsonl.gz: not a readable JSONL or gzip-compressed JSONL file"):
        read_predictions(str(path))


def test_simulate_accepts_the_committed_evaluation_directly(tmp_path, capsys):
    """The issue's command: the project's own predictions.jsonl.gz, OUTLETS r0 and its trajectories by id."""
    rows = read_predictions(COMMITTED, predictor="outlets")
    finished = [r for r in rows if r.true_output_len is not None][:40]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0.2 * i, "input_length": 200, "id": r.id,
                                         "output_length": int(r.true_output_len)}) + "\n"
                             for i, r in enumerate(finished)))
    out = tmp_path / "out"
    code = main(["simulate", "--trace", str(trace), "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(out),
                 "--routing", "least-predicted-work", "--queue", "sjf", "--predictor", "file-dynamic",
                 "--predictions", COMMITTED, "--file-predictor", "outlets"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    predictors = [run["predictor"] for run in summary["runs"]]
    assert predictors == ["file-dynamic", "none", "noisy", "file", "file-dynamic", "oracle"]
    code = main(["simulate", "--trace", str(trace), "--config", "recipes/cluster-h100-1p3d.yaml", "--output", str(out),
                 "--predictor", "file", "--predictions", COMMITTED])
    err = capsys.readouterr().err
    assert code == 2 and "--file-predictor NAME" in err and len(err) < 600 and "Traceback" not in err
