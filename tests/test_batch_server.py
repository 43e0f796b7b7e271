"""The offline batch on real servers (benchmarks/batch_server_study.py): its logic without servers."""

import argparse
import json
import math
import os

import numpy as np
import pytest

from specforge_outlets.loadgen.bench_command import summarize_records
from specforge_outlets.loadgen.client import RequestRecord
from specforge_outlets.loadgen.workload import poisson_arrivals
from specforge_outlets.studies import batch_server as study


def record(request_id: str, sent_s: float, ttft_s: float, e2e_s: float, output_len: int) -> RequestRecord:
    return RequestRecord(id=request_id, url="u", scheduled_s=0.0, sent_s=sent_s, ttft_s=ttft_s, e2e_s=e2e_s,
                         output_len=output_len, expected_output_len=output_len, success=True)


RECORDS = [record("a", 0.0, 1.0, 3.0, 100), record("b", 0.5, 2.0, 9.5, 900)]


def test_the_pass_is_charged_onto_every_latency_and_the_makespan():
    """A 4 s pass before the batch: TTFT and end-to-end grow by 4 s per request, the makespan by 4 s, and the
    throughput falls with it; with no charge the figures are bench-serving's own."""
    free, charged = study.batch_metrics(RECORDS, 0.0), study.batch_metrics(RECORDS, 4.0)
    assert free["mean TTFT s"] == pytest.approx(1.5) and charged["mean TTFT s"] == pytest.approx(5.5)
    assert charged["P99 TTFT s"] - free["P99 TTFT s"] == pytest.approx(4.0)
    assert free["mean e2e s"] == pytest.approx(6.25) and charged["mean e2e s"] == pytest.approx(10.25)
    assert charged["short P99 s"] == pytest.approx(7.0) and charged["long P99 s"] == pytest.approx(13.5)
    # from the batch's submission: b, sent 0.5 s after a, waited those 0.5 s too; the makespan is the same
    submitted = study.batch_metrics(study.from_submission(RECORDS), 4.0)
    assert submitted["mean TTFT s"] == pytest.approx(5.75) and submitted["long P99 s"] == pytest.approx(14.0)
    assert submitted[study.MAKESPAN] == pytest.approx(14.0)
    assert free[study.MAKESPAN] == pytest.approx(10.0) and charged[study.MAKESPAN] == pytest.approx(14.0)
    assert free["throughput tok/s"] == pytest.approx(100.0) and charged["throughput tok/s"] == pytest.approx(1000 / 14)
    assert summarize_records(RECORDS, 800)["all"]["ttft_mean_s"] == free["mean TTFT s"]
    with pytest.raises(ValueError, match="charge_s"):
        summarize_records(RECORDS, 800, charge_s=-1.0)


def test_the_shuffled_rung_permutes_outlets_values_across_the_requests():
    rows = [{"id": f"p{index}/0", "predicted_output_len": float(10 * index)} for index in range(50)]
    shuffled = study.shuffled_rows(rows, seed=1)
    assert [row["id"] for row in shuffled] == [row["id"] for row in rows]
    assert sorted(row["predicted_output_len"] for row in shuffled) == [row["predicted_output_len"] for row in rows]
    assert shuffled != rows and shuffled == study.shuffled_rows(rows, seed=1)


def test_only_the_order_differs_between_the_outlets_servers_and_sglangs():
    """The outlets servers keep SGLang's own KV charge; no server drops the radix cache the pass fills; the
    prediction-free servers get no prediction and the ladder runs on SJF."""
    for name, flags in study.SERVERS.items():
        assert "--disable-radix-cache" not in flags + study.SERVER_ARGS
        if name.startswith("outlets"):
            assert flags[-2:] == ["--outlets-kv-admission", "sglang"]
            assert name in study.RUNGS
        else:
            assert study.rungs_of(name) == ("none",)
    assert study.rungs_of("outlets sjf") == ("constant", "shuffled", "outlets", "oracle")


