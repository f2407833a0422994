"""The progress bar's estimate covers the whole run: training, then the evaluation after it."""
from __future__ import annotations

from configs.load import load_config
from launch.evaluate import eval_specs, eval_turns
from launch.progress import Progress, eval_seconds

STEP = {"rollout/turns_mean": 4.0, "rollout/gen_tokens_mean": 40.0, "perf/gen_tokens_per_s": 50.0}


def test_eval_estimate_is_turns_times_tokens_per_turn_over_the_generation_rate():
    assert eval_seconds(600, STEP) == 600 * 10.0 / 50.0
    assert eval_seconds(600, {}) is None and eval_seconds(0, STEP) is None


def test_eval_turns_count_every_episode_at_its_turn_limit():
    cfg = load_config(None, ["eval.limit=5", "eval.samples=2", "eval.max_turns=7"])
    assert eval_turns(cfg) == sum(len(eval_specs(cfg, f)) for f in cfg.eval.envs) * 7 == 5 * 2 * 7


def test_the_bar_shows_the_evaluation_after_training(capsys):
    bar = Progress(10, eval_turns=600)
    bar.update(1, STEP)
    bar.bar.refresh()
    bar.close()
    assert "then eval <= 2 min" in capsys.readouterr().err
