"""`outlets demo --quick` end to end on a tiny chat target (the real demo uses SmolLM2)."""

import json
import os
import subprocess
import sys

import yaml

from specforge_outlets.data.weight_index import write_weight_index
from specforge_outlets.model.tiny_chat_target import make_chat_target
from tests.tiny_target import write_draft_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_recipe(tmp_path, target):
    write_draft_config(target, str(tmp_path / "draft.json"))
    with open(os.path.join(ROOT, "recipes", "smollm2-135m-cpu-outlets.yaml")) as f:
        recipe = yaml.safe_load(f)
    recipe["model"].update(draft_model_config=str(tmp_path / "draft.json"), lm_head_key="lm_head.weight")
    recipe["data"]["max_length"] = 256
    recipe["training"].update(learning_rate=0.01, batch_size=4)
    recipe["outlets"].pop("fusion_layers")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return str(tmp_path / "recipe.yaml")


def test_quick_demo_runs_every_stage_and_reuses_them(tmp_path):
    target = make_chat_target(str(tmp_path / "target"), end_bias=4.0)
    write_weight_index(target)
    recipe = tiny_recipe(tmp_path, target)
    command = [sys.executable, "-m", "specforge_outlets.cli", "demo", "--quick", "--target", target,
               "--recipe", recipe, "--output", str(tmp_path / "run")]
    env = {**os.environ, "WANDB_MODE": "offline"}
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert "regenerating with the hf backend" in first.stdout  # a Hugging Face directory: not a GGUF target
    stages = os.listdir(tmp_path / "run" / "stages")
    assert sorted(name.rsplit("-", 1)[0] for name in stages) == [
        "capture", "eval", "prepare", "regenerate", "simulate", "train_outlets"]
    report_dir = next(tmp_path.glob("run/stages/eval-*/report"))
    with open(report_dir / "report.json") as f:
        report = json.load(f)
    assert "outlets" in report["predictors"] and "constant" in report["predictors"]
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0
    assert second.stdout.count("cached") == len(stages)
