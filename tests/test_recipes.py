"""The recipes under configs/recipes/: each loads through the CLI's own parsing, fits one node of 8 GPUs and 96 CPUs,
follows its variant's turn schedule, and (on GPUs) is bf16, compiled, and checkpoints activations.

Recipes are found by glob, so a new one is covered without touching this file.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from configs.load import config_warnings, gpu_settings
from core.horizon import HorizonSchedule
from core.models import ModelPathError, resolve_model
from launch.job.cli import parse
from launch.job.roles import resource_request

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.yaml"))
CPU_RECIPES = sorted((ROOT / "configs" / "recipes" / "cpu").glob("*.yaml"))
NODE = {"CPU": 96.0, "GPU": 8.0}
VARIANTS = ("fixed", "scaling_inter")


def load(recipe: Path):
    cfg, _ = parse(["--config", str(recipe)], "launch.train", "")
    return cfg


def family_and_variant(recipe: Path) -> tuple[str, str]:
    for variant in VARIANTS:
        if recipe.stem.endswith(f"_{variant}"):
            return recipe.stem[: -len(variant) - 1], variant
    raise AssertionError(f"{recipe.name}: expected a name <family>_<variant> with a variant among {VARIANTS}")


def test_the_recipes_cover_every_family_both_ways():
    assert len(RECIPES) >= 8
    found = {family_and_variant(r) for r in RECIPES}
    for family in ("babyai", "sciworld", "textcraft", "searchqa", "webarena"):
        assert {(family, v) for v in VARIANTS} <= found, family


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_without_warnings_and_trains_its_family(recipe, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.config"):
        cfg = load(recipe)
    assert caplog.records == [] and config_warnings(cfg) == []
    family, _ = family_and_variant(recipe)
    assert list(cfg.env.mix) == [family] and cfg.eval.envs == [family]
    assert cfg.trainer.output_dir.endswith(recipe.stem)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_fits_one_node_of_8_gpus(recipe):
    asked = resource_request(load(recipe))
    over = {k: v for k, v in asked.items() if v > NODE.get(k, 0.0)}
    assert over == {}, f"{recipe.name} asks for {asked}, more than the node's {NODE}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_horizon_grows_for_scaling_inter_and_stays_for_fixed(recipe):
    cfg = load(recipe)
    schedule = HorizonSchedule.from_config(cfg.algorithm)
    _, variant = family_and_variant(recipe)
    if variant == "fixed":
        assert len(schedule.turns) == 1
        assert schedule.horizon_at(0) == schedule.horizon_at(cfg.trainer.total_steps - 1)
    else:
        assert len(schedule.turns) >= 2
        assert all(a < b for a, b in zip(schedule.turns, schedule.turns[1:])), schedule.turns
        # every stage is reached before the run ends
        assert schedule.boundaries[-1] < cfg.trainer.total_steps
        assert schedule.horizon_at(cfg.trainer.total_steps - 1) == schedule.max_horizon


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_batch_shape_is_whole(recipe):
    cfg = load(recipe)
    # mini-batches are counted in whole item groups, as the reference counts them
    assert cfg.trainer.groups_per_step % cfg.learner.mini_batches == 0
    # the longest episode fits one micro-batch
    assert cfg.learner.micro_batch_tokens >= cfg.rollout.max_context_tokens


def gpu_recipes() -> list[Path]:
    return [r for r in RECIPES if gpu_settings(load(r))]


def test_at_least_8_recipes_are_for_gpus():
    assert len(gpu_recipes()) >= 8


@pytest.mark.parametrize("recipe", gpu_recipes(), ids=lambda p: p.stem)
def test_gpu_recipe_is_bf16_compiled_and_checkpoints_activations(recipe):
    cfg = load(recipe)
    assert cfg.model.dtype == "bfloat16"
    assert cfg.generator.device == "cuda" and cfg.generator.enforce_eager is False
    assert cfg.learner.num_gpus_per_rank >= 1 and cfg.learner.gradient_checkpointing is True


@pytest.mark.parametrize("recipe", gpu_recipes(), ids=lambda p: p.stem)
def test_gpu_recipe_model_is_never_fetched_silently(recipe):
    """The model is a local folder: where it is missing, the run stops at start naming model.path."""
    path = load(recipe).model.path
    assert path != "default" and path.startswith("/")
    if (Path(path) / "config.json").is_file():
        pytest.skip(f"{path} exists on this machine")
    with pytest.raises(ModelPathError, match="model.path"):
        resolve_model(path)


def test_the_recipes_page_lists_every_recipe():
    page = (ROOT / "docs" / "recipes.md").read_text()
    missing = [r.name for r in RECIPES if f"configs/recipes/{r.name}" not in page]
    missing += [r.name for r in CPU_RECIPES if f"configs/recipes/cpu/{r.name}" not in page]
    assert missing == []


@pytest.mark.parametrize("recipe", CPU_RECIPES, ids=lambda p: p.stem)
def test_cpu_recipe_loads_without_warnings_and_fits_two_cores(recipe, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.config"):
        cfg = load(recipe)
    assert caplog.records == [] and gpu_settings(cfg) == []
    asked = resource_request(cfg)
    assert asked.get("GPU", 0.0) == 0 and asked["CPU"] <= 2.0, asked
    assert cfg.trainer.output_dir.endswith(recipe.stem)
