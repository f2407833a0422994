"""BabyAI over real minigrid: item mapping, observation text, macro actions, rewards, bad output, determinism,
and the scripted expert's success on the single-room levels."""
from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest

from environments.babyai.env import BabyAIEnv
from environments.babyai.expert import run_expert
from environments.babyai.levels import LEVELS, SINGLE_ROOM, gym_id, level_and_seed
from environments.babyai.scripted import available_actions

ROOT = Path(__file__).resolve().parents[1]


def state(env: BabyAIEnv) -> tuple:
    g = env.game
    return (tuple(int(v) for v in g.agent_pos), int(g.agent_dir), id(g.carrying), int(g.step_count))


def test_item_ids_map_to_levels_and_seeds():
    assert level_and_seed("babyai_0") == ("GoToRedBallGrey", 0)
    assert level_and_seed("babyai_39") == ("BossLevelNoUnlock", 0)
    assert level_and_seed("babyai_40") == ("GoToRedBallGrey", 1)
    assert level_and_seed("babyai_82") == ("GoToRedBallNoDists", 2)
    assert gym_id("GoToObjS6") == "BabyAI-GoToObjS6-v1" and gym_id("Open") == "BabyAI-Open-v0"
    with pytest.raises(ValueError, match="textcraft_1"):
        level_and_seed("textcraft_1")


def test_first_observation_has_goal_view_and_action_list():
    env = BabyAIEnv()
    obs = env.reset("babyai_1")
    lines = obs.text.split("\n")
    assert lines[0] == f"Your goal: {env.game.mission}" and lines[0] == "Your goal: go to the red ball"
    assert "There is a red ball 1 4 steps in front of you and 3 steps to your right." in lines[1]
    assert lines[1].endswith("You are not carrying anything.")
    actions = available_actions(obs.text)
    assert lines[2] == "Available actions: " + json.dumps(actions)
    assert actions[:3] == ["turn left", "turn right", "move forward"] and actions[-1] == "check available actions"
    assert "go to red ball 1" in actions and "pickup red ball 1" in actions
    assert "Thought:" in obs.instruction and "Action:" in obs.instruction
    assert obs.info["level"] == "GoToRedBall" and obs.info["max_steps"] == env.game.max_steps


def test_go_to_reaches_the_goal_with_minigrids_reward():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_1")
    result = env.step("Thought:\nThe red ball is ahead on the right.\n\nAction:\ngo to red ball 1")
    g = env.game
    assert result.done and result.success and result.valid_action and result.parse_rule == "strict"
    assert result.info["primitives"] == g.step_count > 1
    assert result.reward == pytest.approx(1 - 0.9 * g.step_count / g.max_steps)
    assert "The task is completed." in result.observation
    assert tuple(g.front_pos) == tuple(g.grid.get(*g.front_pos).cur_pos)  # facing the ball
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Action: turn left")


def test_turns_and_moves_are_single_primitives():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_2")
    pos, direction, _, steps = state(env)
    result = env.step("Action: turn left")
    assert result.valid_action and not result.done and state(env)[1] == (direction - 1) % 4
    assert env.game.step_count == steps + 1 and result.reward == 0.0


def test_pick_up_is_accepted_as_pickup_and_drop_puts_it_down():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_0")  # GoToRedBallGrey: grey distractors all around
    assert "pickup grey key 1" in env.table.actions
    result = env.step("Action: pick up grey key 1")
    assert result.valid_action and env.game.carrying is not None and env.game.carrying.type == "key"
    assert "You are carrying a grey key." in result.observation
    assert "drop" in available_actions(result.observation)
    assert not any(a.startswith("pickup") for a in available_actions(result.observation))
    result = env.step("Action: drop")
    assert result.valid_action and env.game.carrying is None


@pytest.mark.parametrize("action, expected", [
    ("drop", "as you are not carrying anything"),
    ("toggle", "nothing in front of you"),
    ("go to purple key 9", "You cannot see a purple key 9"),
    ("go through grey key 1", "as it is not a door"),
    ("dance wildly", "The action is not recognized"),
])
def test_infeasible_actions_explain_and_change_nothing(action, expected):
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_0")
    before = state(env)
    result = env.step(f"Thought:\nx\n\nAction:\n{action}")
    assert expected in result.observation and "Available actions: [" in result.observation
    assert not result.valid_action and not result.done and result.reward == 0.0
    assert state(env) == before


def test_blocked_move_and_held_pickup_are_explained():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_0")
    env.step("Action: pickup grey key 1")
    for _ in range(4):
        visible = [s.label for s in env.view.objects if s.kind in ("key", "ball", "box")]
        if visible:
            break
        env.step("Action: turn left")
    before = state(env)
    result = env.step(f"Action: pickup {visible[0]}")
    assert "already carrying something" in result.observation and state(env) == before
    while "move forward" in env.table.actions:
        env.step("Action: move forward")
    before = state(env)
    result = env.step("Action: move forward")
    assert "can't move forward" in result.observation and state(env) == before


def test_check_available_actions_takes_no_step():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_5")
    before = state(env)
    result = env.step("Action: check available actions")
    assert result.valid_action and result.observation.startswith("You can take the following actions: turn left")
    assert state(env) == before
    assert result.changed is False  # the format reward does not pay it (core.rollout)


