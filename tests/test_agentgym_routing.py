"""Which family runs an item id when an AgentGym server is configured (environments.item_sampler.family_of),
and that the env pool does what those rules say: real envs, a BabyAI-format server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from actors.env_pool import EnvPool
from configs.env import EnvConfig, HTTPEnvConfig
from core.rollout import EpisodeLimits, EpisodeSpec
from core.scripted_policy import ScriptedPolicy
from environments.agentgym_http.client import AgentGymHTTPEnv
from environments.item_sampler import family_of
from tests.agentgym_reference_server import serve


def _cfg(mix: dict[str, float], task: str = "babyai", url: str = "") -> EnvConfig:
    return EnvConfig(mix=mix, agentgym_http=HTTPEnvConfig(url=url, task=task))


@pytest.mark.parametrize("mix, task, item, family", [
    ({"agentgym_http": 1.0}, "babyai", "babyai_3", "agentgym_http"),  # the server's own ids
    ({"agentgym_http": 1.0}, "babyai", "agentgym_http_3", "agentgym_http"),
    ({"agentgym_http": 1.0}, "babyai", "textcraft_3", "textcraft"),  # not its task: the built-in family
    ({"babyai": 1.0, "agentgym_http": 1.0}, "babyai", "babyai_3", "babyai"),  # in the mix: keeps its ids
    ({"babyai": 1.0, "agentgym_http": 1.0}, "babyai", "agentgym_http_3", "agentgym_http"),
    ({"babyai": 1.0}, "babyai", "babyai_3", "babyai"),
    ({"babyai": 1.0}, "", "babyai_3", "babyai"),
    ({"agentgym_http": 1.0}, "webshop", "webshop_12", "agentgym_http"),  # a task with no built-in family
])
def test_id_rules(mix, task, item, family):
    assert family_of(item, _cfg(mix, task)) == family


@pytest.mark.parametrize("item", ["webshop_12", "agentgym_http", "babyai-3"])
def test_ids_no_rule_covers_are_refused(item):
    with pytest.raises(ValueError, match="item id|not of the form"):
        family_of(item, _cfg({"babyai": 1.0}, task="babyai"))


def test_the_client_refuses_another_tasks_ids():
    async def main():
        env = AgentGymHTTPEnv("http://127.0.0.1:9", "babyai", timeout_s=1)  # no request is made
        with pytest.raises(ValueError, match="textcraft_3"):
            await env.reset("textcraft_3")
        await env.close()
    asyncio.run(main())


def test_the_pool_routes_ids_as_the_rules_say(tiny_model_dir, tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, lambda text: "Thought:\nThere.\n\nAction:\ngo to red ball 1")
    limits = EpisodeLimits(max_tokens_per_turn=64, max_context_tokens=8192)

    def run(cfg: EnvConfig, items: list[str]):
        pool = EnvPool(cfg, policy, str(tiny_model_dir), limits, None, "routing-pool")

        async def main():
            try:
                return [await pool.run(EpisodeSpec(f"t-{i}", item, f"g-{i}", 0, horizon=3))
                        for i, item in enumerate(items)]
            finally:
                await pool.close()
        return asyncio.run(main()), pool.stats()

    with serve("babyai", "babyai") as server:
        http_only = _cfg({"agentgym_http": 1.0}, url=server.url)
        summaries, stats = run(http_only, ["babyai_1", "agentgym_http_1"])
        assert [s.family for s in summaries] == ["agentgym_http"] * 2 and all(s.success for s in summaries)
        assert stats.get("env/agentgym_http/episodes") == 2 and "env/babyai/episodes" not in stats
        assert server.server.requests.count("POST /step") == 2

        both = dataclasses.replace(http_only, mix={"babyai": 1.0, "agentgym_http": 1.0})
        summaries, stats = run(both, ["babyai_1", "agentgym_http_1"])
        assert [s.family for s in summaries] == ["babyai", "agentgym_http"]
        assert all(s.success for s in summaries)
        assert stats.get("env/babyai/episodes") == 1 and stats.get("env/agentgym_http/episodes") == 1
        assert server.server.requests.count("POST /step") == 3  # only agentgym_http_1 reached the server
