"""Batched dispatch on an env pool: `start` runs many episodes from one call and `finished` hands each outcome
back exactly once, an episode that raised as a named error (in process: the Ray path is in test_env_pool and
test_scale_bench)."""
from __future__ import annotations

import asyncio
import dataclasses
import random

from actors.env_pool import EnvPool
from actors.episode_summary import EpisodeSummary
from configs.env import EnvConfig
from core.rollout import EpisodeLimits, EpisodeSpec
from core.scripted_policy import ScriptedPolicy
from environments.textcraft.scripted import scripted_reply


def test_start_runs_a_batch_and_finished_returns_each_outcome_once(tiny_model_dir, tiny_tokenizer):
    rng = random.Random(0)
    policy = ScriptedPolicy(tiny_tokenizer, lambda text: scripted_reply(text, rng))
    pool = EnvPool(EnvConfig(mix={"textcraft": 1.0}, slots_per_actor=3), policy, str(tiny_model_dir),
                   EpisodeLimits(max_tokens_per_turn=64, max_context_tokens=8192), None, "batch-pool")
    specs = [EpisodeSpec(f"t{n}", f"textcraft_{n}", f"g{n}", 0, 2) for n in range(7)]
    specs.append(EpisodeSpec("bad", "nosuchfamily_1", "gbad", 0, 2))

    async def main():
        assert await pool.start([specs[0], *(dataclasses.astuple(s) for s in specs[1:])]) == pool.incarnation
        outcomes = []
        while len(outcomes) < len(specs):
            got = await pool.finished(wait_s=5.0, linger_s=0.01)
            assert got, "no outcome within 5 s"
            outcomes += got
        assert await pool.finished(wait_s=0.05) == []  # each outcome is handed back once
        return outcomes

    outcomes = asyncio.run(main())
    by_id = {tid: (fields and EpisodeSummary(*fields), error) for tid, fields, error in outcomes}
    assert len(outcomes) == len(by_id) == 8
    for n in range(7):
        summary, error = by_id[f"t{n}"]
        assert error == "" and summary.termination in ("done", "horizon") and summary.turns <= 2
    summary, error = by_id["bad"]
    assert summary is None and "batch-pool" in error and "nosuchfamily" in error
    assert pool.in_flight == 0
