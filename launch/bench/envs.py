"""Env throughput: `python -m launch.bench envs [--rounds R] [--seconds W] [--slots K]`.

Measured side by side in one run:
- BabyAI steps/s with scripted valid actions, raw (one process, no pool) and through one and two EnvPool
  Ray actors (`--slots` episodes in flight per actor, trajectories sent over ZMQ to a receiver here);
- TextCraft steps/s raw; reset latency p50/p95 of both.
The BabyAI setups take turns in R rounds of W seconds each (raw, one actor, two actors, raw, ...), so load from
elsewhere on the machine hits them alike; each figure is the median over rounds, and the ratios are medians of
the per-round ratios. A fourth setup, raw plus the chat tokenization the rollout loop does per step, is the
baseline of `pool_overhead_babyai`: the pool's own cost, apart from tokenizing observations (beside it,
`pool_overhead_babyai_vs_raw` against the plain raw loop), and CPU
milliseconds per step (`babyai_*_cpu_ms_per_step`, `pool_cpu_overhead_babyai`) show costs that load from other
processes does not distort the way it distorts wall-clock rates. Pooled rates are steady-state: episodes are
fed continuously and the steps of the episodes that finish inside the window are counted.

The scripted replies depend only on the latest observation (a seeded choice among its listed actions), so the
raw and pooled runs play the same kind of episodes. The pooled policy is a ScriptedPolicy that decodes only the
prompt tokens added since its previous call in the episode: decoding the whole conversation every turn (what
ScriptedPolicy itself does) costs more than the env step by the end of an episode, and in a real run that work
is the generator's, not the pool's. The final JSON line holds `pool_overhead_babyai` (pool seconds per step,
one actor, over tokenized raw seconds per step) and `two_actor_speedup` (steps/s of two actors over one);
targets: at most 2 and at least 1.6 on 2 cores. Other env families add their rows and figures through
launch/bench/envs_ii.py (`measure(args) -> (rows, figures)`), when that module exists.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import random
import statistics
import tempfile
import threading
import time
import zlib

from core.stats import percentile
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


class _BackendTokens:
    """The tokenizer calls ScriptedPolicy makes, straight to the Rust tokenizer (same ids, less Python)."""

    def __init__(self, tokenizer):
        self._backend = tokenizer.backend_tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def decode(self, ids, skip_special_tokens=False):
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text, add_special_tokens=False):
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids


def tail_policy(tokenizer, choose):
    """A ScriptedPolicy whose chooser sees only the prompt tokens added since its last call in the session.

    It stands in for the generator, whose work (detokenizing, sampling) is not the pool's: so it is kept cheap,
    decoding only new tokens and calling the Rust tokenizer directly."""
    from core.scripted_policy import ScriptedPolicy

    class TailScriptedPolicy(ScriptedPolicy):
        def __init__(self):
            super().__init__(_BackendTokens(tokenizer), choose)
            self.seen: collections.OrderedDict[str, int] = collections.OrderedDict()

        async def generate(self, request):
            start = self.seen.pop(request.session_id, 0)
            self.seen[request.session_id] = len(request.prompt_ids)
            if len(self.seen) > 10_000:
                self.seen.popitem(last=False)
            return await super().generate(dataclasses.replace(request, prompt_ids=request.prompt_ids[start:]))

    return TailScriptedPolicy()


def raw_window(family: str, seconds: float, horizon: int, start: int, chat=None) -> dict:
    """Episodes in this process with the sync env for `seconds`: steps, time, reset latencies. With `chat` (a
    core.chat.ChatFormat), each observation and reply is also tokenized as the rollout loop must."""
    from environments.babyai.env import BabyAIEnv
    from environments.textcraft.env import TextCraftEnv
    from environments.textcraft.scripted import scripted_reply as textcraft_reply

    env = BabyAIEnv() if family == "babyai" else TextCraftEnv()
    resets, steps, n = [], 0, start
    t0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        r0 = time.perf_counter()
        obs = env.reset(f"{family}_{n}")
        resets.append(time.perf_counter() - r0)
        n += 1
        latest = obs.text
        for _ in range(horizon):
            if family == "babyai":
                reply = babyai_reply(latest)
            else:
                reply = textcraft_reply(obs.text, random.Random(zlib.crc32(latest.encode())))
            result = env.step(reply)
            steps += 1
            if chat is not None:
                chat.encode(reply)
                chat.user_turn(result.observation)
            if result.done:
                break
            latest = result.observation
    return {"episodes": n - start, "steps": steps, "seconds": time.perf_counter() - t0,
            "cpu": time.process_time() - cpu0, "resets": resets}


async def pool_window(supervisor, in_flight: int, seconds: float, horizon: int, start: int) -> dict:
    """Keep `in_flight` episodes running for `seconds`; count the steps of those finishing in the window."""
    from core.rollout import EpisodeSpec

    finished: list[tuple[float, int, str]] = []
    counter = iter(range(start, start + 10**9))

    async def cpu_seconds() -> float:
        stats = await asyncio.gather(*(actor.stats.remote() for actor in supervisor.actors))
        return sum(s["pool/cpu_seconds"] for s in stats)

    cpu0 = await cpu_seconds()
    t0 = time.perf_counter()
    stop = t0 + seconds

    async def lane() -> None:
        while time.perf_counter() < stop:
            n = next(counter)
            summary = await supervisor.run(EpisodeSpec(f"e{n}", f"babyai_{n % 900}", f"g{n}", 0, horizon))
            finished.append((time.perf_counter(), summary.turns, summary.termination))

    async def at_stop() -> float:
        await asyncio.sleep(seconds)
        return await cpu_seconds()

    *_, cpu1 = await asyncio.gather(*(lane() for _ in range(in_flight)), at_stop())
    bad = [t for _, _, t in finished if t not in ("done", "horizon")]
    if bad:
        raise RuntimeError(f"{len(bad)} pooled episodes ended badly: {sorted(set(bad))}")
    inside = [(at, turns) for at, turns, _ in finished if at <= stop]
    return {"episodes": len(inside), "steps": sum(t for _, t in inside), "seconds": seconds, "cpu": cpu1 - cpu0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.bench envs", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measurement window")
    parser.add_argument("--slots", type=int, default=8, help="episodes in flight per actor")
    parser.add_argument("--horizon", type=int, default=20)
    parser.add_argument("--no-pool", action="store_true", help="raw figures only (no Ray)")
    args, args.extra = parser.parse_known_args(argv)  # options of launch/bench/envs_ii.py pass through

    rows, figures = [], {}
    tc = raw_window("textcraft", args.seconds, 30, 0)
    rate = tc["steps"] / tc["seconds"]
    p50, p95 = (1000 * percentile(tc["resets"], q) for q in (0.5, 0.95))
    rows.append(("textcraft raw", tc["episodes"], tc["steps"], tc["seconds"], rate, p50, p95))
    figures.update({"textcraft_raw_steps_per_s": rate, "textcraft_reset_p50_ms": p50,
                    "textcraft_reset_p95_ms": p95})

    runs: dict[str, list[dict]] = collections.defaultdict(list)
    supervisors, stack = {}, contextlib.ExitStack()
    if not args.no_pool:
        chat = stack.enter_context(_pools(args, supervisors))
    with stack:
        for r in range(args.rounds):
            runs["raw"].append(raw_window("babyai", args.seconds, args.horizon, 1000 * r))
            if supervisors:
                runs["tokenized"].append(raw_window("babyai", args.seconds, args.horizon, 1000 * r, chat))
            for k, supervisor in supervisors.items():
                runs[f"pool{k}"].append(asyncio.run(pool_window(supervisor, k * args.slots, args.seconds,
                                                                args.horizon, 100_000 * (k + 1) + 1000 * r)))
    resets = [x for run in runs["raw"] for x in run["resets"]]
    p50, p95 = (1000 * percentile(resets, q) for q in (0.5, 0.95))
    figures.update({"babyai_reset_p50_ms": p50, "babyai_reset_p95_ms": p95})
    rates = {name: [run["steps"] / run["seconds"] for run in rs] for name, rs in runs.items()}
    for name, rs in runs.items():
        labels = {"raw": "babyai raw", "tokenized": "babyai raw + chat tokens"}
        label = labels.get(name, f"babyai pool x{name[4:]}")
        rows.append((label, sum(x["episodes"] for x in rs), sum(x["steps"] for x in rs),
                     sum(x["seconds"] for x in rs), statistics.median(rates[name]),
                     p50 if name == "raw" else "", p95 if name == "raw" else ""))
        figures[f"babyai_{name}_steps_per_s"] = statistics.median(rates[name])
    if supervisors:
        figures["pool_overhead_babyai_vs_raw"] = statistics.median(
            raw / one for raw, one in zip(rates["raw"], rates["pool1"]))
        figures["two_actor_speedup"] = statistics.median(
            two / one for two, one in zip(rates["pool2"], rates["pool1"]))
        # Against a raw loop that also tokenizes what the rollout loop must: the pool's own cost.
        figures["pool_overhead_babyai"] = statistics.median(
            raw / one for raw, one in zip(rates["tokenized"], rates["pool1"]))
        # CPU seconds per step (all threads of the process doing the work) barely move with load from elsewhere.
        cpu = {name: statistics.median(1000 * r["cpu"] / r["steps"] for r in rs) for name, rs in runs.items()}
        figures.update({f"babyai_{name}_cpu_ms_per_step": v for name, v in cpu.items()})
        figures["pool_cpu_overhead_babyai"] = cpu["pool1"] / cpu["raw"]
        figures["rounds"] = args.rounds
    if importlib.util.find_spec("launch.bench.envs_ii") is not None:
        from launch.bench import envs_ii

        more_rows, more_figures = envs_ii.measure(args)
        rows += list(more_rows)
        figures.update(more_figures)
    print(table(HEADERS, rows))
    emit(figures)
    return 0


@contextlib.contextmanager
def _pools(args, supervisors: dict):
    """A local Ray with one 1-actor and one 2-actor pool (0.5 CPU reserved each, so all three fit on 2 CPUs;
    only one pool runs at a time), and a receiver thread draining their trajectories."""
    from transformers import AutoTokenizer

    from configs.env import EnvConfig
    from core.chat import ChatFormat
    from core.rollout import EpisodeLimits, EpisodeSpec
    from core.tiny_model import build_tiny_model
    from core.transport import TrajectoryReceiver
    from launch.job import ray_cluster
    from launch.job.pools import PoolSupervisor

    ray_cluster.connect(num_cpus=2)
    receiver = TrajectoryReceiver(hwm=1024)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            receiver.drain(256, timeout_ms=100)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = str(build_tiny_model(tmp))
            policy = tail_policy(AutoTokenizer.from_pretrained(model_dir), pooled_babyai_reply)
            limits = EpisodeLimits(max_tokens_per_turn=256, max_context_tokens=32768)
            for k in (1, 2):
                cfg = EnvConfig(num_actors=k, slots_per_actor=args.slots, num_cpus_per_actor=0.5)
                supervisors[k] = PoolSupervisor(cfg, policy, model_dir, limits, receiver.endpoints,
                                                name=f"bench{k}")
            for k, supervisor in supervisors.items():
                supervisor.wait_ready()
                warm = [EpisodeSpec(f"w{k}-{n}", f"babyai_{n}", "w", 0, args.horizon)
                        for n in range(2 * k * args.slots)]
                asyncio.run(supervisor.run_many(warm))  # envs built, code paths warm
            yield ChatFormat(AutoTokenizer.from_pretrained(model_dir))
    finally:
        for supervisor in supervisors.values():
            supervisor.shutdown()
        stop.set()
        drainer.join()
        receiver.close()
        ray_cluster.shutdown()
