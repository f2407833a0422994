"""The typed config: recipes, overrides, the reference's keys, and the CLI's errors (exit 2, one line)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from configs.fields import ConfigError
from configs.load import explain, from_dict, load_config, to_dict
from configs.schema import RootConfig
from core.horizon import HorizonSchedule

ROOT = Path(__file__).resolve().parents[1]


def test_every_field_has_a_docstring():
    rows = explain()
    assert len(rows) > 80
    missing = [key for key, _, doc in rows if not doc]
    assert missing == []


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_recipe_loads(recipe):
    cfg = load_config(ROOT / "configs" / recipe)
    assert isinstance(cfg, RootConfig) and cfg.env.mix


def test_overrides_convert_types_and_replace_dicts():
    cfg = load_config(None, ["env.num_actors=4", "rollout.temperature=0.5", "env.mix={textcraft: 2}",
                             "env.babyai.levels=[GoToRedBall]", "checkpoint.resume=auto"])
    assert cfg.env.num_actors == 4 and cfg.rollout.temperature == 0.5
    assert cfg.env.mix == {"textcraft": 2.0}  # replaced, not merged into the recipe's babyai entry
    assert cfg.env.babyai.levels == ["GoToRedBall"] and cfg.checkpoint.resume == "auto"
    assert load_config(None, ["env.mix.textcraft=0.5"]).env.mix == {"babyai": 1.0, "textcraft": 0.5}


def test_reference_rounds_ctrl_keys_are_accepted_as_written():
    cfg = load_config(None, ["algorithm.rounds_ctrl.type=scaling_inter_stepwise",
                             "algorithm.rounds_ctrl.rounds=[10,20,30]",
                             "algorithm.rounds_ctrl.steps_scaling_inter=100"])
    schedule = HorizonSchedule.from_config(cfg.algorithm)
    assert [schedule.horizon_at(s) for s in (0, 99, 100, 199, 200, 10_000)] == [10, 10, 20, 20, 30, 30]
    fixed = load_config(None, ["algorithm.rounds_ctrl.type=fixed", "algorithm.rounds_ctrl.rounds=15"])
    assert HorizonSchedule.from_config(fixed.algorithm).horizon_at(500) == 15


def test_native_horizon_wins_over_rounds_ctrl():
    cfg = load_config(None, ["algorithm.horizon.turns=[6,13,20]", "algorithm.horizon.boundaries=[5,12]"])
    assert [HorizonSchedule.from_config(cfg.algorithm).horizon_at(s) for s in (0, 4, 5, 11, 12)] == [6, 6, 13, 13, 20]


@pytest.mark.parametrize("override, key", [
    ("no.such.key=1", "no.such.key"),
    ("env.num_actors=-1", "env.num_actors"),
    ("env.num_actors=abc", "env.num_actors"),
    ("env.mix={}", "env.mix"),
    ("env.mix={chess: 1}", "env.mix.chess"),
    ("env.mix.babyai=0", "env.mix.babyai"),
    ("learner.zero_stage=4", "learner.zero_stage"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("algorithm.rounds_ctrl.type=linear", "algorithm.rounds_ctrl.type"),
    ("algorithm.rounds_ctrl.rounds=[10,-20]", "algorithm.rounds_ctrl.rounds"),
    ("algorithm.horizon.turns=[10,20]", "algorithm.horizon.boundaries"),
    ("env.babyai.nope=1", "env.babyai.nope"),
    ("trainer.total_steps", "trainer.total_steps"),
])
def test_invalid_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key


def test_the_kv_cache_may_not_outlive_the_staleness_bound():
    with pytest.raises(ConfigError, match=r"at most trainer.max_staleness \(1\), got 2") as err:
        load_config(None, ["generator.kv_cache_max_age=2"])
    assert err.value.key == "generator.kv_cache_max_age"
    cfg = load_config(None, ["generator.kv_cache_max_age=2", "trainer.max_staleness=2"])
    assert cfg.generator.kv_cache_max_age == 2


@pytest.mark.parametrize("gpus", ["0.5", "1.5", "0.25"])
def test_a_learner_rank_takes_whole_gpus(gpus):
    """Two ranks on one device fail in NCCL ("Duplicate GPU detected"): refused when the config loads."""
    with pytest.raises(ConfigError, match="expected 0 or a whole number >= 1") as err:
        load_config(None, [f"learner.num_gpus_per_rank={gpus}"])
    assert err.value.key == "learner.num_gpus_per_rank"
    assert [load_config(None, [f"learner.num_gpus_per_rank={g}"]).learner.num_gpus_per_rank
            for g in ("0", "1", "2", "8")] == [0, 1, 2, 8]


def test_section_round_trip_for_actors():
    cfg = load_config(None, ["env.slots_per_actor=3"])
    env = from_dict(type(cfg.env), to_dict(cfg.env))
    assert env == cfg.env
    with pytest.raises(ConfigError, match="env|slots"):
        from_dict(type(cfg.env), {**to_dict(cfg.env), "slots_per_actor": 0})


def _blocked_imports(tmp_path: Path) -> dict:
    """An environment in which importing torch, ray or vllm exits the process with code 99."""
    for name in ("torch", "ray", "vllm", "deepspeed"):
        (tmp_path / f"{name}.py").write_text("import sys\nsys.exit(99)\n")
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize("override, key", [("no.such.key=1", "no.such.key"),
                                           ("env.num_actors=-1", "env.num_actors")])
def test_cli_exits_2_naming_the_key_before_heavy_imports(tmp_path, override, key):
    proc = subprocess.run([sys.executable, "-m", "launch.train", override], cwd=ROOT, capture_output=True,
                          text=True, env=_blocked_imports(tmp_path), timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr


def test_cli_print_config_resolves_and_exits_0(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--print-config", "env.num_actors=3"], cwd=ROOT,
                          capture_output=True, text=True, env=_blocked_imports(tmp_path), timeout=30)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["env"]["num_actors"] == 3 and printed["algorithm"]["rounds_ctrl"]["rounds"] == [2, 3, 4]


def test_brief_babyai_prompt_needs_the_lenient_parser():
    from configs.load import load_config

    assert load_config(None, ["env.babyai.prompt=brief"]).env.babyai.prompt == "brief"
    with pytest.raises(ConfigError, match="env.babyai.prompt"):
        load_config(None, ["env.babyai.prompt=brief", "env.babyai.parse_mode=strict"])
