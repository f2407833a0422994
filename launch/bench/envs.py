"""Env throughput: `python -m launch.bench envs [--raw-episodes N] [--pool-episodes N] [--slots K]`.

Measured side by side in one run:
- BabyAI steps/s with scripted valid actions, raw (one process, no pool) and through one and two EnvPool
  Ray actors (1 CPU each, `--slots` episodes per actor, trajectories sent over ZMQ to a receiver here);
- TextCraft steps/s raw; reset latency p50/p95 of both.
The scripted replies depend only on the latest observation (a seeded choice among its listed actions), so the
raw and pooled runs play the same episodes. The pooled policy is a ScriptedPolicy that decodes only the prompt
tokens added since its previous call in the episode: decoding the whole conversation every turn (what
ScriptedPolicy itself does) costs more than the env step by the end of an episode, and in a real run that work
is the generator's, not the pool's. Chat tokenization of each observation stays in the pooled figures: a real
run pays it in the pool too. The final JSON line holds `pool_overhead_babyai` (pool seconds per step, one
actor, over raw seconds per step) and `two_actor_speedup` (steps/s of two actors over one); targets:
at most 2 and at least 1.6 on 2 cores. Other env families add their rows and figures through
launch/bench/envs_ii.py (`measure(args) -> (rows, figures)`), when that module exists.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import importlib.util
import random
import statistics
import tempfile
import threading
import time
import zlib

from launch.bench.report import emit, table

HEADERS = ("measurement", "episodes", "steps", "seconds", "steps/s", "reset p50 ms", "reset p95 ms")


def latest_observation(conversation: str) -> str:
    """The last user turn of a ChatML conversation (the tiny test model's template)."""
    return conversation.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]


def babyai_reply(observation: str) -> str:
    from environments.babyai.scripted import scripted_reply

    return scripted_reply(observation, random.Random(zlib.crc32(observation.encode())))


def pooled_babyai_reply(conversation: str) -> str:
    return babyai_reply(latest_observation(conversation))


def tail_policy(tokenizer, choose):
    """A ScriptedPolicy whose chooser sees only the prompt tokens added since its last call in the session."""
    from core.scripted_policy import ScriptedPolicy

    class TailScriptedPolicy(ScriptedPolicy):
        def __init__(self):
            super().__init__(tokenizer, choose)
            self.seen: collections.OrderedDict[str, int] = collections.OrderedDict()

        async def generate(self, request):
            start = self.seen.pop(request.session_id, 0)
            self.seen[request.session_id] = len(request.prompt_ids)
            if len(self.seen) > 10_000:
                self.seen.popitem(last=False)
            return await super().generate(dataclasses.replace(request, prompt_ids=request.prompt_ids[start:]))

    return TailScriptedPolicy()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def raw_run(family: str, episodes: int, horizon: int) -> dict:
    """Episodes in this process with the sync env: steps, seconds spent, reset latencies."""
    from environments.babyai.env import BabyAIEnv
    from environments.textcraft.env import TextCraftEnv
    from environments.textcraft.scripted import scripted_reply as textcraft_reply

    env = BabyAIEnv() if family == "babyai" else TextCraftEnv()
    resets, steps = [], 0
    t0 = time.perf_counter()
    for n in range(episodes):
        r0 = time.perf_counter()
        obs = env.reset(f"{family}_{n}")
        resets.append(time.perf_counter() - r0)
        latest = obs.text
        for _ in range(horizon):
            if family == "babyai":
                reply = babyai_reply(latest)
            else:
                reply = textcraft_reply(obs.text, random.Random(zlib.crc32(latest.encode())))
            result = env.step(reply)
            steps += 1
            if result.done:
                break
            latest = result.observation
    return {"episodes": episodes, "steps": steps, "seconds": time.perf_counter() - t0, "resets": resets}


