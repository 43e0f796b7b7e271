"""`outlets train` / `outlets export` end to end on the tiny target, plus every refused input."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from specforge_outlets.cli import main
from specforge_outlets.data.features import load_features
from specforge_outlets.model.draft import OutletsLlamaForCausalLMEagle3
from specforge_outlets.model.inference import labelled_predictions, predict_log_remaining
from specforge_outlets.training.export_command import export_draft
from tests.tiny_target import make_features, write_recipe


def outlets(*args, env=None):
    return subprocess.run([sys.executable, "-m", "specforge_outlets.cli", *args], capture_output=True,
                          text=True, env={**os.environ, "WANDB_MODE": "offline", **(env or {})}, timeout=900)


def length_mse(draft, features_dir):
    errors = []
    for path in sorted(glob.glob(os.path.join(features_dir, "*.ckpt"))):
        predicted, true = labelled_predictions(draft, load_features(path))
        errors.append((torch.log1p(predicted) - torch.log1p(true.float())) ** 2)
    return torch.cat(errors).mean().item()


@pytest.fixture(scope="module")
def trained_run(tiny_target, tiny_features, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run"))
    recipe = write_recipe(os.path.join(out, "recipe.yaml"), tiny_target, tiny_features, out)
    result = outlets("train", "--config", recipe)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(os.path.join(out, "train.stderr"), "w") as handle:  # a batch job's log: stderr is a pipe
        handle.write(result.stderr)
    return out


def test_training_writes_checkpoint_with_gate_and_head(trained_run):
    state = torch.load(glob.glob(os.path.join(trained_run, "tiny-step*", "training_state.pt"))[0], weights_only=False)
    assert state["strategy"] == "eagle3-outlets"
    keys = set(state["draft_state_dict"])
    assert {"midlayer.self_attn.gate_proj.weight", "midlayer.self_attn.gate_proj.bias",
            "length_head.mlp.0.weight", "length_head.mlp.4.bias"} <= keys
    with open(os.path.join(trained_run, "draft_config.json")) as f:
        config = json.load(f)
    assert config["outlets_config"]["fusion_layers"] == [2, 3, 4]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_training_logs_length_metrics_to_wandb_offline(trained_run):
    runs = glob.glob(os.path.join(trained_run, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(runs) == 1, os.listdir(trained_run)
    with open(runs[0], "rb") as f:
        records = f.read()  # protobuf records: history keys are stored as plain strings
    for metric in (b"length_mse", b"length_mae_tokens", b"length_l2", b"length_loss", b"sd_loss", b"total_loss"):
        assert metric in records, metric


def test_training_run_config_holds_the_outlets_block(trained_run):
    (records,) = glob.glob(os.path.join(trained_run, "wandb", "offline-run-*", "run-*.wandb"))
    with open(records, "rb") as f:
        config = f.read()  # the config is stored as JSON strings under its keys
    for key in (b"outlets", b"length_loss_weight", b"length_l2_weight", b"length_ttt_decay", b"head_widths",
                b"outlets_draft", b"fusion_layers"):
        assert key in config, key


def test_training_prints_a_progress_line_every_log_interval_when_stderr_is_not_a_terminal(trained_run):
    with open(os.path.join(trained_run, "train.stderr")) as f:
        log = f.read()
    pattern = (r"outlets train: step (\d+)/(\d+) \(\d+%\) loss (\d+\.\d+) \| ([\d,]+) tokens/s \| "
               r"elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d")
    lines = re.findall(pattern, log)
    steps = [int(step) for step, *_ in lines]
    total = int(lines[-1][1])
    assert steps == list(range(1, total + 1))  # log_interval 1: one line a step
    assert all(int(rate.replace(",", "")) > 0 for *_, rate in lines)


def test_export_round_trip_and_length_loss_fell(trained_run, tiny_target, tiny_features, tmp_path):
    export = export_draft(trained_run, str(tmp_path / "draft"))
    with open(os.path.join(export, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["OutletsLlamaForCausalLMEagle3"]
    assert config["outlets_config"]["head_widths"] == [32, 16, 8]
    with safe_open(os.path.join(export, "model.safetensors"), "pt") as f:
        assert {"length_head.mlp.0.weight", "midlayer.self_attn.gate_proj.weight", "d2t", "t2d"} <= set(f.keys())
    draft = OutletsLlamaForCausalLMEagle3.from_export(export, target_model_path=tiny_target)

    # the export reproduces the checkpoint's predictions exactly
    state = torch.load(glob.glob(os.path.join(trained_run, "tiny-step*", "training_state.pt"))[0], weights_only=False)
    reference = OutletsLlamaForCausalLMEagle3(draft.config).float().eval()
    reference.load_state_dict(state["draft_state_dict"], strict=False)
    reference.load_embedding(tiny_target)
    features = load_features(sorted(glob.glob(os.path.join(tiny_features, "*.ckpt")))[0])
    args = (features["input_ids"][None], features["aux_hidden_state"])
    assert torch.equal(predict_log_remaining(draft, *args), predict_log_remaining(reference, *args))

    # and training lowered the length error far below the untrained head's
    untrained = OutletsLlamaForCausalLMEagle3(draft.config).float().eval()
    untrained.load_embedding(tiny_target)
    before, after = length_mse(untrained, tiny_features), length_mse(draft, tiny_features)
    assert after < 0.5 * before, (before, after)


def test_export_prints_the_serving_modes_the_plugin_accepts(trained_run, capsys, tmp_path):
    out = str(tmp_path / "draft")
    assert main(["export", "--checkpoint", trained_run, "--output", out]) == 0
    printed = capsys.readouterr().out
    assert f"EAGLE-3: --speculative-algorithm EAGLE3 --speculative-draft-model-path {out} --schedule-policy outlets\n" \
        in printed
    assert f"predictor-only: --schedule-policy outlets --outlets-draft-path {out} --disable-radix-cache\n" in printed
    # fusion layers (2, 3, 4): index 4 is read as layer 5's input
    assert "(TARGET: a Llama-family target (SGLang LlamaModel) with at least 5 layers and hidden size 32)" in printed

    # a head trained on the fused features: predictor-only mode only, EAGLE-3 refused with the plugin's reason
    with open(os.path.join(trained_run, "draft_config.json")) as f:
        config = json.load(f)
    config["outlets_config"]["head_input"] = "fused"
    (tmp_path / "fused.json").write_text(json.dumps(config))
    fused = str(tmp_path / "fused")
    assert main(["export", "--checkpoint", trained_run, "--output", fused,
                 "--draft-config", str(tmp_path / "fused.json")]) == 0
    printed = capsys.readouterr().out
    assert f"predictor-only: --schedule-policy outlets --outlets-draft-path {fused} --disable-radix-cache\n" in printed
    assert "--speculative-draft-model-path" not in printed
    assert "EAGLE-3: refused: outlets_config.head_input='fused'" in printed


def test_two_rank_cpu_run(tiny_target, tiny_features, tmp_path):
    recipe = write_recipe(str(tmp_path / "recipe.yaml"), tiny_target, tiny_features, str(tmp_path),
                          training={"max_steps": 2, "num_epochs": 1, "batch_size": 2},
                          deployment={"trainer": {"nproc_per_node": 2}},
                          tracking={"report_to": "none"})
    result = outlets("train", "--config", recipe, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert glob.glob(str(tmp_path / "tiny-step2" / "training_state.pt"))
    assert glob.glob(str(tmp_path / "tiny-step2" / "training_state_rank1.pt"))


# --- refused before any training starts --------------------------------------------------------


def refused(capsys, recipe, *overrides):
    assert main(["train", "--config", recipe, *overrides]) == 2
    return capsys.readouterr().err


@pytest.fixture()
def recipe(tiny_target, tiny_features, tmp_path):
    return write_recipe(str(tmp_path / "recipe.yaml"), tiny_target, tiny_features, str(tmp_path / "out"))


def test_unknown_keys_are_refused(capsys, recipe):
    assert "outlets.lenght_loss_weight" in refused(capsys, recipe, "outlets.lenght_loss_weight=1")
    assert "training.learning_rat" in refused(capsys, recipe, "training.learning_rat=1")


def test_hidden_size_mismatch_is_refused(capsys, tiny_target, tiny_features, tmp_path):
    with open(os.path.join(tiny_target, "draft_config.json")) as f:
        config = json.load(f)
    config["hidden_size"] = 48
    path = tmp_path / "draft.json"
    path.write_text(json.dumps(config))
    recipe = write_recipe(str(tmp_path / "r.yaml"), tiny_target, tiny_features, str(tmp_path / "o"),
                          model={"draft_model_config": str(path)})
    assert "hidden_size=48 does not match the target's hidden_size=32" in refused(capsys, recipe)


def test_fusion_layers_outside_target_depth_are_refused(capsys, recipe):
    assert "outlets.fusion_layers" in refused(capsys, recipe, "outlets.fusion_layers=[2,3,9]")


def test_features_without_labels_are_refused(capsys, tiny_target, tiny_features, tmp_path):
    features = {k: v for k, v in torch.load(sorted(glob.glob(os.path.join(tiny_features, "*.ckpt")))[0]).items()
                if k != "remaining_length"}
    (tmp_path / "f").mkdir()
    torch.save(features, tmp_path / "f" / "a.ckpt")
    recipe = write_recipe(str(tmp_path / "r.yaml"), tiny_target, str(tmp_path / "f"), str(tmp_path / "o"))
    assert "no 'remaining_length' tensor" in refused(capsys, recipe)


def test_features_whose_every_response_is_censored_are_refused(capsys, tiny_target, tmp_path):
    features = make_features(tiny_target, str(tmp_path / "f"), count=2, seed=0, censor_every=1)
    recipe = write_recipe(str(tmp_path / "r.yaml"), tiny_target, features, str(tmp_path / "o"))
    err = refused(capsys, recipe)
    assert "none of its 2 feature files has a finished response" in err and "--max-new-tokens" in err
    # SD-only uses no label: it passes this check and stops at the next one (nothing trains)
    assert "'eagle3' checkpoint" in refused(capsys, recipe, "outlets.length_loss_weight=0",
                                            f"training.resume_from={another_algorithms_checkpoint(tmp_path)}")


def test_a_recipe_run_from_another_directory_finds_its_draft_config_and_a_missing_one_is_named(
        capsys, tiny_target, tiny_features, tmp_path, monkeypatch):
    (tmp_path / "checkout" / "recipes" / "drafts").mkdir(parents=True)
    shutil.copy(os.path.join(tiny_target, "draft_config.json"), tmp_path / "checkout" / "recipes" / "drafts" / "d.json")
    recipe = write_recipe(str(tmp_path / "checkout" / "recipes" / "r.yaml"), tiny_target, tiny_features,
                          str(tmp_path / "o"), model={"draft_model_config": "recipes/drafts/d.json"})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    # refused after the draft config is resolved: nothing trains
    assert "'eagle3' checkpoint" in refused(capsys, recipe, f"training.resume_from={another_algorithms_checkpoint(tmp_path)}")
    err = refused(capsys, recipe, "model.draft_model_config=recipes/drafts/missing.json")
    assert err.count("\n") == 1 and "draft model config does not exist: recipes/drafts/missing.json" in err
    assert "pass model.draft_model_config=PATH" in err


def test_no_specforge_installed_is_one_line_naming_the_install(tmp_path):
    code = ("import sys; sys.modules['specforge'] = None\n"
            "from specforge_outlets.cli import main\n"
            f"raise SystemExit(main(['train', '--config', {str(tmp_path / 'r.yaml')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("outlets train: error: ")
    assert "specforge-outlets[train]" in result.stderr


def test_target_without_weight_index_is_refused_and_the_fix_works(capsys, tiny_target, tiny_features, tmp_path):
    from specforge_outlets.data.weight_index import read_index, read_weight_map, write_weight_index

    target = str(tmp_path / "target")
    shutil.copytree(tiny_target, target)
    os.remove(os.path.join(target, "model.safetensors.index.json"))
    assert read_index(target) is None
    assert read_weight_map(target)["model.embed_tokens.weight"] == "model.safetensors"  # scanned instead
    recipe = write_recipe(str(tmp_path / "r.yaml"), target, tiny_features, str(tmp_path / "o"))
    err = refused(capsys, recipe)
    assert "has no *.index.json" in err and f"python -m specforge_outlets.data.weight_index {target}" in err
    write_weight_index(target)
    assert read_index(target) == read_weight_map(target)


def test_cpu_fsdp_sharding_is_refused(capsys, recipe):
    assert "NO_SHARD" in refused(capsys, recipe, "training.fsdp_sharding=FULL_SHARD")


def another_algorithms_checkpoint(tmp_path) -> str:
    """A plain EAGLE-3 checkpoint: resuming from it is refused by the last preflight check."""
    (tmp_path / "eagle3-step1").mkdir()
    torch.save({"strategy": "eagle3", "draft_state_dict": {}}, tmp_path / "eagle3-step1" / "training_state.pt")
    return str(tmp_path / "eagle3-step1")


def test_resuming_another_algorithms_checkpoint_is_refused(capsys, recipe, tmp_path):
    err = refused(capsys, recipe, f"training.resume_from={another_algorithms_checkpoint(tmp_path)}")
    assert "'eagle3' checkpoint" in err


def test_exporting_another_algorithms_checkpoint_is_refused(capsys, tmp_path):
    torch.save({"strategy": "eagle3", "draft_state_dict": {}}, tmp_path / "training_state.pt")
    assert main(["export", "--checkpoint", str(tmp_path / "training_state.pt"), "--output", str(tmp_path / "x")]) == 2
    assert "strategy 'eagle3'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_resume_keeps_the_length_head_state(tiny_target, tiny_features, tmp_path):
    """A run resumed from its step-2 checkpoint ends where the uninterrupted run ends."""
    def train(out, **training):
        recipe = write_recipe(str(out / "recipe.yaml"), tiny_target, tiny_features, str(out),
                              training={"max_steps": 4, "save_interval": 2, **training},
                              tracking={"report_to": "none"})
        result = outlets("train", "--config", recipe)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def head(out, step):
        state = torch.load(out / f"tiny-step{step}" / "training_state.pt", weights_only=False)
        return {k: v for k, v in state["draft_state_dict"].items() if k.startswith("length_head")}

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    train(straight)
    train(resumed, resume_from=str(straight / "tiny-step2"))
    assert head(straight, 2).keys() == head(resumed, 4).keys()
    assert any(not torch.equal(head(straight, 2)[k], head(straight, 4)[k]) for k in head(straight, 2))
    for key, value in head(straight, 4).items():
        assert torch.allclose(value, head(resumed, 4)[key], atol=1e-5), key


def test_a_killed_run_restarted_on_its_directory_ends_where_an_uninterrupted_run_ends(tiny_target, tiny_features,
                                                                                      tmp_path):
    """SIGKILL after the first checkpoint, restart with resume_overrides: the same final state as never stopping."""
    from specforge_outlets.training.resumable import complete_checkpoints, prune_checkpoints, resume_overrides

    def command(out):
        recipe = write_recipe(str(out / "recipe.yaml"), tiny_target, tiny_features, str(out),
                              training={"max_steps": 6, "save_interval": 2}, tracking={"report_to": "none"})
        return [sys.executable, "-m", "specforge_outlets.cli", "train", "--config", recipe]

    def state(out):
        path = complete_checkpoints(str(out), "tiny")[6]
        return torch.load(os.path.join(path, "training_state.pt"), weights_only=False)["draft_state_dict"]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    assert subprocess.run(command(straight), capture_output=True, timeout=900).returncode == 0
    assert resume_overrides(str(killed), "tiny") == []  # nothing to resume: a fresh start
    kill_hook = os.path.join(os.path.dirname(__file__), "kill_after_checkpoint")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [kill_hook, os.environ.get("PYTHONPATH")]))}
    killed_run = subprocess.run(command(killed), capture_output=True, text=True, timeout=900, env=env)
    assert killed_run.returncode != 0, "the run was not killed"
    done = complete_checkpoints(str(killed), "tiny")
    assert list(done) == [2], done  # killed right after the first checkpoint
    overrides = resume_overrides(str(killed), "tiny")
    assert overrides == [f"training.resume_from={killed}"]
    result = subprocess.run(command(killed) + overrides, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(complete_checkpoints(str(killed), "tiny")) == [2, 4, 6]
    for key, value in state(straight).items():
        assert torch.allclose(value, state(killed)[key], atol=1e-5), key
    assert prune_checkpoints(str(killed), "tiny", keep=[2]) == [4]
    assert sorted(complete_checkpoints(str(killed), "tiny")) == [2, 6]


# --- issue 46: bad inputs that trained silently or failed with a traceback ------------------------


def test_features_without_a_manifest_a_crashed_capture_are_refused(capsys, tiny_target, tiny_features, tmp_path):
    crashed = tmp_path / "crashed"
    shutil.copytree(tiny_features, crashed)
    os.remove(crashed / "manifest.json")
    recipe = write_recipe(str(tmp_path / "r.yaml"), tiny_target, str(crashed), str(tmp_path / "o"))
    err = refused(capsys, recipe)
    assert err.count("\n") == 1 and f"data.hidden_states_path={crashed} has no manifest.json" in err
    assert "--resume" in err
    assert not (tmp_path / "o").exists()


def test_wandb_without_a_login_is_refused_before_training(capsys, recipe, tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    err = refused(capsys, recipe, "tracking.wandb_offline=false")
    assert err.count("\n") == 1 and "`wandb login`" in err and "tracking.report_to=none" in err
    (tmp_path / "no-netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    from specforge_outlets.wandb_report import has_login

    assert has_login()  # what `wandb login` writes is found


def test_a_dataset_too_small_for_the_accumulation_is_one_line_naming_the_fields(recipe):
    # 24 files, batch 4, 4 epochs: 24 micro-batches, not a multiple of 5 (refused inside SpecForge's trainer)
    result = outlets("train", "--config", recipe, "training.accumulation_steps=5", "tracking.report_to=none")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith("outlets train: error: ") and "incomplete gradient accumulation" in err
    assert "training.batch_size" in err and "training.accumulation_steps" in err and "training.max_steps" in err


def test_rerunning_train_on_its_output_directory_resumes_instead_of_overwriting(tiny_target, tiny_features, tmp_path):
    recipe = write_recipe(str(tmp_path / "recipe.yaml"), tiny_target, tiny_features, str(tmp_path),
                          training={"max_steps": 2, "save_interval": 2}, tracking={"report_to": "none"})
    first = outlets("train", "--config", recipe)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    state = tmp_path / "tiny-step2" / "training_state.pt"
    written = state.stat().st_mtime_ns
    again = outlets("train", "--config", recipe)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert state.stat().st_mtime_ns == written  # not trained again from step 0 over it
    assert f"resuming from it (training.resume_from={tmp_path / 'tiny-step2'})" in again.stderr
    changed = outlets("train", "--config", recipe, "training.batch_size=2")
    assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stderr[-3000:]
    err = changed.stderr.strip().splitlines()[-1]
    assert "was written with batch_size=4 but this run has batch_size=2" in err and "another output_dir" in err
