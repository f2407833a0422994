"""The contract every registered env family keeps, checked over `available_families()`.

How a family takes part (hooks in its `FAMILY.extras`):
- `"scripted_reply": Callable[[str, random.Random], str]` (required): a plausible, usually valid reply given
  text that holds the first observation and the latest one (the test passes both, joined by a newline).
- `"contract_items": list[str]` (optional): item ids to run; default `[f"{name}_0"]`.
- `"contract_context": Callable[[family_cfg], ContextManager[family_cfg]]` (optional): sets up what the family
  needs (e.g. a local server) and yields the family config to use; default: the config section as is.
- `"max_instances_per_actor": Callable[[family_cfg], int]` (optional, for heavy instances such as JVMs or
  browser contexts): the env pool never holds more live envs of the family than this per actor.

For each item: reset gives a non-empty observation; steps with scripted replies run to done or to the
family's reference turn limit; each StepResult is well-formed (finite reward, a known parse rule); bad output
is answered, not raised; close works. One episode per family also runs through the real rollout loop, whose
record must validate and carry a termination reason.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import random

import pytest

from configs.env import EnvConfig
from core.chat import ChatFormat
from core.env import Observation, StepResult
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.scripted_policy import ScriptedPolicy
from core.trajectory import Termination
from environments.registry import available_families, get_family

FAMILIES = available_families()


def _context(family, cfg):
    hook = family.extras.get("contract_context")
    return hook(cfg) if hook else contextlib.nullcontext(cfg)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_keeps_the_env_contract(name):
    family = get_family(name)
    assert callable(family.extras.get("scripted_reply")), f"{name}: FAMILY.extras needs a 'scripted_reply' hook"
    assert family.reference_max_turns >= 1
    reply_for = family.extras["scripted_reply"]
    items = family.extras.get("contract_items", [f"{name}_0"])
    rng = random.Random(0)

    async def episode(env, item: str) -> None:
        obs = await env.reset(item)
        assert isinstance(obs, Observation) and isinstance(obs.text, str) and obs.text.strip(), item
        assert isinstance(obs.instruction, str)
        bad = await env.step("")
        assert isinstance(bad, StepResult) and not bad.valid_action and not bad.done and bad.observation
        assert bad.reward == 0.0 and bad.parse_rule == "none"
        latest = obs.text
        for _ in range(family.reference_max_turns):
            result = await env.step(reply_for(obs.text + "\n" + latest, rng))
            assert isinstance(result, StepResult) and isinstance(result.observation, str)
            assert math.isfinite(result.reward) and isinstance(result.done, bool)
            assert isinstance(result.valid_action, bool) and result.parse_rule in ("strict", "lenient", "none")
            assert result.score is None or math.isfinite(result.score)
            if result.done:
                assert isinstance(result.success, bool)
                break
            latest = result.observation

    async def main(cfg) -> None:
        env = family.make_env(cfg)
        try:
            for item in items:
                await episode(env, item)
        finally:
            await env.close()

    with _context(family, getattr(EnvConfig(), name)) as cfg:
        asyncio.run(main(cfg))


@pytest.mark.parametrize("name", FAMILIES)
def test_family_runs_through_the_rollout_loop(name, tiny_tokenizer):
    family = get_family(name)
    reply_for = family.extras["scripted_reply"]
    rng = random.Random(1)
    policy = ScriptedPolicy(tiny_tokenizer, lambda text: reply_for(text, rng))
    item = family.extras.get("contract_items", [f"{name}_0"])[0]
    spec = EpisodeSpec(f"contract-{name}", item, "g", 0, family.reference_max_turns)
    limits = EpisodeLimits(max_tokens_per_turn=256, max_context_tokens=32768)

    async def main(cfg):
        env = family.make_env(cfg)
        try:
            return await run_episode(env, policy, ChatFormat(tiny_tokenizer), spec, limits)
        finally:
            await env.close()

    with _context(family, getattr(EnvConfig(), name)) as cfg:
        traj = asyncio.run(main(cfg))
    traj.validate()
    assert traj.termination in (Termination.DONE, Termination.HORIZON, Termination.CONTEXT), traj.termination
    assert traj.num_turns >= 1 and traj.env == name
    assert all(math.isfinite(r) for r in traj.turn_rewards)
