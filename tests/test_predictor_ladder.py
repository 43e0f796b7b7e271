"""The predictor ladder (studies/predictor_ladder): the label set's samples, the rungs, resumable cells; real servers' ladder."""

import json
import os

import numpy as np
import pytest

from specforge_outlets.studies import kv_bound_server
from specforge_outlets.studies.committed_data import REPO, read_eval_record
from specforge_outlets.studies.label_set_samples import LabelSetSamples
from specforge_outlets.studies.predictor_ladder import cells
from specforge_outlets.studies.predictor_ladder.rungs import RUNGS
from specforge_outlets.studies.sharegpt_serving import MAX_NEW_TOKENS


@pytest.fixture(scope="module")
def samples():
    return LabelSetSamples()


def test_every_prompt_has_four_samples_and_the_ceiling_is_the_mean_of_the_others(samples):
    prompts = [sample_id.split("/")[0] for sample_id in samples.ids]
    assert len(samples.ids) == 4 * len(set(prompts)) and len(set(prompts)) > 200
    lengths = samples.output_lens.reshape(-1, 4)
    expected = (lengths.sum(axis=1, keepdims=True) - lengths) / 3
    assert np.allclose(samples.values["ceiling"].reshape(-1, 4), expected)
    assert samples.censored[samples.output_lens < MAX_NEW_TOKENS].sum() == 0  # only a cut response is censored
    outlets = samples.values["outlets r0"].reshape(-1, 4)
    assert (outlets == outlets[:, :1]).all()  # r̂₀ reads the prompt: one value per prompt


def test_the_converged_record_gives_its_own_rungs_on_the_same_samples(samples):
    """``--record``: the committed converged-draft record (convergence.py test's slim copy) covers the label set's
    prompts, keeps the re-predicting trajectories, and its learned rungs are its own values."""
    record = os.path.join(REPO, "benchmarks", "data", "sharegpt-smollm2", "convergence", "eval",
                          "predictions.jsonl.gz")
    converged = LabelSetSamples(record)
    assert len(converged.ids) >= len(samples.ids) * 0.95
    shared = sorted(set(converged.ids) & set(samples.ids))
    assert len(shared) > 900
    ours, theirs = ([dict(zip(s.ids, s.values["outlets r0"]))[i] for i in shared] for s in (converged, samples))
    assert not np.allclose(ours, theirs)  # the converged draft's r̂₀, not the 0.4-epoch one's
    truth = ([dict(zip(s.ids, s.output_lens))[i] for i in shared] for s in (converged, samples))
    assert next(truth) == next(truth)  # the same samples' lengths
    row = next(iter(read_eval_record(record)))
    assert set(row["dynamic"]) == {"outlets", "probe-mid"} and "quantiles" not in row


def test_every_rung_predicts_every_request(samples):
    trace, drawn = samples.trace(20.0, 50, seed=1)
    for rung, predict in RUNGS.items():
        values = predict(samples, trace, drawn, 1)
        assert len(values) == len(trace), rung
    assert RUNGS["oracle"](samples, trace, drawn, 1) == trace.output_lens.tolist()
    assert set(RUNGS["constant"](samples, trace, drawn, 1)) == {samples.train_median}


def test_a_cell_keeps_its_runs_and_adds_only_those_it_lacks(samples, tmp_path, monkeypatch):
    path = str(tmp_path / "cell.json")
    cells.simulate_cell(samples, "100k", 20.0, 0, 40, path)
    assert cells.complete(path)
    with open(path) as handle:
        cell = json.load(handle)
    cell["runs"] = [run for run in cell["runs"] if run.get("rung") != "ceiling"]
    with open(path, "w") as handle:
        json.dump(cell, handle)
    assert not cells.complete(path)
    simulated = []
    real_run = cells.run
    monkeypatch.setattr(cells, "run", lambda *args: simulated.append(args) or real_run(*args))
    cells.simulate_cell(samples, "100k", 20.0, 0, 40, path)
    assert len(simulated) == len(cells.CONFIGS) and cells.complete(path)


def test_the_real_servers_ladder_runs_its_rungs_on_the_peak_and_the_charge_only():
    study = kv_bound_server
    peak, charge = study.LADDER_SERVERS
    assert study.SERVERS[peak][-2:] == ["--outlets-kv-admission", "peak"]
    for server in (peak, charge):
        assert study.predictors_of(server, ladder=True) == ("none", "constant", "outlets", "ceiling", "oracle")
    assert study.predictors_of("outlets sjf", ladder=True) == ("none",)
    assert study.predictors_of(charge) == study.PREDICTORS  # without --ladder: as before
