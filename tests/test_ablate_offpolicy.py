"""`python -m launch.ablate offpolicy` end to end on the tiny model, one learner step per variant. A module of
its own, so that under `--dist loadfile` it runs beside the horizon command's test rather than after it."""
from __future__ import annotations

import pytest

from tests.training_runs import ABLATE_TEST_S, TINY_RECIPE, ablate, trained_steps


@pytest.mark.slow
@pytest.mark.timeout(ABLATE_TEST_S)
def test_the_offpolicy_command_runs_every_variant_and_writes_its_report(tiny_model_dir, tmp_path):
    _, report = ablate("offpolicy", tiny_model_dir, tmp_path, "--eta", "2", "--eval-every", "1")
    metrics = {v: trained_steps(tmp_path / "runs" / f"{v}-s0") for v in ("decoupled", "coupled", "sync")}
    assert all([r["step"] for r in rows] == [1] for rows in metrics.values()), metrics
    coupled = metrics["coupled"][0]  # no importance weight at all: exactly 1, nothing truncated
    assert coupled["train/is_weight_mean"] == 1.0 and coupled["train/is_weight_max"] == 1.0
    assert coupled["train/truncated_frac"] == 0.0
    text = report.read_text()
    for needle in ("at eta = 2", "3 runs: ", " min of training and ", "| decoupled (correction on) | 0 | 1 |",
                   "| coupled (correction off) | 0 | 1 |",
                   "| eta = 0 (sync) | 0 | 1 |", "random policy", "untrained model", "## Reading",
                   "offpolicy.png", "trainer.max_staleness=2"):
        assert needle in text, needle
    assert (report.parent / "offpolicy.png").stat().st_size > 10_000
    # --eval-every: a checkpoint before the run's last step is evaluated on the same items into curve/step_N (here
    # the run's metrics are made to go on past its one checkpoint, so that it counts as an earlier one).
    import argparse
    import json

    from launch.ablate.runs import evaluate_checkpoints
    from launch.ablate.horizon_report import unseen_curve

    run_dir = tmp_path / "runs" / "decoupled-s0"
    assert (run_dir / "checkpoints" / "step_00000001").is_dir() and not (run_dir / "curve").exists()
    later = {**metrics["decoupled"][0], "step": 2, "perf/step_seconds": 5.0}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(later) + "\n")
    args = argparse.Namespace(config=str(TINY_RECIPE), eval_limit=1, overrides=[f"model.path={tiny_model_dir}",
                              "logging.wandb_mode=disabled", "env.slots_per_actor=8"], keep_checkpoints=False)
    evaluate_checkpoints("decoupled-s0", run_dir, args, eval_turns=2)
    assert not (run_dir / "checkpoints" / "step_00000001").exists()  # evaluated, then removed
    curve = unseen_curve(run_dir)
    assert [step for step, _, _ in curve] == [1, 2] and curve[0][2]["episodes"] == 1
    assert curve[1][1] == pytest.approx(curve[0][1] + 5.0)  # wall-clock: the steps' own seconds, summed
    assert json.loads((run_dir / "curve" / "step_00000001" / "eval_report.json").read_text())["item_set"] == "unseen"
