"""The simulator's step model fitted to SGLang's own log lines (``outlets fit-step-time``)."""

import numpy as np
import pytest

from specforge_outlets.cli import main
from specforge_outlets.errors import OutletsError
from specforge_outlets.simulation.step_fit import Interval, fit_step_time, nnls, parse_intervals

TRUE = {"fixed_s": 0.005, "per_request_s": 0.0009, "per_kv_token_s": 8e-7, "per_prefill_token_s": 4e-5}
INTERVAL = 40


def decode_line(batch: int, kv: int, throughput: float) -> str:
    """As SGLang 0.5.23's metrics_reporter writes it."""
    return (f"[2026-12-04 14:27:08] Decode batch, #running-req: {batch}, #token: {kv}, token usage: 0.15, "
            f"cpu graph: False, gen throughput (token/s): {throughput:.2f}, #queue-req: 289")


def prefill_line(new_tokens: int) -> str:
    return (f"[2026-12-04 14:27:07] Prefill batch, #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, "
            "token usage: 0.11, #running-req: 9, #queue-req: 10, #pending-token: 0, cpu graph: False, "
            "input throughput (token/s): 19.79")


def synthetic_log(coefficients=TRUE, intervals=60, noise=0.0, seed=0, idle_at=()):
    """A server log whose every interval took exactly what ``coefficients`` give it (times 1 + noise)."""
    rng = np.random.default_rng(seed)
    lines, batch, kv = [decode_line(8, 3000, 50.0)], 8, 3000  # the first line opens the first interval
    for index in range(intervals):
        prefills = [int(rng.integers(20, 600)) for _ in range(int(rng.integers(0, 3)))]
        lines += [prefill_line(tokens) for tokens in prefills]
        new_batch, new_kv = int(rng.integers(4, 40)), int(rng.integers(1000, 16000))
        mean_batch, mean_kv = (batch + new_batch) / 2, (kv + new_kv) / 2
        seconds = ((INTERVAL + len(prefills)) * coefficients["fixed_s"] + INTERVAL * mean_batch * coefficients["per_request_s"]
                   + INTERVAL * mean_kv * coefficients["per_kv_token_s"] + sum(prefills) * coefficients["per_prefill_token_s"])
        seconds *= 1 + noise * rng.standard_normal()
        if index in idle_at:
            seconds += 20.0  # the server sat idle inside this window
        lines.append(decode_line(new_batch, new_kv, INTERVAL * mean_batch / seconds))
        lines.append("[2026-12-04 14:27:09] INFO:     127.0.0.1:50000 - \"POST /generate HTTP/1.1\" 200 OK")
        batch, kv = new_batch, new_kv
    return lines


def test_parse_intervals_reads_work_and_seconds_between_decode_lines():
    lines = [decode_line(10, 4000, 99.0), prefill_line(100), prefill_line(50), decode_line(12, 5000, 400.0)]
    (interval,) = parse_intervals(lines)
    assert interval == Interval(decode_steps=40, prefill_batches=2, mean_batch=11.0, mean_kv_tokens=4500.0,
                                prefill_tokens=150, seconds=pytest.approx(40 * 11 / 400.0))


def test_fit_recovers_the_coefficients_of_a_noiseless_log():
    fit = fit_step_time(parse_intervals(synthetic_log()))
    assert fit.coefficients == pytest.approx(TRUE, rel=1e-4)  # the log rounds throughput to 0.01
    assert fit.r_squared == pytest.approx(1.0) and fit.dropped == 0


def test_fit_drops_intervals_that_hold_idle_time():
    fit = fit_step_time(parse_intervals(synthetic_log(noise=0.03, idle_at=(5, 30))))
    assert fit.dropped == 2
    assert fit.coefficients["per_request_s"] == pytest.approx(TRUE["per_request_s"], rel=0.15)
    assert fit.coefficients["fixed_s"] == pytest.approx(TRUE["fixed_s"], rel=0.3)


def test_nnls_keeps_coefficients_non_negative():
    features = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    target = np.array([3.0, 2.0, 1.0])  # the unconstrained slope is negative
    weights = nnls(features, target)
    assert weights[1] == 0 and weights[0] == pytest.approx(2.0)


def test_fit_needs_enough_intervals():
    with pytest.raises(OutletsError, match="need at least 12"):
        fit_step_time(parse_intervals(synthetic_log(intervals=5)))


def test_fit_step_time_command_prints_a_cluster_yaml_block(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text("\n".join(synthetic_log()) + "\n")
    assert main(["fit-step-time", "--server-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fitted_step_time:") and "per_request_s: 0.0009" in out and "R^2 1.000" in out


def test_fit_step_time_command_names_a_log_without_decode_lines(tmp_path, capsys):
    log = tmp_path / "other.log"
    log.write_text(prefill_line(10) + "\n")
    assert main(["fit-step-time", "--server-log", str(log)]) != 0
    assert "no two 'Decode batch' lines" in capsys.readouterr().err
