"""Every shipped recipe validates against SpecForge's schema and the method's settings."""

import glob
import json
import os

import pytest

from specforge_outlets.errors import OutletsError
from specforge_outlets.training.recipe import load_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(glob.glob(os.path.join(ROOT, "recipes", "*-outlets.yaml")))


def test_the_promised_recipes_exist():
    names = {os.path.basename(path) for path in RECIPES}
    assert {"llama3.2-1b-outlets.yaml", "llama3.1-8b-outlets.yaml", "qwen3-30b-a3b-outlets.yaml",
            "smollm2-135m-cpu-outlets.yaml"} <= names


@pytest.mark.parametrize("path", [p for p in RECIPES if "cpu" not in p], ids=os.path.basename)
def test_gpu_recipes_follow_the_method(path):
    recipe = load_recipe(path)
    training = recipe.config.training
    assert training.strategy == "eagle3-outlets"
    assert training.num_epochs <= 10 and training.seed == 0
    assert recipe.settings.length_loss_weight == 0.1 and recipe.settings.length_l2_weight == 1e-5
    draft = recipe.config.model.draft_model_config
    if draft:
        with open(os.path.join(ROOT, draft)) as f:
            assert json.load(f)["architectures"] == ["OutletsLlamaForCausalLMEagle3"]


def test_the_target_alias_resolves_in_the_recipe_and_on_the_command_line(monkeypatch, tmp_path):
    import specforge_outlets.data.targets as targets

    converted = tmp_path / "smollm2"
    converted.mkdir()
    monkeypatch.setattr(targets, "ensure_smollm2", lambda: converted)
    cpu = os.path.join(ROOT, "recipes", "smollm2-135m-cpu-outlets.yaml")
    assert load_recipe(cpu).config.model.target_model_path == str(converted)
    other = tmp_path / "other"
    other.mkdir()
    recipe = load_recipe(cpu, [f"model.target_model_path={other}"])
    assert recipe.config.model.target_model_path == str(other)
    recipe = load_recipe(cpu, [f"model.target_model_path={other}", "model.target_model_path=smollm2-135m"])
    assert recipe.config.model.target_model_path == str(converted)


def test_cpu_recipe_trains_the_head_with_the_defaults_and_the_old_setup_stays_reachable():
    from specforge_outlets.training.settings import OutletsSettings

    cpu = os.path.join(ROOT, "recipes", "smollm2-135m-cpu-outlets.yaml")
    # the head at the draft's rate on the CPU (1e-3, as the GPU recipes' 1e-4 x the default scale 10)
    assert load_recipe(cpu).settings == OutletsSettings(length_loss_weight=0.1, length_l2_weight=1e-5,
                                                        fusion_layers=(2, 15, 28), length_head_lr_scale=1.0)
    old = load_recipe(cpu, ["outlets.length_weighting=pooled", "outlets.length_static_weight=0",
                            "outlets.length_ttt_decay=1", "outlets.length_bias_init=zero",
                            "outlets.length_head_lr_scale=1"]).settings
    assert (old.length_weighting, old.length_static_weight, old.length_ttt_decay, old.length_bias_init,
            old.length_head_lr_scale) == ("pooled", 0.0, 1.0, "zero", 1.0)
    with pytest.raises(OutletsError, match="outlets.length_weighting"):
        load_recipe(cpu, ["outlets.length_weighting=tokens"])


def test_the_label_set_drafts_and_variants_change_the_setting_they_name(monkeypatch, tmp_path):
    import specforge_outlets.data.targets as targets
    from specforge_outlets.model.draft_config import HeadInput, TargetFeatures
    from specforge_outlets.studies.label_set_drafts import DRAFTS, RECIPE, VARIANTS

    monkeypatch.setattr(targets, "ensure_smollm2", lambda: tmp_path)
    base = load_recipe(RECIPE)
    loaded = {name: load_recipe(RECIPE, list(overrides)) for name, overrides in {**DRAFTS, **VARIANTS}.items()}
    assert loaded["outlets"].settings == base.settings
    assert loaded["sd-only"].settings.length_loss_weight == 0 and loaded["lp-only"].settings.sd_loss_weight == 0
    assert loaded["float32"].config.model.torch_dtype == "float32" != base.config.model.torch_dtype
    assert (loaded["head-lr-1x"].settings.length_head_lr_scale, loaded["head-lr-10x"].settings.length_head_lr_scale) == (1, 10)
    assert base.settings.gated_attention and not loaded["plain-attention"].settings.gated_attention
    assert loaded["head-on-fused"].settings.head_input == HeadInput.FUSED != base.settings.head_input
    assert loaded["last-layer"].settings.target_features == TargetFeatures.LAST_LAYER != base.settings.target_features


def test_outlets_recipes_lists_every_shipped_recipe_and_a_name_or_checkout_path_resolves_anywhere(monkeypatch, tmp_path,
                                                                                                  capsys):
    from specforge_outlets import resources
    from specforge_outlets.cli import main

    assert main(["recipes"]) == 0
    listed = capsys.readouterr().out
    for path in glob.glob(os.path.join(ROOT, "recipes", "*.yaml")):
        name = os.path.basename(path)[: -len(".yaml")]
        line = next(line for line in listed.splitlines() if line.split()[:1] == [name])
        assert line.rstrip().endswith(path) and ("outlets train" in line) == ("outlets:" in open(path).read())

    monkeypatch.chdir(tmp_path)  # no recipes/ here
    shipped = os.path.join(ROOT, "recipes", "llama3.1-8b-outlets.yaml")
    for given in ("llama3.1-8b-outlets", "llama3.1-8b-outlets.yaml", "recipes/llama3.1-8b-outlets.yaml"):
        assert resources.resolve_recipe(given) == shipped
    assert load_recipe("llama3.2-1b-outlets").config.training.strategy == "eagle3-outlets"
    with pytest.raises(OutletsError, match=r"recipe llama-99b does not exist; the shipped recipes are in .*recipes "
                                           r"\(list them: outlets recipes"):
        load_recipe("llama-99b")


def test_outlets_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    from specforge_outlets.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"outlets {version('specforge-outlets')}"
