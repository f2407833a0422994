"""The progress bar's estimate covers the whole run: training, then the evaluation after it."""
from __future__ import annotations

from configs.load import load_config
from launch.eval.runner import end_evaluations, eval_specs, eval_turns
from launch.job.progress import Progress, eval_seconds

STEP = {"rollout/turns_mean": 4.0, "rollout/gen_tokens_mean": 40.0, "perf/gen_tokens_per_s": 50.0}


def test_eval_estimate_is_turns_times_tokens_per_turn_over_the_generation_rate():
    assert eval_seconds(600, STEP) == 600 * 10.0 / 50.0
    assert eval_seconds(600, {}) is None and eval_seconds(0, STEP) is None


def test_eval_turns_count_every_episode_at_its_turn_limit():
    cfg = load_config(None, ["eval.limit=5", "eval.samples=2", "eval.max_turns=7"])
    assert eval_turns(cfg) == sum(len(eval_specs(cfg, f)) for f in cfg.eval.envs) * 7 == 5 * 2 * 7


def test_a_second_turn_limit_is_a_second_evaluation_of_the_same_items_in_its_own_folder():
    cfg = load_config(None, ["eval.limit=5", "eval.max_turns=4", "eval.long_max_turns=20"])
    (short, first), (long, second) = end_evaluations(cfg)
    assert (first, second) == ("eval", "eval-20-turns") and short is cfg
    assert [s.horizon for s in eval_specs(long, "babyai")] == [20] * 5
    assert [s.item_id for s in eval_specs(long, "babyai")] == [s.item_id for s in eval_specs(cfg, "babyai")]
    assert sum(eval_turns(c) for c, _ in end_evaluations(cfg)) == 5 * 4 + 5 * 20
    default = load_config(None, [])
    assert [folder for _, folder in end_evaluations(default)] == ["eval", "eval-20-turns"]
    assert [folder for _, folder in end_evaluations(load_config(None, ["eval.long_max_turns=0"]))] == ["eval"]


def test_the_bar_shows_the_evaluation_after_training(capsys):
    bar = Progress(10, eval_turns=600)
    bar.update(1, STEP)
    bar.bar.refresh()
    bar.close()
    assert "then eval <= 2 min" in capsys.readouterr().err


def test_the_estimate_uses_the_recent_steps_rate_not_the_runs_mean(capsys):
    """Ten steps of 1 s then five of 10 s: the steps left are priced at 10 s each, as the recent steps ran."""
    from launch.job.progress import RECENT, eta_seconds

    bar = Progress(100, enabled=False)
    bar.recent.clear()
    now = 0.0
    for step in range(1, 16):
        now += 1.0 if step <= 10 else 10.0
        bar.update(step, STEP, now=now)
    assert len(bar.recent) == RECENT + 1 and eta_seconds(bar.recent, 100) == (100 - 15) * 10.0
    shown = Progress(20)
    shown.recent.clear()
    for step, t in ((1, 0.0), (2, 30.0), (3, 60.0)):
        shown.update(step, {**STEP, "perf/rss_mb/learner0": 2048.0, "perf/rss_mb/driver": 512.0}, now=t)
    shown.bar.refresh()
    shown.close()
    err = capsys.readouterr().err
    assert "eta 8:30 at the last 2 steps' rate" in err and "rss<= 2.0 GB" in err  # 17 steps left at 30 s
