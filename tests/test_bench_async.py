"""The async benchmark's runs are valid configs that differ only in eta, and its summary reads the coordinator's
metrics as documented (the benchmark itself runs three training jobs: too long for the suite)."""
from __future__ import annotations

import importlib

import pytest

from configs.load import load_config

bench = importlib.import_module("launch.bench.async")


def test_the_three_runs_are_valid_configs_differing_only_in_eta(tmp_path):
    args = bench.argparse.Namespace(model="default", steps=5, groups=2, group_size=4, turns=3, tokens_per_turn=32,
                                    lr=1e-9, cores="0,1")
    cfgs = {eta: load_config(None, bench.overrides(args, eta, tmp_path / "run")) for _, eta in bench.MODES}
    assert [c.trainer.max_staleness for c in cfgs.values()] == [0, 1, 4]
    assert cfgs[0].learner.cpu_cores == [1] and cfgs[0].generator.cpu_threads_bind == "0"
    assert cfgs[0].generator.cpu_cores == cfgs[0].env.cpu_cores == [0]
    assert cfgs[0].algorithm.rounds_ctrl.type == "fixed" and cfgs[0].algorithm.rounds_ctrl.rounds == 3
    cfgs[4].trainer.max_staleness = 0
    assert cfgs[4] == cfgs[0]


def test_summary_skips_the_first_step_and_splits_wait_from_training():
    rows = [{"perf/step_seconds": 100.0, "perf/learner_idle_frac": 0.9, "perf/train_seconds": 5.0,
             "perf/publish_seconds": 1.0, "train/batch_tokens": 10.0, "train/staleness/0": 1.0}]
    rows += [{"perf/step_seconds": s, "perf/learner_idle_frac": w / s, "perf/train_seconds": s - w - 1.0,
              "perf/publish_seconds": 1.0, "train/batch_tokens": 800.0, "train/staleness/0": 0.5}
             for s, w in ((40.0, 10.0), (60.0, 30.0))]
    got = bench.summarise(rows)
    assert got["step_s"] == pytest.approx(50.0) and got["wait_s"] == pytest.approx(20.0)
    assert got["train_s"] == pytest.approx(30.0) and got["stale_frac"] == pytest.approx(0.5)
    assert got["s_per_ktok"] == pytest.approx(1000 * 50.0 / 800.0)
