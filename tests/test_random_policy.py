"""The random baseline on real BabyAI (minigrid) envs through the real rollout loop, and its refusals."""
from __future__ import annotations

import asyncio
import pickle

import pytest

from actors.random_policy import RandomPolicy, random_refusal
from configs.load import load_config
from core.chat import ChatFormat
from core.env import SyncEnv, run_sync_env
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from environments.babyai.env import BabyAIEnv
from environments.babyai.scripted import available_actions
from environments.textcraft.actions import available_actions as textcraft_actions

EASY = 2  # GoToRedBallNoDists: babyai_<2 + 40 * seed>


class Recording(SyncEnv):
    """The real BabyAI env, remembering each turn's listed actions and the action the env took from the reply."""
    family = "babyai"

    def __init__(self, parse_mode: str):
        self.inner = BabyAIEnv(parse_mode=parse_mode)
        self.turns: list[tuple[list[str], str | None, str]] = []
        self.listed: list[str] = []

    def reset(self, item_id):
        obs = self.inner.reset(item_id)
        self.listed = available_actions(obs.text)
        return obs

    def step(self, reply):
        result = self.inner.step(reply)
        self.turns.append((self.listed, result.info.get("action"), result.parse_rule))
        self.listed = available_actions(result.observation)
        return result


def _episodes(policy, tokenizer, parse_mode: str, seeds: range, horizon: int = 10):
    chat = ChatFormat(tokenizer)
    limits = EpisodeLimits(max_tokens_per_turn=64, max_context_tokens=4096, temperature=0.0)
    out = []
    for seed in seeds:
        inner = Recording(parse_mode)
        item = f"babyai_{EASY + 40 * seed}"
        spec = EpisodeSpec(f"eval-{item}.s0", item, f"eval-{item}", 0, horizon)
        traj = asyncio.run(run_episode(run_sync_env(inner), policy, chat, spec, limits))
        out.append((traj, inner.turns))
    return out


@pytest.mark.parametrize("parse_mode", ["strict", "lenient"])
def test_random_policy_picks_listed_actions_repeats_exactly_and_sometimes_succeeds(tiny_model_dir, tiny_tokenizer,
                                                                                  parse_mode):
    cfg = load_config(None, [])
    policy = RandomPolicy(str(tiny_model_dir), cfg.env)
    runs = _episodes(policy, tiny_tokenizer, parse_mode, range(24))
    for traj, turns in runs:
        assert turns and traj.metrics["valid_actions"] == traj.metrics["judged_turns"] == traj.num_turns
        for listed, action, rule in turns:
            assert rule == "strict"  # the reply's Action: line itself named the action
            assert action in listed and action != "check available actions"
    successes = sum(traj.metrics["success"] for traj, _ in runs)
    assert 3 <= successes < len(runs)  # measured floor on this level: about half within 10 turns
    chosen = {a for _, turns in runs for _, a, _ in turns}
    assert len(chosen) >= 4  # it explores (this level has one object: turns, forward, go to, pickup)
    # the same items give the same episodes, also from a copy in another process (pickled)
    again = _episodes(pickle.loads(pickle.dumps(policy)), tiny_tokenizer, parse_mode, range(6))
    for (first, turns), (second, turns2) in zip(runs[:6], again):
        assert turns == turns2 and first.tokens.tolist() == second.tokens.tolist()
    # another seed changes the choices
    other = _episodes(RandomPolicy(str(tiny_model_dir), cfg.env, seed=1), tiny_tokenizer, parse_mode, range(6))
    assert [t for _, t in other] != [t for _, t in runs[:6]]


def test_random_refused_for_families_that_list_no_actions():
    assert random_refusal(["babyai", "textcraft"]) == ""
    message = random_refusal(["babyai", "webarena"])
    assert "webarena" in message and "babyai" not in message
    assert "searchqa" in random_refusal(["searchqa"])


def test_textcraft_actions_come_from_the_crafting_commands():
    text = ("Crafting commands:\ncraft 1 black dye using 1 wither rose\ncraft 4 planks using 1 oak log\n"
            "craft 1 stick using 2 planks\n\nGoal: craft stick.")
    actions = textcraft_actions("instructions...\n" + text + "\nGot 1 oak log")
    assert actions == ["craft 1 black dye using 1 wither rose", "craft 4 planks using 1 oak log",
                       "craft 1 stick using 2 planks", "get 1 wither rose", "get 1 oak log", "inventory"]
    assert textcraft_actions("no commands here") == ["inventory"]


def test_random_policy_on_textcraft_names_only_actions_read_off_the_commands(tiny_model_dir, tiny_tokenizer):
    from environments.textcraft.env import TextCraftEnv

    class Recording(TextCraftEnv):
        def reset(self, item_id):
            obs = super().reset(item_id)
            self.listed, self.turns = textcraft_actions(obs.text), []
            return obs

        def step(self, reply):
            result = super().step(reply)
            self.turns.append((result.info.get("action"), result.parse_rule))
            return result

    policy = RandomPolicy(str(tiny_model_dir), load_config(None, []).env)
    limits = EpisodeLimits(max_tokens_per_turn=64, max_context_tokens=4096, temperature=0.0)
    accepted = 0
    for n in (0, 7, 130):
        env = Recording(parse_mode="strict")
        spec = EpisodeSpec(f"eval-textcraft_{n}.s0", f"textcraft_{n}", f"eval-textcraft_{n}", 0, 8)
        traj = asyncio.run(run_episode(run_sync_env(env), policy, ChatFormat(tiny_tokenizer), spec, limits))
        assert len(env.turns) == traj.num_turns >= 1
        assert all(rule == "strict" and action in env.listed for action, rule in env.turns)
        accepted += traj.metrics["valid_actions"]
    assert accepted >= 3  # gets of base items and inventory succeed
