"""SciWorld on the real simulator: the item mapping, the simulator's own gold paths, failure, parsing, JVM reuse."""
from __future__ import annotations

import asyncio
import random

import psutil
import pytest

from configs.env import SciWorldConfig
from environments.registry import get_family
from environments.sciworld.env import SciWorldEnv, parse_action
from environments.sciworld.tasks import (KEPT_TASKS, NUM_ITEMS, SKIPPED_TASKS, TASK_TABLE, item_to_task,
                                         split_items, task_to_item)


@pytest.fixture(scope="module")
def env():
    """One env (one JVM) for the whole module, with gold planning on."""
    e = SciWorldEnv(SciWorldConfig(), plan_gold=True)
    yield e
    pid = e.sim.pid if e.sim else None
    e.close()
    assert pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_mapping_matches_the_documented_ranges():
    assert NUM_ITEMS == 4639
    starts = {0: "boil", 30: "melt", 60: "freeze", 90: "change-the-state-of-matter-of", 120: "use-thermometer",
              660: "measure-melting-point-known-substance", 1096: "measure-melting-point-unknown-substance",
              1396: "power-component", 1416: "power-component-renewable-vs-nonrenewable-energy",
              1436: "test-conductivity", 2336: "test-conductivity-of-unknown-substances",
              2936: "find-living-thing", 3236: "find-non-living-thing", 3536: "find-plant", 3836: "find-animal",
              4136: "chemistry-mix", 4168: "chemistry-mix-paint-secondary-color",
              4204: "chemistry-mix-paint-tertiary-color", 4240: "lifespan-longest-lived",
              4365: "lifespan-shortest-lived", 4490: "lifespan-longest-lived-then-shortest-lived",
              4615: "identify-life-stages-1", 4629: "identify-life-stages-2"}
    for n, name in starts.items():
        assert item_to_task(f"sciworld_{n}")[0].name == name and item_to_task(f"sciworld_{n}")[1] == 0
        if n:
            assert item_to_task(f"sciworld_{n - 1}")[0].name != name
    assert item_to_task("sciworld_4638") == (KEPT_TASKS[-1], 9)
    assert task_to_item("use-thermometer", 539) == "sciworld_659"
    for bad in ("sciworld_4639", "sciworld_-1", "babyai_3", "sciworld"):
        with pytest.raises(ValueError):
            item_to_task(bad)


def test_splits_are_disjoint_and_cover_every_task_type():
    train, test = split_items("train"), split_items("test")
    assert len(train) == 2312 and len(test) == 200 and not set(train) & set(test)
    assert {item_to_task(i)[0].name for i in test} == {t.name for t in KEPT_TASKS}
    for item in test:  # test items come from the simulator's own test variations
        task, variation = item_to_task(item)
        assert variation >= task.train + task.dev


@pytest.mark.parametrize("text,mode,expected", [
    ("Thought:\nI see a door.\n\nAction:\nopen door to kitchen", "strict", ("open door to kitchen", "strict")),
    ("Action: look around\nAction: go to kitchen", "strict", ("go to kitchen", "strict")),
    ("Action: look around\n(and then more)", "strict", ("look around\n(and then more)", "strict")),
    ("Action: look around\n(and then more)", "lenient", ("look around", "strict")),
    ("I will look.\n`look around`", "strict", (None, "none")),
    ("I will look.\n`look around`", "lenient", ("look around", "lenient")),
    ("thought...\naction: Pick up thermometer.", "lenient", ("Pick up thermometer", "lenient")),
    ("Action:   ", "strict", (None, "none")),
])
def test_parse_action(text, mode, expected):
    assert parse_action(text, mode) == expected


def test_task_table_matches_the_simulator(env):
    env.reset("sciworld_0")  # starts the JVM
    assert set(env.sim.task_names()) == {row[1] for row in TASK_TABLE}
    for _, name, variations, _, _ in TASK_TABLE:
        assert env.sim.max_variations(name) == variations, name
    assert len(SKIPPED_TASKS) == 7


def test_gold_paths_reach_100_over_every_task_type(env):
    """The simulator's own solutions score 100 on 23 items, one per task type (variations spread out)."""
    reached = []
    for k, task in enumerate(KEPT_TASKS):
        variation = (k * 7) % task.variations
        item = task_to_item(task.name, variation)
        obs = env.reset(item)
        assert obs.text.startswith(env.sim.task_description()) and "You also see" in obs.text
        train, dev, test = env.sim.split_variations()
        assert (len(train), len(dev), len(train) + len(dev) + len(test)) == (task.train, task.dev, task.variations)
        total, result = 0.0, None
        for command in env.gold_actions():
            result = env.step(f"Thought:\nFollowing the plan.\n\nAction:\n{command}")
            total += result.reward
            if result.done:
                break
        assert result is not None and result.done and result.success, (item, result)
        assert result.score == 100.0 and abs(total - 1.0) < 1e-9
        reached.append((item, task.name))
    assert len(reached) >= 20 and len({name for _, name in reached}) >= 10
    assert env.jvm_starts == 1  # one JVM served every episode


def test_failure_ends_the_episode_and_rewards_sum_to_zero(env):
    env.reset("sciworld_0")  # boil water
    total = 0.0
    for command in env.gold_actions():
        result = env.step(f"Action: {command}")
        total += result.reward
        if result.score > 0:
            break
    assert total > 0
    result = env.step("Action: focus on air")  # the wrong substance
    total += result.reward
    assert result.done and not result.success and result.score == -100.0 and result.info["failed"]
    assert abs(total) < 1e-9


def test_invalid_and_ambiguous_commands_get_the_simulators_answer(env):
    env.reset("sciworld_0")
    r = env.step("Thought: hmm\n\nAction: fly to the moon")
    assert r.observation == "No known action matches that input." and not r.valid_action and not r.done
    r = env.step("Action: open door")
    assert r.observation.startswith("Ambiguous request") and r.valid_action and not r.done
    r = env.step("Action: 0")
    assert "door" in r.observation and r.valid_action
    r = env.step("no action at all")
    assert not r.valid_action and r.parse_rule == "none" and "Action:" in r.observation
    for junk in ("Action: \x00\x01", "Action: " + "x" * 5000, "Action: focus on"):
        r = env.step(junk)
        assert isinstance(r.observation, str) and not r.done


def test_family_env_on_its_own_thread_with_a_small_heap():
    """Through the registry: a ThreadedEnv with its own JVM, started with the small-heap flags, killed on close."""
    family = get_family("sciworld")
    assert family.num_items == NUM_ITEMS and family.extras["max_instances_per_actor"](SciWorldConfig()) == 8

    async def run() -> int:
        e = family.make_env(SciWorldConfig(jvm_heap_mb=192))
        rng = random.Random(0)
        obs = await e.reset(family.extras["contract_items"][1])
        pid = e.inner.sim.pid
        assert "-Xmx192m" in psutil.Process(pid).cmdline()
        for _ in range(3):
            r = await e.step(family.extras["scripted_reply"](obs.text, rng))
            assert r.valid_action and not r.done
        await e.close()
        return pid

    pid = asyncio.run(run())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
