"""The steps of one `launch.gpu_check` run in one dtype: sampling, logprobs against the reference, and two weight
updates under load. Returns the figures that `launch.gpu.verdict.checks_of` judges; raises only when a step could
not run at all.

An update under load: long replies are in flight when the update starts, and more requests are sent as soon as
the generator has closed its gate for the engine's pause. Every one of them must come back complete (finish
reason stop or length, at least one token), none aborted or failed, each with the versions its mode promises:
`finish`, one version per reply (old for those that were running, new for those that were queued); `abort`, old
tokens then new ones; the requests sent during the update, the new version only.
"""
from __future__ import annotations

import asyncio
import time

from core.policy import GenerationRequest
from core.weights.tensors import WeightSet
from launch.gpu.compare import NOISE_SCALE, diff_stats, perturbed_state, tensors_of

LONG_TOKENS, SHORT_TOKENS, IN_FLIGHT, DURING = 256, 16, 16, 8


async def check_run(gen, ref, prompts: list[list[int]], max_tokens: int, publisher,
                    collective: dict | None = None) -> dict:
    """Every step of one run. `collective`: {"device", "gpus", "tp", "dtype"} to run `collective_update` last."""
    await gen.ready()
    figures: dict = {}

    async def episode(i: int, prompt: list[int]):
        out = await gen.generate(GenerationRequest(prompt, max_tokens, f"gpu-{i}"))
        await gen.end_session(f"gpu-{i}")  # frees its admission slot for the next prompt
        return out

    t0 = time.monotonic()
    outs = await asyncio.gather(*(episode(i, p) for i, p in enumerate(prompts)))
    elapsed = time.monotonic() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    figures.update({"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed})
    figures["sampled_logprobs"] = diff_stats(
        (o.logprobs, ref.logprobs(p + o.token_ids, len(p))) for p, o in zip(prompts[:4], outs[:4]))
    fixed = prompts[0][:64] + outs[0].token_ids[:16]
    before = await gen.score(fixed)
    figures["fixed_logprobs_before"] = diff_stats([(before, ref.logprobs(fixed))])

    # Update 1, over the weights channel, applied by the generator's own thread in its configured mode (finish).
    state = perturbed_state(ref.state, seed=1, scale=NOISE_SCALE)
    ref.load(state)
    expected = ref.logprobs(fixed)
    figures["update_moves_logprobs_by"] = diff_stats([(before, expected)])
    version = gen.version + 1
    acks: dict = {}

    def publish_and_ack() -> None:
        publisher.publish(version, tensors_of(state))
        acks.update(publisher.wait_acks(version, 120))

    t0 = time.monotonic()
    figures["update_under_load_finish"] = await update_under_load(
        gen, prompts, lambda: asyncio.to_thread(publish_and_ack), version, "finish")
    figures["weight_update_s"] = time.monotonic() - t0
    figures["acks"] = {k: list(v) for k, v in acks.items()}
    figures["fixed_logprobs_after"] = diff_stats([(await gen.score(fixed), expected)])
    out = await gen.generate(GenerationRequest(prompts[1], max_tokens, "gpu-after"))
    await gen.end_session("gpu-after")
    figures["version_after"] = version
    figures["versions_after"] = sorted(set(out.versions))
    figures["sampled_logprobs_after"] = diff_stats(
        [(out.logprobs, ref.logprobs(prompts[1] + out.token_ids, len(prompts[1])))])

    # Update 2, applied directly in `abort` mode: replies are cut at the update and continue on the new weights.
    state = perturbed_state(state, seed=2, scale=NOISE_SCALE)
    weights = WeightSet(version + 1, {t.name: t for t in tensors_of(state)})
    figures["update_under_load_abort"] = await update_under_load(
        gen, prompts, lambda: gen.apply_weights(weights, mode="abort"), version + 1, "abort")
    ref.load(state)
    figures["fixed_logprobs_after_abort_mode"] = diff_stats([(await gen.score(fixed), ref.logprobs(fixed))])
    if collective is not None:
        try:
            from launch.gpu.generator_collective import collective_update

            figures["collective_update"] = await collective_update(gen, ref, fixed, **collective)
        except Exception as exc:  # the other figures stand; checks_of fails the collective checks
            figures["collective_update"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    stats = await gen.get_stats()
    figures["generator"] = {k: stats[k] for k in ("updates", "update_waits", "update_wait_s", "update_wait_timeouts",
                                                  "paused_retries", "paused_retry_failures", "continued", "aborted")}
    return figures


async def update_under_load(gen, prompts: list[list[int]], start_update, new_version: int, mode: str) -> dict:
    """Run `start_update()` with replies in flight and requests arriving during it; count what went wrong."""
    old = gen.version
    before = await gen.get_stats()
    inflight = [asyncio.ensure_future(gen.generate(GenerationRequest(p, LONG_TOKENS, f"{mode}-run-{i}")))
                for i, p in enumerate(_take(prompts, IN_FLIGHT, 0))]
    await asyncio.sleep(0.2)  # decoding
    t0 = time.monotonic()
    update = asyncio.ensure_future(start_update())
    updating = False
    while not updating and not update.done():  # the staging copy first; then the gate closes for the pause
        if time.monotonic() - t0 > 120:
            raise TimeoutError(f"{mode} update: the generator never paused the engine")
        await asyncio.sleep(0.001)
        updating = (await gen.get_stats())["updating"]
    running = sum(not f.done() for f in inflight)
    during = []
    if updating:
        during = [asyncio.ensure_future(gen.generate(GenerationRequest(p, SHORT_TOKENS, f"{mode}-new-{i}")))
                  for i, p in enumerate(_take(prompts, DURING, IN_FLIGHT))]
    results = await asyncio.gather(*inflight, *during, return_exceptions=True)
    await update  # a failed update raises: the run reports it as an error
    update_s = time.monotonic() - t0
    for i in range(len(inflight)):
        await gen.end_session(f"{mode}-run-{i}")
    for i in range(len(during)):
        await gen.end_session(f"{mode}-new-{i}")
    after = await gen.get_stats()
    errors = [f"{type(r).__name__}: {r}"[:200] for r in results if isinstance(r, BaseException)]
    done = [r for r in results if not isinstance(r, BaseException)]
    wrong = 0
    for k, r in enumerate(results):
        if isinstance(r, BaseException) or not r.versions:
            continue
        if k >= len(inflight):
            wrong += r.versions != [new_version] * len(r.versions)
        elif mode == "finish":
            wrong += len(set(r.versions)) != 1 or r.versions[0] not in (old, new_version)
        else:
            wrong += sorted(r.versions) != r.versions or not set(r.versions) <= {old, new_version}
    return {"in_flight": len(inflight), "in_flight_at_update": running, "sent_during": len(during),
            "held": after["update_waits"] - before["update_waits"], "failed": len(errors), "errors": errors[:3],
            "aborted": sum(r.finish_reason == "abort" for r in done) + after["aborted"] - before["aborted"],
            "incomplete": sum(r.finish_reason not in ("stop", "length") or not r.token_ids for r in done),
            "wrong_versions": wrong, "continued": after["continued"] - before["continued"],
            "paused_retries": after["paused_retries"] - before["paused_retries"],
            "update_wait_timeouts": after["update_wait_timeouts"] - before["update_wait_timeouts"],
            "update_s": update_s}


def _take(prompts: list[list[int]], n: int, start: int) -> list[list[int]]:
    return [prompts[(start + i) % len(prompts)] for i in range(n)]
