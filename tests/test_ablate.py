"""The ablations: the horizon schedules, the off-policy variants, their reading of the numbers, and each command
end to end on the tiny model, one learner step per variant (each variant trains and evaluates for real)."""
from __future__ import annotations

import subprocess

import pytest

from core.metrics import read_jsonl
from environments.babyai.levels import level_of
from launch.ablate.horizon import LEVELS, stage_schedule
from launch.ablate.horizon_report import reading
from tests.training_runs import ABLATE_TEST_S, ROOT, ablate, trained_steps


@pytest.mark.parametrize("short, long, stages, steps, want", [
    (2, 6, 3, 24, ([2, 4, 6], [8, 16])),
    (10, 30, 3, 300, ([10, 20, 30], [100, 200])),
    (2, 3, 2, 2, ([2, 3], [1])),
    (2, 6, 3, 1, ([2], [])),  # one step holds one stage
    (2, 3, 5, 40, ([2, 3], [20])),  # no more stages than turn limits between short and long
])
def test_stage_schedule_grows_from_short_to_long(short, long, stages, steps, want):
    assert stage_schedule(short, long, stages, steps) == want


def test_the_horizon_variants_are_equal_in_steps_by_default_and_in_turns_on_request():
    import argparse

    from launch.ablate.horizon import variant_overrides

    args = argparse.Namespace(short=2, long=6, stages=3, steps=24, max_steps_factor=4, equal="steps")
    assert variant_overrides("scaling", args, 0) == ["algorithm.horizon.turns=[2, 4, 6]",
                                                     "algorithm.horizon.boundaries=[8, 16]", "trainer.total_steps=24"]
    for variant, turns in (("fixed_short", 2), ("fixed_long", 6)):
        assert variant_overrides(variant, args, 500.0) == [f"algorithm.horizon.turns=[{turns}]",
                                                           "algorithm.horizon.boundaries=[]", "trainer.total_steps=24"]
    args.equal = "turns"  # the fixed runs train until they reach the scaling run's trained turns, capped
    assert variant_overrides("fixed_long", args, 500.0)[2:] == ["trainer.total_steps=96",
                                                                "trainer.max_trained_turns=500"]


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
    one = reading({"scaling": 0.8, "fixed_short": 0.5, "fixed_long": 0.3},
                  {"scaling": (0.8, 0.8), "fixed_short": (0.5, 0.5), "fixed_long": (0.3, 0.3)}, 1)
    assert "(one seed: no spread to weigh it by)" in one[1] and "overlap" not in " ".join(one)
    assert "holds on its one seed" in one[-2]


def test_the_offpolicy_reading_names_whether_the_correction_helps_beyond_the_seeds():
    from launch.ablate.offpolicy_report import reading as offpolicy_reading

    apart = offpolicy_reading({"decoupled": 0.8, "coupled": 0.5, "sync": 0.7},
                              {"decoupled": (0.75, 0.85), "coupled": (0.4, 0.6), "sync": (0.6, 0.8)}, 8, 3,
                              {"decoupled": 2.5, "coupled": 2.4})
    assert apart[0].startswith("Ordering of the mean final success rate: decoupled (correction on) (0.800) > eta")
    assert "+0.300; the seeds' ranges do not overlap" in apart[1] and "overlap" in apart[2]
    assert "at eta = 8" in apart[3] and "holds, with every seed of the decoupled" in apart[3]
    fresh = offpolicy_reading({"decoupled": 0.5, "coupled": 0.6, "sync": 0.5},
                              {"decoupled": (0.4, 0.6), "coupled": (0.5, 0.7), "sync": (0.5, 0.5)}, 8, 1,
                              {"decoupled": 0.4, "coupled": 0.5})
    assert "does not hold here" in fresh[3] and "less than one version stale" in fresh[4]
    assert "single draw" in fresh[-1] and "one seed: no spread" in fresh[1]
    one = offpolicy_reading({"decoupled": 0.62, "coupled": 0.38, "sync": 0.87},
                            {"decoupled": (0.62, 0.62), "coupled": (0.38, 0.38), "sync": (0.87, 0.87)}, 8, 1,
                            {"decoupled": 5.2, "coupled": 6.0})
    assert "holds on its one seed" in one[3] and "every seed" not in " ".join(one)


