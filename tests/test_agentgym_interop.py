"""Our AgentGym client against the reply formats of AgentGym's own BabyAI and TextCraft servers.

Those servers cannot run in the suite; tests/agentgym_reference_server.py replays their recorded replies and
serves our envs in their formats (see its docstring). Whole episodes run through the real rollout loop, where
the format reward is computed.
"""
from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from core.chat import ChatFormat
from core.metrics import rollout_metrics
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.scripted_policy import ScriptedPolicy
from core.trajectory import Termination
from environments.agentgym_http.client import AgentGymHTTPEnv
from environments.agentgym_http.protocol import EnvServerError
from environments.agentgym_http.server import ServerThread
from environments.agentgym_http.verdicts import action_validity
from environments.textcraft.planner import plan
from environments.textcraft.recipes import default_book
from tests.agentgym_reference_server import ReplayServer, recorded_exchanges, replay, serve

# The verdicts of the recorded steps (requests in order), from what each action did on the real server.
RECORDED_VERDICTS = {
    # bogus action, drop (carrying nothing), check available actions, go to red ball 1
    "babyai": [False, False, True, True],
    "textcraft": [False, False, True, False, True, True, True],  # get 1 dance floor, dance, inventory,
    # craft before getting its inputs, get, get, craft (solves the goal)
}


@pytest.mark.parametrize("task", sorted(RECORDED_VERDICTS))
def test_verdicts_read_from_recorded_replies(task):
    steps = [e for e in recorded_exchanges(task) if e["path"] == "/step"]
    assert all("valid_action" not in e["reply"] for e in steps)  # the real servers never send the flag
    assert [action_validity(task, e["reply"]["observation"]) for e in steps] == RECORDED_VERDICTS[task]


@pytest.mark.parametrize("task, text, verdict", [
    ("babyai", "You cannot go to red ball 1, as there is no path leading to it.\nAvailable actions: []",
     False),
    ("babyai", "You cannot go through blue closed door 1, as it is closed. You should toggle it first.",
     False),
    ("babyai", "You cannot toggle and go through red locked door 1, as you are not carrying a key.", False),
    ("babyai", "You cannot see any objects within sight.The room has walls around you. You are not carrying "
               "anything.\nAvailable actions: [\"turn left\"]", True),
    ("babyai", "No change in state.\nAvailable actions: [\"turn left\"]", True),
    ("babyai", "There is a red ball 1 right in front of you 1 steps away.", None),  # not the server's wording
    ("babyai", "The action is not recognized. Please check valid actions. Or is it?", None),
    ("textcraft", "Wrong item format: planks", False),
    ("textcraft", "Could not find a valid recipe for minecraft:stick", False),
    ("textcraft", "Crafted 4 minecraft:stick", True),
    ("textcraft", "Something the server never says", None),
    ("sciworld", "No known action matches that input.", None),  # no texts are known for other tasks
])
def test_verdicts_of_the_servers_texts(task, text, verdict):
    assert action_validity(task, text) is verdict


@pytest.mark.parametrize("task", sorted(RECORDED_VERDICTS))
def test_recorded_episodes_replay_through_the_client(task):
    """Every request the client makes is the one made to the real server, in order; the replies read right."""
    exchanges = recorded_exchanges(task)
    data_idx = next(e["body"]["data_idx"] for e in exchanges if e["path"] == "/reset")

    async def main():
        env = AgentGymHTTPEnv(server.url, task, timeout_s=10)
        steps, observed = [], []
        await env.reset(f"agentgym_http_{data_idx}")
        for e in exchanges:
            if e["path"] == "/step":
                steps.append(await env.step(f"Thought:\nI try this.\n\nAction:\n{e['body']['action']}"))
            elif e["path"].startswith("/observation"):
                observed.append(await env.observe())
        await env.close()
        return steps, observed

    with replay(task) as server:
        steps, observed = asyncio.run(main())
        assert server.server.position == len(exchanges)  # nothing skipped, nothing unrecorded
    assert [s.valid_action for s in steps] == RECORDED_VERDICTS[task]
    last = steps[-1]
    assert last.done and last.success and last.reward > 0 and not any(s.done for s in steps[:-1])
    (seen,) = observed
    if task == "babyai":  # step replies and the object observation carry the server's score
        assert last.score == pytest.approx(0.8875) and last.reward == pytest.approx(0.8875)
        assert all(s.score == 0.0 for s in steps[:-1])
        assert seen.text.startswith("Your goal: go to the red ball\nYou can take the following actions: ")
        assert (seen.score, seen.reward, seen.done) == (0.0, 0.0, False)
    else:  # TextCraft sends no score, and a plain string observation
        assert all(s.score is None for s in steps) and last.reward == 1.0
        assert (seen.text, seen.score, seen.done) == ("Could not execute dance", None, None)


def _scripted(tokenizer, first: str, task: str):
    """A policy that first sends `first`, then solves the task: BabyAI level 1 in one macro action, TextCraft
    by the crafting planner run on the observation in the conversation."""
    sent: list[str] = []

    def choose(conversation: str) -> str:
        if not sent:
            action = first
        elif task == "babyai":
            action = "go to red ball 1"
        else:
            todo = plan(re.search(r"Crafting commands:.*?Goal: craft [^\n.]*\.", conversation, re.S).group(0),
                        default_book())
            action = todo[len(sent) - 1]
        sent.append(action)
        return f"Thought:\nNext step.\n\nAction:\n{action}"

    return ScriptedPolicy(tokenizer, choose)


