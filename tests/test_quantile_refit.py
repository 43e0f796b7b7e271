"""`outlets fit-quantile-head`: a quantile head fitted on a trained draft's frozen states, written into a copy of the export."""

import json

import torch
from safetensors.torch import load_file

from specforge_outlets.cli import main
from specforge_outlets.evaluation import quantile_refit_command as refit
from specforge_outlets.evaluation.heads import Standardised, mlp
from specforge_outlets.evaluation.outlets_predictor import load_draft
from specforge_outlets.evaluation.requests import load_split
from specforge_outlets.model.plain_draft import OutletsLengthPredictor
from tests.test_eval import chat, make_export  # noqa: F401  (module fixture)

LEVELS = (0.1, 0.5, 0.9)


def test_folding_the_standardisation_keeps_the_outputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 12, generator=g) * torch.linspace(0.1, 20, 12) + 5
    model = Standardised(x, mlp(12, (8, 4), 3))
    folded = model.folded()
    torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-4)
    assert not torch.equal(folded[0].weight, model.body[0].weight)  # a copy: the fitted model is untouched


def fit_long_group(censored_training: str):
    """Rows whose second feature marks responses cut at the cap (z = log1p(512)); the first half finish short."""
    g = torch.Generator().manual_seed(1)
    n = 400
    long = torch.arange(n) >= n // 2
    x = torch.stack([torch.randn(n, generator=g), long.float()], dim=1)
    cap = torch.log1p(torch.tensor(512.0))
    y = torch.where(long, cap, torch.log1p(torch.randint(20, 60, (n,), generator=g).float()))
    keep = torch.ones(n, dtype=torch.bool) if censored_training == "one_sided" else ~long
    rows = {"x": x[keep], "y": y[keep], "sample_weight": torch.ones(int(keep.sum())),
            "groups": torch.arange(n)[keep], "censored": long[keep]}
    head, info = refit.fit_quantile_head(rows, (2, 16, 8), LEVELS, max_epochs=200, seed=0)
    with torch.no_grad():
        q = head.log_remaining_quantiles(head(torch.tensor([[0.0, 1.0]])))[0]
    return q, cap, info


def test_one_sided_censoring_lets_the_upper_quantile_reach_the_cap_and_dropping_them_does_not():
    q, cap, info = fit_long_group("one_sided")
    assert info["epochs"] > 0 and info["levels"] == list(LEVELS)
    assert float(q[-1]) >= float(cap) - 0.05  # q90 of the long group at or past the cap: its responses can count
    dropped, _, _ = fit_long_group("drop")
    assert float(dropped[-1]) < float(cap) - 1.0  # never saw a long response: predicts the short ones