def pool_run(actors: int, episodes: int, slots: int, horizon: int, model_dir: str) -> dict:
    """BabyAI episodes through `actors` EnvPool Ray actors; the clock covers dispatch to last summary."""
    from transformers import AutoTokenizer

    from configs.env import EnvConfig
    from core.rollout import EpisodeLimits, EpisodeSpec
    from core.transport import TrajectoryReceiver
    from launch.pools import PoolSupervisor

    receiver = TrajectoryReceiver(hwm=1024)
    received = [0]
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            received[0] += len(receiver.drain(256, timeout_ms=100))

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    cfg = EnvConfig(num_actors=actors, slots_per_actor=slots, num_cpus_per_actor=1.0)
    policy = tail_policy(AutoTokenizer.from_pretrained(model_dir), pooled_babyai_reply)
    limits = EpisodeLimits(max_tokens_per_turn=256, max_context_tokens=32768)
    supervisor = PoolSupervisor(cfg, policy, model_dir, limits, receiver.endpoint, name=f"bench{actors}")
    try:
        supervisor.wait_ready()
        warm = [EpisodeSpec(f"w{actors}-{n}", f"babyai_{n}", "w", 0, horizon) for n in range(slots * actors)]
        asyncio.run(supervisor.run_many(warm))  # envs built, code paths warm
        specs = [EpisodeSpec(f"b{actors}-{n}", f"babyai_{n}", "b", 0, horizon) for n in range(episodes)]
        t0 = time.perf_counter()
        summaries = asyncio.run(supervisor.run_many(specs))
        seconds = time.perf_counter() - t0
    finally:
        supervisor.shutdown()
        stop.set()
        drainer.join()
        receiver.close()
    bad = [s for s in summaries if s.termination not in ("done", "horizon")]
    if bad:
        raise RuntimeError(f"{len(bad)} pooled episodes ended badly, e.g. {bad[0]}")
    return {"episodes": episodes, "steps": sum(s.turns for s in summaries), "seconds": seconds,
            "received": received[0]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.bench envs", description=__doc__.splitlines()[0])
    parser.add_argument("--raw-episodes", type=int, default=200)
    parser.add_argument("--pool-episodes", type=int, default=200)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=20)
    parser.add_argument("--no-pool", action="store_true", help="raw figures only (no Ray)")
    args, args.extra = parser.parse_known_args(argv)  # options of launch/bench/envs_ii.py pass through

    rows, figures = [], {}
    for family in ("babyai", "textcraft"):
        run = raw_run(family, args.raw_episodes, 30 if family == "textcraft" else args.horizon)
        rate = run["steps"] / run["seconds"]
        p50, p95 = (1000 * _percentile(run["resets"], q) for q in (0.5, 0.95))
        rows.append((f"{family} raw", run["episodes"], run["steps"], run["seconds"], rate, p50, p95))
        figures.update({f"{family}_raw_steps_per_s": rate, f"{family}_reset_p50_ms": p50,
                        f"{family}_reset_p95_ms": p95})
    if not args.no_pool:
        from core.tiny_model import build_tiny_model
        from launch import ray_cluster

        ray_cluster.connect(num_cpus=2)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                model_dir = str(build_tiny_model(tmp))
                runs = {k: pool_run(k, args.pool_episodes, args.slots, args.horizon, model_dir) for k in (1, 2)}
        finally:
            ray_cluster.shutdown()
        for k, run in runs.items():
            rate = run["steps"] / run["seconds"]
            rows.append((f"babyai pool x{k}", run["episodes"], run["steps"], run["seconds"], rate, "", ""))
            figures[f"babyai_pool{k}_steps_per_s"] = rate
            figures[f"babyai_pool{k}_trajectories_received"] = run["received"]
        figures["pool_overhead_babyai"] = figures["babyai_raw_steps_per_s"] / figures["babyai_pool1_steps_per_s"]
        figures["two_actor_speedup"] = figures["babyai_pool2_steps_per_s"] / figures["babyai_pool1_steps_per_s"]
    if importlib.util.find_spec("launch.bench.envs_ii") is not None:
        from launch.bench import envs_ii

        more_rows, more_figures = envs_ii.measure(args)
        rows += list(more_rows)
        figures.update(more_figures)
    print(table(HEADERS, rows))
    emit(figures)
    return 0
