"""The eval report (model, untrained and random rows with 95% intervals) and the unseen BabyAI item set."""
from __future__ import annotations

import json

import numpy as np
import pytest

from configs.load import load_config
from core.stats import wilson_interval
from core.trajectory import Termination, Trajectory
from environments.babyai.levels import level_and_seed
from environments.item_sampler import family_items
from launch.eval.report import summarize, summary, write_report
from launch.eval.runner import eval_items, eval_specs, items_description


def _traj(item: str, success: bool, k: int = 0) -> Trajectory:
    return Trajectory(trajectory_id=f"eval-{item}.s{k}", group_id=f"eval-{item}", item_id=item, env="babyai",
                      tokens=np.arange(4, dtype=np.int32), loss_mask=np.array([0, 0, 1, 1], np.uint8),
                      logprobs=np.zeros(4, np.float32), versions=np.array([-1, -1, 0, 0], np.int32),
                      turn_ends=np.array([4], np.int32), turn_rewards=np.ones(1, np.float32), horizon=5,
                      termination=Termination.DONE if success else Termination.HORIZON,
                      metrics={"success": float(success), "env_reward": 0.8 if success else 0.0,
                               "valid_actions": 1.0, "judged_turns": 1.0})


def _rows() -> dict[str, list[dict]]:
    items = [f"babyai_{n}" for n in (0, 1, 40, 41, 80, 81)]  # GoToRedBallGrey and GoToRedBall, 3 seeds each
    wins = {"model": 5, "untrained": 1, "random": 3}
    return {name: [summarize("babyai", [_traj(i, k < won) for k, i in enumerate(items)])]
            for name, won in wins.items()}


def _report() -> dict:
    return {"model": "run-x after 30 steps", "split": "test", "item_set": "split", "items": "split `test`",
            "samples": 1, "temperature": 0.0, "minutes": 1.5, "rows": _rows(),
            "policies": {"model": "run-x after 30 steps", "untrained": "models/base", "random": "uniform"},
            "notes": ["no random row for sciworld: its observations list no actions"], "skipped": {}}


def test_summarize_gives_wilson_intervals_overall_and_per_level():
    fam = _rows()["model"][0]
    assert fam["success_rate"] == pytest.approx(5 / 6)
    assert fam["success_rate_ci"] == pytest.approx(list(wilson_interval(5, 6)))
    assert fam["score_ci"] == pytest.approx(list(wilson_interval(5 * 0.8, 6)))
    level = fam["breakdown"]["GoToRedBall"]  # babyai_1, 41, 81: the 2nd, 4th and 6th item; wins on the first five
    assert level["episodes"] == 3 and level["success_rate_ci"] == pytest.approx(list(wilson_interval(2, 3)))


def test_report_json_and_markdown_carry_every_row_with_intervals(tmp_path):
    json_path, md_path = write_report(_report(), tmp_path)
    saved = json.loads(json_path.read_text())
    assert set(saved["rows"]) == {"model", "untrained", "random"}
    for name, won in (("model", 5), ("untrained", 1), ("random", 3)):
        fam = saved["rows"][name][0]
        assert fam["success_rate_ci"] == pytest.approx(list(wilson_interval(won, 6)))
        assert set(fam["breakdown"]) == {"GoToRedBallGrey", "GoToRedBall"}
    md = md_path.read_text()
    low, high = wilson_interval(1, 6)
    assert f"| babyai | untrained | 6 | {1 / 6:.3f} [{low:.2f}, {high:.2f}] |" in md
    for name in ("model", "untrained", "random"):
        assert f"| GoToRedBall | {name} | 3 |" in md and f"| babyai | {name} | 6 |" in md
    assert md.index("| babyai | model |") < md.index("| babyai | untrained |") < md.index("| babyai | random |")
    assert "`untrained`: models/base" in md and "Note: no random row for sciworld" in md
    short = summary(saved).splitlines()
    assert len(short) == 2 and all(n in short[1] for n in ("model 0.833", "untrained 0.167", "random 0.500"))


def test_report_without_an_untrained_row_says_why(tmp_path):
    report = _report()
    del report["rows"]["untrained"], report["policies"]["untrained"]
    report["notes"] = ["no untrained row: the base model is not known (give --baseline-model)"]
    _, md_path = write_report(report, tmp_path)
    md = md_path.read_text()
    assert "| babyai | untrained |" not in md and "Note: no untrained row" in md


def test_unseen_items_are_in_no_split_and_only_of_the_run_levels():
    cfg = load_config(None, ["eval.item_set=unseen"])
    levels = set(cfg.env.babyai.levels)
    assert len(levels) == 3
    items = eval_items(cfg, "babyai")
    assert len(items) == 90 and len(set(items)) == 90
    split_ids = {i for s in ("train", "test") for i in family_items("babyai", cfg.env.__class__(), s)}
    assert len(split_ids) == 900 and not split_ids & set(items)
    assert {level_and_seed(i)[0] for i in items} == levels
    seeds = [level_and_seed(i)[1] for i in items]
    assert min(seeds) == 23 and max(seeds) == 52  # 30 seeds of each level, past the 900 split ids
    assert eval_items(cfg, "babyai") == items  # deterministic
    limited = load_config(None, ["eval.item_set=unseen", "eval.limit=6"])
    assert eval_items(limited, "babyai") == items[:6]  # a prefix: two seeds of each level
    assert [s.item_id for s in eval_specs(limited, "babyai")] == items[:6]
    assert "unseen" in items_description(cfg)