def _episode(url, family, client_task, tokenizer, format_reward=0.25):
    env = AgentGymHTTPEnv(url, client_task, timeout_s=30)
    spec = EpisodeSpec("interop-0", "agentgym_http_1", "group-0", 0, horizon=12)
    limits = EpisodeLimits(max_tokens_per_turn=256, max_context_tokens=16384, format_reward=format_reward)

    async def main():
        try:
            policy = _scripted(tokenizer, "dance", family)
            return await run_episode(env, policy, ChatFormat(tokenizer), spec, limits)
        finally:
            await env.close()

    traj = asyncio.run(main())
    traj.validate()
    return traj


@pytest.mark.parametrize("family, style", [
    ("babyai", "agentgym-rl"), ("babyai", "babyai"), ("textcraft", "agentgym-rl"), ("textcraft", "textcraft"),
])
def test_whole_episodes_in_each_reply_format(family, style, tiny_tokenizer):
    with serve(family, style) as server:
        traj = _episode(server.url, family, family, tiny_tokenizer)
        if style != "agentgym-rl":
            assert server.server.requests[-1] == "POST /close"
    m = traj.metrics
    assert traj.termination is Termination.DONE and m["success"] == 1.0 and m["env_reward"] > 0
    assert ("score" in m) == (style in ("agentgym-rl", "babyai"))  # TextCraft's server sends no score
    if "score" in m:
        assert m["score"] == pytest.approx(m["env_reward"])  # the server's running sum of rewards
    # Turn 1 ("dance") is rejected in every format: no format reward for it.
    assert traj.turn_rewards[0] == 0.0 and m["judged_turns"] >= 1
    assert m["format_reward"] == pytest.approx(0.25 * m["valid_actions"])
    if style == "agentgym-rl" or family == "textcraft":  # a flag, or TextCraft's texts: every turn judged
        assert m["judged_turns"] == traj.num_turns and m["valid_actions"] == traj.num_turns - 1
    else:  # our BabyAI's view is not worded like AgentGym's: the accepted turn is unknown, and unpaid
        assert (m["judged_turns"], m["valid_actions"], m["format_reward"]) == (1.0, 0.0, 0.0)


def test_textcraft_verdicts_from_texts_pay_what_the_flags_pay(tiny_tokenizer):
    """Same env, same replies: the TextCraft-format server's texts pay what our server's flags pay."""
    results = {}
    for style in ("agentgym-rl", "textcraft"):
        with serve("textcraft", style) as server:
            results[style] = _episode(server.url, "textcraft", "textcraft", tiny_tokenizer)
    np.testing.assert_allclose(results["textcraft"].turn_rewards, results["agentgym-rl"].turn_rewards)
    assert results["textcraft"].turn_rewards[1:-1].tolist() == [0.25] * (results["textcraft"].num_turns - 2)


def test_no_format_reward_for_turns_without_a_verdict(tiny_tokenizer):
    """A server that sends no flag, for a task whose texts the client does not know: every turn is unknown,
    so the format reward is never paid and the valid-action fraction is not made up; the same episode on our
    server (which flags each turn) is paid for its valid turns."""
    with serve("babyai", "babyai") as server:
        unknown = _episode(server.url, "babyai", "gridworld", tiny_tokenizer)
    with serve("babyai", "agentgym-rl") as server:
        flagged = _episode(server.url, "babyai", "gridworld", tiny_tokenizer)
    for traj in (unknown, flagged):
        assert traj.termination is Termination.DONE and traj.num_turns == 2 and traj.metrics["success"] == 1.0
    assert unknown.metrics["judged_turns"] == 0 and unknown.metrics["format_reward"] == 0.0
    np.testing.assert_allclose(unknown.turn_rewards, [0.0, unknown.metrics["env_reward"]])
    summary = rollout_metrics([unknown])
    assert "rollout/valid_action_frac" not in summary and summary["rollout/judged_turn_frac"] == 0.0
    assert flagged.metrics["format_reward"] == 0.25 and flagged.metrics["judged_turns"] == 2
    both = rollout_metrics([unknown, flagged])
    assert both["rollout/valid_action_frac"] == 0.5 and both["rollout/judged_turn_frac"] == 0.5
    assert flagged.total_reward - unknown.total_reward == pytest.approx(0.25, abs=1e-6)  # rewards are float32


@pytest.mark.parametrize("reply, match", [
    ([1, 2], "expected a string or an object"),
    ({"score": 1.0, "done": False}, "no 'observation'"),
    ({"observation": "x", "score": "1"}, "'score' has type str"),
    ({"observation": "x", "done": "no"}, "'done' has type str"),
])
def test_malformed_observations_raise(reply, match):
    """Replies no real server gives, replayed to show the client refuses them rather than guess."""
    exchanges = [{"method": "POST", "path": "/create", "body": {}, "reply": {"id": 0}},
                 {"method": "POST", "path": "/reset", "body": {"id": 0, "data_idx": 2},
                  "reply": {"observation": "Your goal: x", "reward": 0, "done": False}},
                 {"method": "GET", "path": "/observation?id=0", "body": None, "reply": reply},
                 {"method": "POST", "path": "/close", "body": {"id": 0}, "reply": True}]

    async def main():
        env = AgentGymHTTPEnv(server.url, "babyai", timeout_s=10)
        await env.reset("babyai_2")
        with pytest.raises(EnvServerError, match=match):
            await env.observe()
        await env.close()

    with ServerThread(ReplayServer(exchanges)) as server:  # type: ignore[arg-type]
        asyncio.run(main())
        assert server.server.position == len(exchanges)