def test_an_action_says_whether_it_changed_the_world():
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_0")
    assert env.step("Action: go to grey key 1").changed is True
    again = env.step("Action: go to grey key 1")  # already facing it: accepted, and nothing moves
    assert again.valid_action and again.changed is False
    assert env.step("Action: turn left").changed is True


def test_an_action_says_whether_it_took_the_world_back_to_a_state_the_episode_was_in():
    """The pickup/drop loop greedy policies fell into: the first pickup and drop are new states, every later
    one is a state the episode was already in; so is turning back to where one started."""
    env = BabyAIEnv(parse_mode="strict")
    env.reset("babyai_0")
    said = [(r.changed, r.revisited) for r in (env.step(f"Action: {a}") for a in (
        "turn left", "turn right", "check available actions", "pickup grey key 1", "drop", "pickup grey key 1",
        "drop"))]
    assert said == [(True, False), (True, True), (False, None), (True, False), (True, False), (True, True),
                    (True, True)]
    env.reset("babyai_0")  # a new episode remembers nothing of the last
    assert env.step("Action: turn left").revisited is False


def _noise() -> str:
    rng = random.Random(3)
    return "".join(rng.choice(string.printable + "éß漢🙂") for _ in range(10_000))


@pytest.mark.parametrize("mode", ["strict", "lenient"])
@pytest.mark.parametrize("reply", ["", "NOISE", "Action:\nturn left\nAction:\nturn right", "ACTION: TURN LEFT",
                                   "Action:\n左に曲がる 🙂"], ids=["empty", "noise", "two-actions", "wrong-case",
                                                                  "non-ascii"])
def test_bad_agent_output_is_explained_without_state_change(mode, reply):
    reply = _noise() if reply == "NOISE" else reply
    env = BabyAIEnv(parse_mode=mode)
    env.reset("babyai_0")
    before = state(env)
    result = env.step(reply)
    if mode == "lenient" and reply == "ACTION: TURN LEFT":
        assert result.valid_action and result.parse_rule == "lenient"  # lenient ignores case by design
        return
    assert not result.valid_action and not result.done and result.reward == 0.0
    assert result.observation and "Available actions: [" in result.observation
    assert state(env) == before
    assert env.step("Action:\nturn left").valid_action  # the episode goes on


def test_lenient_finds_an_action_named_in_prose():
    env = BabyAIEnv(parse_mode="lenient")
    env.reset("babyai_1")
    result = env.step("The red ball is close, so I should Go to the red ball 1... yes: 'go to red ball 1'.")
    assert result.success and result.parse_rule == "lenient"


def test_first_observation_is_identical_across_processes_and_hash_seeds():
    code = ("import json, sys\nfrom environments.babyai.env import BabyAIEnv\nenv = BabyAIEnv()\n"
            "print(json.dumps([env.reset(f'babyai_{n}').text for n in list(range(40)) + [40, 417, 899]]))")
    outs = []
    for seed in ("0", "4242"):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1]
    texts = json.loads(outs[0])
    assert texts[0] != texts[40] and texts[0].startswith("Your goal: ")  # babyai_0 vs babyai_40: another seed


def test_expert_solves_single_room_levels_through_the_text_actions():
    """Acceptance: >= 95% of the single-room items among babyai_0 ... babyai_799 within 20 turns."""
    env = BabyAIEnv(parse_mode="strict")
    items = [n for n in range(800) if LEVELS[n % 40] in SINGLE_ROOM]
    assert len(items) == 180
    results = {n: run_expert(f"babyai_{n}", max_turns=20, env=env) for n in items}
    rate = sum(ok for ok, _, _ in results.values()) / len(items)
    assert rate >= 0.95, f"expert success {rate:.3f} on single-room items"
    assert all(reward > 0 for ok, reward, _ in results.values() if ok)


def test_brief_prompt_is_shorter_and_keeps_the_observation():
    react, brief = BabyAIEnv(prompt="react"), BabyAIEnv(prompt="brief")
    a, b = react.reset("babyai_2"), brief.reset("babyai_2")
    assert a.text == b.text and len(b.instruction) < len(a.instruction) / 3
    assert "one of the available actions" in b.instruction
    with pytest.raises(ValueError, match="prompt"):
        BabyAIEnv(prompt="verbose")


def test_a_turn_cue_ends_every_observation_and_none_keeps_the_references():
    cue = "Name exactly one of the available actions."
    plain, cued = BabyAIEnv(prompt="brief"), BabyAIEnv(prompt="brief", turn_cue=cue)
    a, b = plain.reset("babyai_2"), cued.reset("babyai_2")
    assert b.text == a.text + "\n" + cue and not a.text.endswith(cue)
    assert available_actions(b.text) == available_actions(a.text)
    for reply in ("nothing I can name", "turn left", "check available actions"):  # a miss, a step, a listing
        x, y = plain.step(reply), cued.step(reply)
        assert y.observation == x.observation + "\n" + cue, reply
        assert (y.reward, y.valid_action, y.parse_rule) == (x.reward, x.valid_action, x.parse_rule)