def test_the_copy_serves_the_fitted_head_and_keeps_every_draft_weight(chat, tmp_path):  # noqa: F811
    target, train_dir, _ = chat
    source = make_export(target, tmp_path / "draft")
    predictor = OutletsLengthPredictor(source, load_draft(source, target).embed_tokens)
    rows = refit.draft_state_rows(predictor, load_split(train_dir).with_censored(), progress=False)
    head, info = refit.fit_quantile_head(rows, predictor.outlets.head_widths, LEVELS, max_epochs=5, seed=0)
    out = tmp_path / "with-quantiles"
    refit.write_export(source, str(out), head, LEVELS, info)

    config = json.loads((out / "config.json").read_text())["outlets_config"]
    assert config["quantile_levels"] == list(LEVELS) and config["quantile_mode"] == "detached"
    before, after = load_file(f"{source}/model.safetensors"), load_file(out / "model.safetensors")
    assert {k for k in after if not k.startswith("quantile_head.")} == set(before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    served = OutletsLengthPredictor(str(out), predictor.embed_tokens)
    expected = head.log_remaining_quantiles(head(rows["x"]))
    torch.testing.assert_close(head.log_remaining_quantiles(served.quantile_head(rows["x"])), expected)
    assert json.loads((out / refit.REFIT_FILE).read_text())["training_positions"] == len(rows["x"])
    assert not (tmp_path / "with-quantiles.partial").exists()


def test_the_command_writes_an_export_eval_scores_for_coverage(chat, tmp_path, capsys):  # noqa: F811
    target, train_dir, test_dir = chat
    source = make_export(target, tmp_path / "draft")
    out = tmp_path / "with-quantiles"
    args = ["fit-quantile-head", "--draft", source, "--features", train_dir, "--target", target, "--output", str(out),
            "--levels", "0.1,0.5,0.9", "--max-epochs", "3", "--no-progress"]
    assert main(args) == 0
    assert main(args) == 2 and "pass --overwrite" in capsys.readouterr().err  # nothing replaced unasked
    report = tmp_path / "report"
    assert main(["eval", "--draft", str(out), "--features", test_dir, "--train-features", train_dir, "--target", target,
                 "--baselines", "constant", "--no-drafting", "--timing-repeats", "2", "--no-progress",
                 "--output", str(report)]) == 0
    assert json.loads((report / "report.json").read_text())["calibration"]["outlets"]["levels"] == list(LEVELS)


def test_calibration_features_give_the_served_quantiles_their_coverage(chat, tmp_path, capsys):  # noqa: F811
    """--calibration-features: the export's config carries per-level shifts that bring the served quantiles' pooled
    served-length coverage on the calibration split to each level; every reader of the export serves them."""
    from specforge_outlets.evaluation import calibration as conformal
    from specforge_outlets.evaluation.outlets_predictor import served_predictions

    target, train_dir, test_dir = chat
    source = make_export(target, tmp_path / "draft")
    raw, calibrated = tmp_path / "raw", tmp_path / "calibrated"
    common = ["--draft", source, "--features", train_dir, "--target", target, "--levels", "0.1,0.5,0.9",
              "--max-epochs", "3", "--no-progress"]
    assert main(["fit-quantile-head", *common, "--output", str(raw)]) == 0
    assert main(["fit-quantile-head", *common, "--output", str(calibrated), "--calibration-features", test_dir]) == 0
    assert "served shifts" in capsys.readouterr().out
    shifts = json.loads((calibrated / "config.json").read_text())["outlets_config"]["quantile_shifts"]
    assert json.loads((raw / "config.json").read_text())["outlets_config"]["quantile_shifts"] is None
    assert json.loads((calibrated / refit.REFIT_FILE).read_text())["conformal"]["shifts"] == shifts
    embed = load_draft(source, target).embed_tokens
    split = load_split(test_dir).with_censored()

    def pooled_coverage(export):
        predictions = served_predictions(OutletsLengthPredictor(str(export), embed), split, desc="", progress=False)
        points = conformal.pooled(list(conformal.calibration_points(split.requests, predictions).values()))
        return [row["upper"] for row in conformal.coverage(points, LEVELS)], predictions

    before, raw_predictions = pooled_coverage(raw)
    after, predictions = pooled_coverage(calibrated)
    assert all(coverage >= level for coverage, level in zip(after, LEVELS)) and after != before
    z_raw, z_served = (torch.log1p(torch.as_tensor(p[0].dynamic_quantiles[0])) for p in (raw_predictions, predictions))
    expected = torch.cummax(z_raw + torch.tensor(shifts, dtype=torch.float64), dim=0).values
    torch.testing.assert_close(z_served, expected, atol=1e-4, rtol=0)  # the same weights, the shifts added
    draft = load_draft(str(calibrated), target)  # SpecForge's class serves them too
    torch.testing.assert_close(draft.quantile_head.shifts, torch.tensor(shifts, dtype=torch.float32))


def test_the_copy_may_not_replace_its_source(chat, tmp_path, capsys):  # noqa: F811
    target, train_dir, _ = chat
    source = make_export(target, tmp_path / "draft")
    assert main(["fit-quantile-head", "--draft", source, "--features", train_dir, "--target", target,
                 "--output", source, "--overwrite", "--no-progress"]) == 2
    assert "write the copy to a new directory" in capsys.readouterr().err
