"""`python -m launch.results default` end to end on the tiny model (it trains, evaluates at both turn limits with
the baselines, and writes the page and the curve), and the verdict it reads off the numbers."""
from __future__ import annotations

import subprocess
import sys

import pytest

from launch.results import verdict
from tests.training_runs import ROOT, TINY_RECIPE


def test_the_verdict_asks_for_the_margin_overall_no_level_worse_and_no_loss_at_the_long_limit():
    short = {"model": {"all": 0.70, "a": 0.9, "b": 0.5}, "random": {"all": 0.40, "a": 0.4, "b": 0.4}}
    long = {"model": {"all": 0.80}, "random": {"all": 0.85}}
    lines = verdict(short, long, 0.25)
    assert "beats the random policy by 0.25 overall: 0.700 vs 0.400 (+0.300)" in lines[0]
    assert lines[1] == "It is no worse than random on any level."
    assert "worse than random overall: 0.800 vs 0.850 (-0.050)" in lines[2]
    short["model"]["b"] = 0.3
    lines = verdict(short, {"model": {"all": 0.9}, "random": {"all": 0.9}}, 0.35)
    assert "does not beat" in lines[0] and lines[1] == "It is worse than random on b." and "no worse than" in lines[2]


@pytest.mark.slow
def test_the_results_command_trains_evaluates_both_limits_and_writes_the_page(tiny_model_dir, tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "launch.results", "default", "--config", str(TINY_RECIPE), "--runs",
           str(tmp_path / "run"), "--out", str(out), "--long-turns", "4", "--eval-limit", "1",
           f"model.path={tiny_model_dir}", "logging.wandb_mode=disabled", "trainer.total_steps=1"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # both limits were evaluated by the run itself (eval.long_max_turns), its base weights at each before step 1
    assert "evaluating at" not in run.stdout
    for folder in ("eval", "eval-4-turns"):
        assert (tmp_path / "run" / folder / "untrained.json").is_file(), folder
        assert (tmp_path / "run" / folder / "episodes.jsonl").stat().st_size > 0, folder
    text = (out / "default.md").read_text()
    for needle in ("## At the last training horizon (2 turns)", "## At the reference's turn limit (4 turns)",
                   "| trained policy |", "| untrained model |", "| random policy |", "GoToRedBallGrey",
                   "## Reading", "training.png"):
        assert needle in text, needle
    assert text.count("| random policy |") == 2
    assert (out / "training.png").stat().st_size > 1000
    # --reuse: nothing is trained or evaluated again, and the page is written anew from the same reports.
    (out / "default.md").unlink()
    again = subprocess.run(cmd + ["--reuse"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "reusing the finished run" in again.stdout and "training " not in again.stdout
    assert "evaluating" not in again.stdout
    assert (out / "default.md").read_text().split("## At")[1:] == text.split("## At")[1:]
