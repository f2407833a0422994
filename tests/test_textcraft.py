"""TextCraft: the recipe book, tasks, the engine's replies, shared-state safety, parsing, and the planner."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from environments.textcraft.env import TextCraftEnv
from environments.textcraft.planner import plan
from environments.textcraft.recipes import default_book, readable
from environments.textcraft.task import make_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def book():
    return default_book()


def test_book_has_the_documented_goals(book):
    assert len(book.goals) == 544
    assert collections.Counter(book.depth(g) for g in book.goals) == {1: 125, 2: 291, 3: 117, 4: 11}
    depths = [book.depth(g) for g in book.goals]
    assert depths == sorted(depths)
    assert book.is_tag("minecraft:planks") and not book.is_fetchable("minecraft:planks")
    assert book.is_fetchable("minecraft:lapis_lazuli") and not book.is_fetchable("minecraft:blue_dye")
    assert "minecraft:oak_planks" in book.members("minecraft:planks")


def test_observation_lists_the_recipe_tree_and_distractors(book):
    env = TextCraftEnv()
    obs = env.reset("textcraft_543")
    head, goal = obs.text.split("\n\n")
    assert head.startswith("Crafting commands:\n") and goal == f"Goal: craft {readable(book.goals[543])}."
    lines = head.split("\n")[1:]
    tree = {r.text for r in book.tree(book.goals[543])}
    assert tree <= set(lines) and 0 < len(set(lines) - tree) <= 10
    assert "Thought:" in obs.instruction and "get 1 lapis lazuli" in obs.instruction
    assert env.reset("textcraft_1087").text == obs.text  # ids wrap around the 544 goals
    assert make_task(book, 543, distractors=0).commands and \
        set(make_task(book, 543, distractors=0).commands) == tree


def test_replies_follow_the_reference():
    env = TextCraftEnv(parse_mode="strict")
    env.reset("textcraft_0")  # goal: acacia planks, from acacia logs
    assert env.step("Action: inventory").observation == "Inventory: You are not carrying anything."
    r = env.step("Action: get 1 acacia planks")
    assert r.observation == "Could not find acacia planks" and not r.valid_action
    r = env.step("Action: craft 4 acacia planks using 1 acacia logs")
    assert r.observation == "Could not find enough items to craft minecraft:acacia_planks" and not r.valid_action
    r = env.step("Thought:\nfetch\n\nAction:\nget 2 acacia logs")
    assert r.observation == "Got 2 acacia logs" and r.valid_action and r.reward == 0 and not r.done
    assert env.step("Action: inventory").observation == "Inventory: [acacia logs] (2)"
    assert env.step("Action: dance").observation == "Could not execute dance"
    r = env.step("Action: craft 4 acacia planks using 1 acacia logs")
    assert r.observation == "Crafted 4 minecraft:acacia_planks"
    assert r.reward == 1.0 and r.done and r.success and r.valid_action


def test_generic_ingredients_take_any_member():
    env = TextCraftEnv(parse_mode="strict")
    env.reset("textcraft_0")
    game = env.game
    game.inventory = {"minecraft:birch_planks": 4}
    out = game.act("craft 1 crafting table using 4 birch planks")
    assert out.ok and game.inventory == {"minecraft:crafting_table": 1}
    game.inventory = {"minecraft:birch_planks": 3}
    assert game.act("craft 1 crafting table using 3 birch planks").reply.startswith("Could not find a valid recipe")
    assert game.inventory == {"minecraft:birch_planks": 3}


def test_resets_never_grow_shared_state(book):
    env = TextCraftEnv()
    first = env.reset("textcraft_540").text
    sizes = {k: len(v) for k, v in book.by_item.items()}
    t0 = time.perf_counter()
    for _ in range(50):
        assert env.reset("textcraft_540").text == first
    assert time.perf_counter() - t0 < 5.0  # the reference grew to seconds per reset here
    assert {k: len(v) for k, v in book.by_item.items()} == sizes


@pytest.mark.parametrize("mode", ["strict", "lenient"])
def test_bad_output_changes_nothing(mode):
    env = TextCraftEnv(parse_mode=mode)
    env.reset("textcraft_0")
    env.step("Action: get 1 acacia logs")
    for reply in ("", "x" * 10_000, "Action: get 1 acacia logs\nAction: inventory", "Action:\n木を取る",
                  "ACTION: GET 1 ACACIA LOGS" if mode == "strict" else "Action:\n🙂"):
        r = env.step(reply)
        assert not r.valid_action and not r.done and r.observation, reply[:20]
        assert env.game.inventory == {"minecraft:acacia_logs": 1}


def test_lenient_reads_commands_out_of_prose():
    env = TextCraftEnv(parse_mode="lenient")
    env.reset("textcraft_0")
    r = env.step("I need logs first. So: Get 1 Acacia-Logs! Then later craft.")
    assert r.valid_action and r.parse_rule == "lenient" and r.observation == "Got 1 acacia logs"
    r = env.step("Thought: ok\nAction: CRAFT 4 acacia planks using 1 acacia logs.")
    assert r.success and r.parse_rule == "lenient"


def test_first_observation_is_identical_across_hash_seeds():
    code = ("import json\nfrom environments.textcraft.env import TextCraftEnv\nenv = TextCraftEnv()\n"
            "print(json.dumps([env.reset(f'textcraft_{n}').text for n in (0, 7, 140, 300, 500, 543)]))")
    outs = []
    for seed in ("1", "999"):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1] and len(set(json.loads(outs[0]))) == 6


def test_planner_solves_every_goal_through_the_text(book):
    """Acceptance: at least 200 goals, all 11 depth-4 goals among them (here: all 544)."""
    env = TextCraftEnv(parse_mode="strict")
    solved = collections.Counter()
    for n in range(544):
        obs = env.reset(f"textcraft_{n}")
        result = None
        for action in plan(obs.text, book):
            result = env.step(f"Thought:\nnext step\n\nAction:\n{action}")
            assert result.valid_action, (n, action, result.observation)
        assert result is not None and result.done and result.success and result.reward == 1.0, n
        solved[obs.info["depth"]] += 1
    assert solved == {1: 125, 2: 291, 3: 117, 4: 11}
