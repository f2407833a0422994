"""The horizon ablation: its schedules, its reading of the numbers, and the command end to end on the tiny model
(each variant trains and evaluates for real; the fixed ones stop at the ScalingInter-RL run's trained turns)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from core.metrics import read_jsonl
from launch.ablate import stage_schedule
from launch.ablate_report import reading
from tests.training_runs import ROOT, TINY_RECIPE


@pytest.mark.parametrize("short, long, stages, steps, want", [
    (2, 6, 3, 24, ([2, 4, 6], [8, 16])),
    (10, 30, 3, 300, ([10, 20, 30], [100, 200])),
    (2, 3, 2, 2, ([2, 3], [1])),
    (2, 6, 3, 1, ([2], [])),  # one step holds one stage
    (2, 3, 5, 40, ([2, 3], [20])),  # no more stages than turn limits between short and long
])
def test_stage_schedule_grows_from_short_to_long(short, long, stages, steps, want):
    assert stage_schedule(short, long, stages, steps) == want


def test_the_reading_names_the_ordering_and_whether_the_seeds_separate_it():
    apart = reading({"scaling": 0.8, "fixed_short": 0.5, "fixed_long": 0.3},
                    {"scaling": (0.75, 0.85), "fixed_short": (0.45, 0.55), "fixed_long": (0.2, 0.4)}, 2)
    assert apart[0].startswith("Ordering of the mean final success rate: ScalingInter-RL (0.800) > fixed short")
    assert "holds, with every seed" in apart[-1]
    mixed = reading({"scaling": 0.6, "fixed_short": 0.5, "fixed_long": 0.3},
                    {"scaling": (0.4, 0.8), "fixed_short": (0.45, 0.55), "fixed_long": (0.2, 0.4)}, 2)
    assert "holds in the means, but not beyond the seed-to-seed spread" in mixed[-1]
    assert "overlap (largest" in mixed[1]
    worse = reading({"scaling": 0.2, "fixed_short": 0.5, "fixed_long": 0.3},
                    {"scaling": (0.2, 0.2), "fixed_short": (0.5, 0.5), "fixed_long": (0.3, 0.3)}, 1)
    assert "does not hold here" in worse[-2] and "single draw" in worse[-1]


def test_the_ablation_command_runs_every_variant_at_equal_turns_and_writes_its_report(tiny_model_dir, tmp_path):
    report = tmp_path / "results" / "horizon.md"
    cmd = [sys.executable, "-m", "launch.ablate", "horizon", "--config", str(TINY_RECIPE), "--short", "2",
           "--long", "3", "--stages", "2", "--steps", "2", "--seeds", "0", "--eval-limit", "1",
           "--runs", str(tmp_path / "runs"), "--report", str(report),
           f"model.path={tiny_model_dir}", "logging.wandb_mode=disabled", "env.slots_per_actor=8"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    totals = {}
    for variant in ("scaling", "fixed_short", "fixed_long"):
        rows = [r for r in read_jsonl(tmp_path / "runs" / f"{variant}-s0" / "metrics.jsonl")
                if "rollout/trained_turns_total" in r]
        assert rows, variant
        totals[variant] = rows[-1]["rollout/trained_turns_total"]
        horizons = {r["rollout/horizon"] for r in rows}
        want = {"scaling": {2.0, 3.0}, "fixed_short": {2.0}, "fixed_long": {3.0}}[variant]
        assert horizons <= want and (variant == "scaling" or horizons == want), (variant, horizons)
    # Each fixed run stopped on the first step that reached the scaling run's turns, not later.
    for variant in ("fixed_short", "fixed_long"):
        rows = [r for r in read_jsonl(tmp_path / "runs" / f"{variant}-s0" / "metrics.jsonl")
                if "rollout/trained_turns_total" in r]
        assert totals[variant] >= totals["scaling"], (variant, totals)
        assert len(rows) == 1 or rows[-2]["rollout/trained_turns_total"] < totals["scaling"], (variant, rows)
    text = report.read_text()
    for needle in ("| ScalingInter-RL | 0 |", "| fixed short | 0 |", "| fixed long | 0 |", "random policy",
                   "untrained model", "## Reading", "horizon.png"):
        assert needle in text, needle
    assert (report.parent / "horizon.png").stat().st_size > 10_000
    # --reuse: the finished runs are kept, nothing is trained again, and the report is written anew from them.
    report.unlink()
    again = subprocess.run(cmd + ["--reuse"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("reusing the finished run") == 3 and "training (" not in again.stdout
    assert report.read_text().split("## Reading")[0].count("| 0 |") == text.split("## Reading")[0].count("| 0 |")
