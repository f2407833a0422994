"""The scale benchmark's machinery at a small size: the real coordinator, env pools (Ray actors) and trajectory
channel run 100 TextCraft episodes in flight with stand-in model roles; none fails or is lost, each group is
trained at most once, and every figure the benchmark reports is there (and positive where it must be)."""
from __future__ import annotations

import math

import pytest

from launch.bench import scale


@pytest.fixture(scope="module")
def ray_local():
    from launch.job import ray_cluster

    ray_cluster.connect(num_cpus=8)
    yield
    ray_cluster.shutdown()


def test_a_hundred_in_flight_on_one_actor(ray_local, tiny_model_dir):
    # a loaded machine can see no episode end in 1.5 s: the window runs on until four have
    args = scale.parser().parse_args(["--seconds", "1.5", "--min-episodes", "4", "--warmup-s", "30",
                                      "--drain-s", "30", "--turns", "2"])
    result = scale.run_level(100, 1, args, str(tiny_model_dir), scale.reply_tokens(str(tiny_model_dir)))
    assert result["error"] == ""
    assert result["failed"] == 0 and result["lost"] == 0, result
    assert result["in_flight"] == 100 and result["slots"] == 100
    for key in ("episodes_per_s", "trajectories_per_s", "driver_cpu_ms_per_traj", "pool_cpu_ms_per_step",
                "fixed_mb", "first_token_p50_ms", "first_token_p99_ms", "mean_in_flight"):
        assert math.isfinite(result[key]) and result[key] > 0, (key, result[key])
    # The marginal memory of 90 more episodes can be lost in the allocator's noise: it is there and small.
    assert math.isfinite(result["mb_per_episode"]) and abs(result["mb_per_episode"]) < 5, result["mb_per_episode"]
    assert result["first_token_p99_ms"] >= result["first_token_p50_ms"]
    # the batches went the real way (prepare_samples, Ray to a rank) and each step was logged as a run logs it
    assert result["steps_logged"] > 0 and result["rank_tokens"] > 0 and result["samples_with_advantages"] > 0, result
    figures = scale.figures([result])
    assert figures["scale_max_in_flight"] == 100
    for key in ("coordinator_cpu_ms_per_traj_100", "trajectories_per_s_100", "fixed_mb_100"):
        assert figures[key] > 0, key
    assert figures["mb_per_episode_in_flight"] == figures["mb_per_episode_in_flight_100"]


def test_a_level_with_a_failure_does_not_count_as_reached():
    ok = {"in_flight": 100, "failed": 0, "lost": 0}
    assert scale.figures([ok, {"in_flight": 1000, "failed": 0, "lost": 3}])["scale_max_in_flight"] == 100
    assert scale.figures([ok, {"in_flight": 1000, "failed": 1, "lost": 0}])["scale_max_in_flight"] == 100
