"""`outlets demo --quick` end to end on a tiny chat target (the real demo uses SmolLM2)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from specforge_outlets.data.weight_index import write_weight_index
from specforge_outlets.demo import converged_result
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
    smoke, converged = first.stdout.index("SMOKE RUN"), first.stdout.index("CONVERGED EXPORT, committed")
    assert smoke < converged and "0.637" in first.stdout[converged:]  # the converged export's Spearman, rescored
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


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_stopped_demo_leaves_no_process_behind(tmp_path, signum, exit_code):
    """SIGTERM or Ctrl-C to `outlets demo` during regeneration ends its stage and the stage's llama-server too."""
    command = [sys.executable, "-m", "specforge_outlets.cli", "demo", "--quick", "--output", str(tmp_path / "run")]
    demo = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = []
    try:
        started = started_processes(demo.pid, "llama-server", timeout=120)
        demo.send_signal(signum)
        returncode = demo.wait(timeout=60)
        _, survivors = psutil.wait_procs(started, timeout=15)
        assert not survivors, [process.cmdline()[:5] for process in survivors]
        assert returncode == exit_code
    finally:  # a failing run leaves nothing behind either
        demo.kill()
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def started_processes(pid: int, name: str, timeout: float):
    """Every process below ``pid`` once one named ``name`` is among them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes = psutil.Process(pid).children(recursive=True)
        if any(process.name() == name for process in processes):
            return processes
        time.sleep(0.2)
    raise AssertionError(f"no {name} started below the demo within {timeout:g} s")


def test_the_converged_export_is_rescored_to_its_committed_report():
    """The demo's closing result is computed from the committed predictions and agrees with the committed report."""
    result = converged_result.rescore()
    with open(os.path.join(converged_result.EVAL_DIR, converged_result.REPORT)) as f:
        committed = json.load(f)
    assert result.n_requests == committed["n_requests"] and result.draft == committed["draft"]
    # The record keeps predictions to 0.1 token, so a mean error moves by 0.05 at most.
    for name in converged_result.SHOWN:
        assert result.scores[name]["static_mae"] == pytest.approx(committed["predictors"][name]["static_mae"], abs=0.05)
    outlets = result.scores["outlets"]
    assert outlets["spearman"] == pytest.approx(committed["predictors"]["outlets"]["spearman"], abs=1e-3)
    assert outlets["dynamic_mae"] == pytest.approx(committed["predictors"]["outlets"]["dynamic_mae"], abs=0.05)
    assert converged_result.rescore(os.path.join(ROOT, "no-such-dir")) is None  # an installed package: no record