def run(pass_s: float, mean_ttft: float, tails: float = 10.0) -> dict:
    """A run whose charged columns are its free ones plus the pass."""
    free = {column: tails for column in study.COLUMNS}
    free["mean TTFT s"] = mean_ttft
    charged = {column: value + pass_s for column, value in free.items()}
    return {"pass_s": pass_s, "free": free, "charged": charged, study.PACED: charged}


def test_the_verdict_reads_the_aim_against_the_best_peer_with_the_pass_charged():
    rows = [{"server": "fcfs", "rung": "none", "runs": [run(0, 10.0), run(0, 12.0)]},
            {"server": "fcfs (A/A control)", "rung": "none", "runs": [run(0, 12.0)]},
            {"server": "lof", "rung": "none", "runs": [run(0, 10.0)]}]
    rows += [{"server": "outlets sjf", "rung": rung, "runs": [run(0.5, mean)]}
             for rung, mean in (("constant", 11.0), ("shuffled", 11.5), ("outlets", 8.0), ("oracle", 4.0))]
    found = study.verdict(rows)
    assert found["peer (free)"] == found["peer (charged)"] == "lof"  # 10.0 s against fcfs's median 11.0 s
    assert found["aim (free)"]["holds"] and found["aim (free)"]["ratios"]["mean TTFT s"] == pytest.approx(0.8)
    # charged: mean TTFT 8.5 / 10 = 0.85 holds, but the 0.5 s pass puts every tail at 1.05x
    assert found["aim (charged)"]["ratios"]["mean TTFT s"] == pytest.approx(0.85)
    assert not found["aim (charged)"]["holds"]
    assert not found["order (free)"]["constant >= shuffled"]
    assert found["A/A (free)"]["mean TTFT s"] == pytest.approx(12 / 11)  # fcfs's second session against the median
    assert found["order (charged)"]["constant >= outlets >= oracle"]


def test_the_servers_own_lines_say_whether_slots_or_kv_bound_and_the_pace():
    log = ("Prefill batch, #new-seq: 3, #new-token: 40, #cached-token: 300, token usage: 0.01, #running-req: 13\n"
           "Decode batch, #running-req: 16, #token: 900, token usage: 0.05, cpu graph: False, "
           "gen throughput (token/s): 400.0, #queue-req: 180\n"
           "Decode batch, #running-req: 16, #token: 1200, token usage: 0.07, cpu graph: False, "
           "gen throughput (token/s): 440.0, #retracted_reqs: 0\n"
           "Decode batch, #running-req: 1, #token: 2000, token usage: 0.01, cpu graph: False, "
           "gen throughput (token/s): 90.0, #queue-req: 0\n")
    assert study.server_load(log) == {"pace_tok_s": 420.0, "max_running": 16, "max_token_usage": 0.07,
                                      "cached_tokens": 300, "retracted": 0}


def test_pace_adjustment_scales_times_by_the_runs_pace_over_the_reference():
    """A run on a machine 10% slower than fcfs's (360 against 400 tokens/s at full slots) gets its times cut by 10%."""
    found = run(1.0, 20.0)
    found["load"] = {"pace_tok_s": 360.0}
    paced = study.pace_adjusted(found, 400.0)
    assert paced["mean TTFT s"] == pytest.approx(21.0 * 0.9) and paced[study.MAKESPAN] == pytest.approx(11.0 * 0.9)
    assert paced["throughput tok/s"] == pytest.approx(11.0 / 0.9)


def arguments(**changes) -> argparse.Namespace:
    found = argparse.Namespace(requests=120, seed=0, max_running=16, rate=study.BATCH_RATE, repetitions=1)
    vars(found).update(changes)
    return found