def test_unseen_is_refused_for_a_family_without_unseen_items():
    cfg = load_config(None, ["eval.item_set=unseen", "eval.envs=[textcraft]"])
    with pytest.raises(ValueError, match="textcraft"):
        eval_items(cfg, "textcraft")


def test_launch_eval_refuses_random_for_families_that_list_no_actions(capsys):
    from launch.eval.command import main

    assert main(["--policy", "random", "--env", "webarena"]) == 2
    err = capsys.readouterr().err
    assert "--policy random" in err and "webarena" in err and "list" in err
    assert main(["--policy", "random", "--env", "babyai,searchqa"]) == 2
    assert "searchqa" in capsys.readouterr().err


def test_a_checkpoint_names_its_run_base_model(tmp_path):
    from launch.eval.command import run_base_model

    step = tmp_path / "run" / "checkpoints" / "step_00000030"
    step.mkdir(parents=True)
    assert run_base_model(str(step)) == ""
    (tmp_path / "run" / "model.json").write_text(json.dumps({"base": "models/base"}))
    assert run_base_model(str(step)) == "models/base"
    assert run_base_model(str(step.parent)) == "models/base"
    assert run_base_model(str(tmp_path / "elsewhere")) == ""


def test_a_run_reuses_its_untrained_rows_only_when_measured_on_the_same_items(tmp_path):
    """The session method alone, on a stand-in for the session: no roles are needed on these paths."""
    from types import SimpleNamespace

    from launch.job.session import TrainingSession

    def rows_of(overrides, resume_from):
        cfg = load_config(None, ["eval.limit=3", "eval.long_max_turns=0", *overrides])  # one limit: eval/
        run = SimpleNamespace(cfg=cfg, out=tmp_path, resume_from=resume_from, roles=None)
        run._untrained_at = lambda cfg, out: TrainingSession._untrained_at(run, cfg, out)
        return TrainingSession._untrained_rows(run)

    assert rows_of(["eval.baselines=false"], None) == ({}, [])
    assert rows_of(["eval.at_end=false"], None) == ({}, [])
    rows, notes = rows_of([], tmp_path / "checkpoints" / "step_00000002")  # resumed, nothing measured
    assert rows == {"eval": None} and "no untrained row" in notes[0]
    # what a fresh start measured, as it stores it
    from core.checkpoint import write_json
    from launch.eval.runner import measured_on

    (tmp_path / "eval").mkdir()
    write_json(tmp_path / "eval" / "untrained.json",
               {"rows": _rows()["untrained"], "measured_on": measured_on(load_config(None, ["eval.limit=3"]))})
    assert rows_of([], tmp_path / "checkpoints" / "step_00000002") == ({"eval": _rows()["untrained"]}, [])
    rows, notes = rows_of(["eval.limit=5"], tmp_path / "checkpoints" / "step_00000002")  # other items
    assert rows == {"eval": None} and notes
    # a second turn limit has rows of its own, in its own folder: those at the first limit are not taken for them
    rows, notes = rows_of(["eval.long_max_turns=20"], tmp_path / "checkpoints" / "step_00000002")
    assert rows == {"eval": _rows()["untrained"], "eval-20-turns": None} and len(notes) == 1


def test_saved_untrained_rows_survive_a_limit_added_later_at_its_default_but_not_another_measure():
    import dataclasses
    import json

    from launch.eval.runner import eval_limits, measured_on, same_measure

    cfg = load_config(None, ["eval.limit=3"])
    now = measured_on(cfg)
    saved = json.loads(json.dumps(now))
    assert same_measure(saved, now)
    older = json.loads(json.dumps(now))  # a record written before a field existed: its default stands for it
    del older["limits"]["format_reward_per"]
    assert same_measure(older, now)
    positional = {**older, "limits": list(dataclasses.astuple(eval_limits(cfg)))}  # records of earlier versions
    assert same_measure(json.loads(json.dumps(positional)), now)
    assert not same_measure({**saved, "limits": {**saved["limits"], "temperature": 0.7}}, now)
    assert not same_measure({**saved, "limits": {**saved["limits"], "gone": 1}}, now)  # a field no longer known
    assert not same_measure({**saved, "limits": saved["limits"] and [1, 2]}, now)  # a list of another length
    assert not same_measure(measured_on(load_config(None, ["eval.limit=4"])), now)  # other items
    assert not same_measure(None, now) and not same_measure({}, now)
    hotter = measured_on(load_config(None, ["eval.limit=3", "eval.temperature=0.5"]))
    assert not same_measure(saved, hotter)


def test_launch_eval_split_flag_evaluates_that_split_even_where_the_config_asks_for_unseen_items():
    from launch.eval.command import build_parser, flag_overrides

    def item_set(*flags):
        return load_config(None, flag_overrides(build_parser().parse_args(list(flags)))).eval.item_set

    assert item_set() == "unseen"  # the default's end-of-run evaluation
    assert item_set("--split", "test") == "split"
    assert item_set("--split", "test", "--items", "unseen") == "unseen"
    assert item_set("--items", "split") == "split"