def test_the_offpolicy_runs_get_enough_slots_for_eta_and_the_staleness_is_read_back(tmp_path):
    import argparse
    import json

    from launch.ablate.offpolicy import slots_for, variant_overrides
    from launch.ablate.offpolicy_report import mean_staleness

    args = argparse.Namespace(config="configs/default.yaml", overrides=[], slots=0, eta=8, steps=24)
    # default: 4 groups of 4 per step; eta 8 -> 9 steps of groups in flight -> 144 episodes, 2 per slot
    assert slots_for(args) == 72
    assert slots_for(argparse.Namespace(**{**vars(args), "eta": 1})) == 16  # the config's own, already enough
    assert variant_overrides("coupled", args, 72) == ["trainer.max_staleness=8", "algorithm.policy_loss=coupled",
                                                      "trainer.total_steps=24", "env.slots_per_actor=72"]
    assert variant_overrides("sync", args, 72)[:2] == ["trainer.max_staleness=0", "algorithm.policy_loss=decoupled"]
    rows = [{"step": 1, "rollout/trained_turns_total": 8, "train/sampled_tokens": 100.0, "train/staleness/0": 1.0},
            {"step": 2, "rollout/trained_turns_total": 16, "train/sampled_tokens": 300.0, "train/staleness/0": 0.5,
             "train/staleness/2": 0.25, "train/staleness/8+": 0.25, "train/staleness/ahead": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mean, largest = mean_staleness(tmp_path)
    assert mean == pytest.approx((300 * (0.25 * 2 + 0.25 * 8)) / 400) and largest == 8


def test_a_runs_time_is_read_from_what_it_wrote_so_a_reused_run_counts_too(tmp_path):
    import json

    from launch.ablate.runs import budget_line, run_minutes

    run = tmp_path / "decoupled-s0"
    (run / "eval").mkdir(parents=True)
    (run / "train.log").write_text("2026-12-07 01:32:07 agentgym.session INFO evaluating\n"
                                   "2026-12-07 01:52:33 agentgym.session INFO trained 24 steps in 17.0 min\n")
    (run / "eval" / "eval_report.json").write_text(json.dumps({"minutes": 1.5}))
    for step, minutes in ((6, 2.0), (12, 2.5)):
        (run / "curve" / f"step_{step:08d}").mkdir(parents=True)
        (run / "curve" / f"step_{step:08d}" / "eval_report.json").write_text(json.dumps({"minutes": minutes}))
    assert run_minutes(run) == (17.0, 6.0)
    assert run_minutes(tmp_path / "never-ran") == (0.0, 0.0)
    line = budget_line({"decoupled": {0: run}, "coupled": {0: tmp_path / "never-ran"}})
    assert line.startswith("2 runs: 17 min of training and 6 min of evaluation in all"), line
    from launch.ablate.runs import invocation_line

    assert invocation_line(132.4) == "this invocation 132 min"
    assert invocation_line(0.1) == "this invocation under a minute"  # a --reuse that only reports


@pytest.mark.slow
@pytest.mark.timeout(ABLATE_TEST_S)
def test_the_horizon_command_runs_every_variant_for_equal_steps_and_writes_its_report(tiny_model_dir, tmp_path):
    cmd, report = ablate("horizon", tiny_model_dir, tmp_path, "--short", "2", "--long", "3", "--stages", "2")
    for variant, want in (("scaling", {2.0}), ("fixed_short", {2.0}), ("fixed_long", {3.0})):
        run_dir = tmp_path / "runs" / f"{variant}-s0"
        rows = trained_steps(run_dir)
        assert [r["step"] for r in rows] == [1], variant  # equal learner steps: one each
        assert {r["rollout/horizon"] for r in rows} == want, variant
        sample = read_jsonl(run_dir / "episodes.jsonl")  # the training run's transcripts, one sample per step
        assert 1 <= len(sample) <= 2 and sample[0]["step"] == 1 and sample[0]["turns"], variant
        assert (run_dir / "eval" / "episodes.jsonl").stat().st_size > 0  # and its evaluation's episodes
        # on the command's levels, where more turns are needed (not the recipe's)
        assert {level_of(e["item_id"]) for e in read_jsonl(run_dir / "eval" / "episodes.jsonl")} <= set(LEVELS)
    text = report.read_text()
    for needle in ("at equal learner steps", "| ScalingInter-RL | 0 | 1 |", "| fixed short | 0 | 1 |",
                   "| fixed long | 0 | 1 |", "random policy", "untrained model", "## Reading", "horizon.png",
                   "against trained turns"):
        assert needle in text, needle
    assert (report.parent / "horizon.png").stat().st_size > 10_000
    # --reuse: the finished runs are kept, nothing is trained again, and the report is written anew from them.
    report.unlink()
    again = subprocess.run(cmd + ["--reuse"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("reusing the finished run") == 3 and "training (" not in again.stdout
    tables = lambda page: [line for line in page.split("## Reading")[0].splitlines() if line.startswith("|")]  # noqa
    assert tables(report.read_text()) == tables(text)


def test_the_offpolicy_report_pairs_the_variants_seed_by_seed():
    from launch.ablate.offpolicy_report import paired

    point = lambda rate: {"success_rate": rate}  # noqa: E731
    curves = {"decoupled": {0: [(6, 60.0, point(0.5)), (12, 120.0, point(0.7))], 1: [(12, 90.0, point(0.4))]},
              "coupled": {0: [(6, 70.0, point(0.1)), (12, 140.0, point(0.6))], 1: [(12, 95.0, point(0.5))],
                          2: [(12, 99.0, point(0.9))]}}
    line, = paired(curves)
    assert "+0.100 (seed 0), -0.100 (seed 1); ahead on 1 of 2" in line, line  # seed 2 ran one variant only
    assert line.endswith("Averaged over the steps both evaluated: +0.250, -0.100."), line
    assert paired({"decoupled": {0: []}, "coupled": {1: []}}) == []