def test_the_batch_is_sent_in_order_at_the_study_rate_and_the_pass_at_once(tmp_path, monkeypatch):
    """The batch goes at ``--rate`` (a finite rate keeps the dataset's order with the seed's gaps; all at once
    the order is the connections'), the prefill-only pass all at once (its whole duration is charged)."""
    sent = []

    def send_dataset(url, dataset, model, output, label, rate, seed, predictions, *generation):
        os.makedirs(output, exist_ok=True)
        sent.append((os.path.basename(output), rate, seed))
        with open(os.path.join(output, "summary.json"), "w") as handle:
            json.dump({}, handle)

    monkeypatch.setattr(study, "send_dataset", send_dataset)
    monkeypatch.setattr(study, "flush_cache", lambda url: None)
    monkeypatch.setattr(study, "read_summary", lambda path: {"duration_s": 1.5})
    monkeypatch.setattr(study, "predictions_sent", lambda runs_dir, rung: [])
    log = tmp_path / "server.log"
    log.write_text("")
    server = argparse.Namespace(url="http://x")
    args = arguments(runs_dir=str(tmp_path), rate=50.0, seed=3)
    study.run_batch(args, server, "outlets sjf", "outlets", 0, "d.jsonl", "m", str(log))
    assert sent == [("pass", study.PASS_RATE, 3), ("rep0.partial", 50.0, 3)]
    assert math.isinf(study.PASS_RATE) and math.isfinite(study.BATCH_RATE)
    # the client's schedule at the study's rate: the dataset's order, the same gaps each session, about a second
    arrivals = poisson_arrivals(120, study.BATCH_RATE, 0)
    assert np.all(np.diff(arrivals) >= 0) and np.array_equal(arrivals, poisson_arrivals(120, study.BATCH_RATE, 0))
    assert arrivals[-1] < 3.0


def test_a_runs_directory_refuses_runs_sent_at_another_rate(tmp_path):
    """Runs sent all at once (the first study, whose config.json has no rate) and in order at a rate are not
    one configuration."""
    first = {key: value for key, value in study.study_config(arguments(), 1000).items() if key != "rate"}
    (tmp_path / "config.json").write_text(json.dumps(first))
    with pytest.raises(SystemExit, match="another --runs-dir"):
        study.check_config(str(tmp_path), study.study_config(arguments(), 1000))
    study.check_config(str(tmp_path), study.study_config(arguments(rate=math.inf), 1000))
    ordered = tmp_path / "ordered"
    ordered.mkdir()
    study.check_config(str(ordered), study.study_config(arguments(), 1000))
    with pytest.raises(SystemExit, match="another --runs-dir"):
        study.check_config(str(ordered), study.study_config(arguments(rate=50.0), 1000))


def test_out_of_order_counts_pairs_whose_first_tokens_crossed_their_sends():
    """c, sent last, had its first token before a and b (two pairs); a and b, 10 ms apart, count as in order."""
    records = [record("a", 0.0, 1.00, 2.0, 10), record("b", 0.1, 0.91, 2.0, 10), record("c", 0.2, 0.3, 2.0, 10)]
    assert study.out_of_order(records) == 2
    assert study.out_of_order(records[:2]) == 0


def test_the_committed_requests_carry_their_run_and_pass_without_gaps_or_port(tmp_path):
    import gzip

    out = tmp_path / "outlets-sjf" / "outlets" / "rep0"
    out.mkdir(parents=True)
    (out / "pass.json").write_text(json.dumps({"pass_s": 1.5}))
    row = {**RECORDS[0].to_json(), "itl_s": [0.1, 0.2]}
    (out / "requests.jsonl").write_text(json.dumps(row) + "\n")
    path = tmp_path / "requests.jsonl.gz"
    study.write_requests(str(tmp_path), [str(out)], str(path))
    [written] = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    assert written["run"] == "outlets-sjf/outlets/rep0" and written["pass_s"] == 1.5 and written["id"] == "a"
    assert "itl_s" not in written and "url" not in written
    study.write_requests(str(tmp_path), [str(out)], str(tmp_path / "again.gz"))
    assert (tmp_path / "again.gz").read_bytes() == path.read_bytes()
