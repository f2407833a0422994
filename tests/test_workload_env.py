"""The scripted `workload` family (environments/examples/workload.py), which gives benchmark modes the same work:
every episode takes exactly its item's turns, whatever the replies, and the long tail has the documented shape."""
from __future__ import annotations

import asyncio
import collections
import statistics

import pytest

from configs.env import EnvConfig
from core.env import run_sync_env
from environments.examples.workload import FAMILY, WorkloadEnv, turns_for
from environments.registry import make_env


def play(env, item: str, replies) -> list:
    async def go():
        await env.reset(item)
        out = []
        for reply in replies:
            out.append(await env.step(reply))
            if out[-1].done:
                break
        return out
    return asyncio.run(go())


def test_an_episode_takes_exactly_its_items_turns_whatever_the_replies():
    env = run_sync_env(WorkloadEnv(turns=3))
    steps = play(env, "workload_5", ["Action: done", "", "go north", "more", "more"])
    assert [s.done for s in steps] == [False, False, True]
    assert [s.valid_action for s in steps] == [True, False, True]  # an empty reply is invalid, yet a turn
    assert steps[-1].reward == 1.0 and all(s.reward == 0.0 for s in steps[:-1])
    with pytest.raises(RuntimeError, match="after the episode ended"):
        asyncio.run(env.step("again"))
    repeat = play(env, "workload_5", ["a b a b"] * 3)
    assert repeat[-1].reward == 0.5 and steps[0].observation == repeat[0].observation


def test_the_long_tail_is_heavy_and_fixed_by_the_item():
    counts = collections.Counter(turns_for(f"workload_{n}", 1, True) for n in range(1000))
    assert set(counts) == {1, 2, 4, 8, 16}
    assert statistics.median(counts.elements()) <= 2 and 2.5 < statistics.mean(counts.elements()) < 3.5
    assert 0.08 < (counts[8] + counts[16]) / 1000 < 0.17  # a few episodes run 8 to 16 times longer
    assert turns_for("workload_17", 2, True) == 2 * turns_for("workload_17", 1, True)
    long_item = next(f"workload_{n}" for n in range(1000) if turns_for(f"workload_{n}", 1, True) == 16)
    assert len(play(run_sync_env(WorkloadEnv(1, long_tail=True)), long_item, ["x"] * 40)) == 16
    with pytest.raises(ValueError, match="not a workload item"):
        turns_for("babyai_3", 1, True)


def test_registered_as_a_family_of_your_own():
    cfg = EnvConfig(families={"workload": "environments.examples.workload"},
                    options={"workload": {"turns": 2, "long_tail": True}})
    env = make_env("workload", cfg)
    assert len(play(env, "workload_0", ["x"] * 40)) == turns_for("workload_0", 2, True)
    assert FAMILY.num_items == 1000
    with pytest.raises(ValueError, match="unknown option.*bogus"):
        make_env("workload", EnvConfig(families={"workload": "environments.examples.workload"},
                                       options={"workload": {"bogus": 1}}))
    with pytest.raises(ValueError, match="long_tail: expected true or false, got 'false'"):
        make_env("workload", EnvConfig(families={"workload": "environments.examples.workload"},
                                       options={"workload": {"long_tail": "false"}}))
