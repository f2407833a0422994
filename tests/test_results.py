"""`python -m launch.results default` end to end on the tiny model (it trains, evaluates at both turn limits with
the baselines, and writes the page and the curve), and the verdict it reads off the numbers."""
from __future__ import annotations

import subprocess
import sys

import pytest

from launch.results import reuse_untrained, used_untrained_from, verdict
from tests.training_runs import ROOT, TINY_RECIPE


def test_the_verdict_reads_the_margin_the_long_limit_each_level_and_the_extra_turns():
    short = {"model": {"all": 0.70, "a": 0.9, "b": 0.5}, "random": {"all": 0.40, "a": 0.4, "b": 0.4}}
    long = {"model": {"all": 0.80, "a": 0.9, "b": 0.7}, "random": {"all": 0.85, "a": 0.95, "b": 0.75}}
    lines = verdict(short, long, 0.25)
    assert "beats the random policy by 0.25 overall: 0.700 vs 0.400 (+0.300)" in lines[0]
    assert "worse than random overall: 0.800 vs 0.850 (-0.050)" in lines[1]
    assert lines[2] == "No level is more than 0.05 below random at the long limit."  # 0.05 below is allowed
    assert lines[3].startswith("It uses the extra turns: 0.800")
    long["model"].update(all=0.7, b=0.6)
    lines = verdict(short, long, 0.35)
    assert "does not beat" in lines[0] and lines[2].endswith("b (0.600 vs 0.750).")
    assert lines[3].startswith("It does not use the extra turns")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a run and four evaluations: 600 s on a loaded 2-core CI (default 900)
def test_the_results_command_trains_evaluates_both_limits_and_writes_the_page(tiny_model_dir, tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "launch.results", "default", "--config", str(TINY_RECIPE), "--runs",
           str(tmp_path / "run"), "--out", str(out), "--long-turns", "4", "--eval-limit", "1",
           f"model.path={tiny_model_dir}", "logging.wandb_mode=disabled", "trainer.total_steps=1"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
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
    # --untrained-from: a second seed takes the first run's untrained rows instead of evaluating the base
    # model
    moved = {str(tmp_path / "run"): str(tmp_path / "run2"), str(out): str(tmp_path / "out2")}
    second = [moved.get(a, a) for a in cmd]
    other = subprocess.run(second + ["trainer.seed=1", "--untrained-from", str(tmp_path / "run")],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    for folder in ("eval", "eval-4-turns"):
        kept = (tmp_path / "run2" / folder / "untrained.json").read_bytes()
        assert kept == (tmp_path / "run" / folder / "untrained.json").read_bytes(), folder
    assert "evaluating the base model" not in (tmp_path / "run2" / "train.log").read_text()
    assert "rows are those measured by the run in" in (tmp_path / "out2" / "default.md").read_text()


def test_untrained_rows_from_a_run_that_has_none_are_refused_by_name(tmp_path):
    (tmp_path / "src" / "eval").mkdir(parents=True)
    (tmp_path / "src" / "eval" / "untrained.json").write_text('{"rows": [], "measured_on": {}}')
    with pytest.raises(FileNotFoundError, match="eval-20-turns/untrained.json"):
        reuse_untrained(tmp_path / "src", tmp_path / "run", ["eval", "eval-20-turns"])
    # the page says the rows were borrowed only while the run still holds them unchanged in every folder
    reuse_untrained(tmp_path / "src", tmp_path / "run", ["eval"])
    assert used_untrained_from(tmp_path / "src", tmp_path / "run", ["eval"])
    assert not used_untrained_from(tmp_path / "src", tmp_path / "run", ["eval", "eval-20-turns"])  # not there
    (tmp_path / "run" / "eval" / "untrained.json").write_text('{"rows": []}')  # measured its own
    assert not used_untrained_from(tmp_path / "src", tmp_path / "run", ["eval"])
    for garbage, why in (("{\"rows\": [", "is not JSON"), ("[1, 2]", "holds no untrained rows")):
        (tmp_path / "src" / "eval" / "untrained.json").write_text(garbage)
        with pytest.raises(ValueError, match=why):
            reuse_untrained(tmp_path / "src", tmp_path / "run", ["eval"])
