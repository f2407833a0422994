"""The control plane at scale: `python -m launch.bench scale [--in-flight 100,1000,10000] [--actors 1,2,4]`.

The real coordinator (actors/coordinator.py), env pools (launch/job/pools.py over actors/env_pool.py, Ray actors on
local Ray) and trajectory channel (core/transport.py, ZMQ on loopback) run TextCraft episodes; the model roles are
stand-ins that answer at once (launch/bench/_scale_roles.py): a generator actor that replies with one valid
TextCraft action (`inventory`) and a learner group that takes each batch as the real one does (advantages by
`prepare_samples`, sharded, shipped through Ray to a rank actor that reads every sample) without a model. Each
step is logged as a training run logs it (launch/job/session.py's step callback: metrics.jsonl with the pools'
and generator's stats and each role's RSS, trained.jsonl, the episodes sample). So what is measured is the
control plane: admission, dispatch, the pools' episode loop, the channel, the group buffer, the batch's way to
the learner ranks and the step's logging.

For each number of episodes in flight (the coordinator's groups in flight times the group size) and each number
of env actors, the run fills the pipeline, waits until as many trajectories as are in flight have arrived (one
turnover), then measures for `--seconds` (longer, until `--min-episodes` have ended and arrived, if asked),
then stops admitting and drains every episode. Each actor gets env slots for its share (`env.slots_per_actor` =
in flight / actors), so every episode in flight holds a slot. Reported:
- episodes/s (summaries back at the coordinator) and trajectories/s (filed by it);
- the driver's CPU ms per trajectory (process CPU time of the driver, all its threads, Ray's included), and
  the part of it spent in CPython's cyclic garbage collector (`driver gc ms/traj`; see core/heap.py), and the
  Ray calls the supervisor made per trajectory (`ray calls/traj`: `start` and `finished`, about 2 ms each);
- the pools' CPU ms per env step (their processes' CPU time over the steps taken);
- MB per episode in flight: what one more episode in flight costs. The run first holds a tenth of the level in
  flight for one turnover (which pays the fixed costs: imports on first use, allocator arenas, Ray's and ZMQ's
  buffers), takes the largest RSS (driver plus env actors) seen over a few samples, then fills the level; the
  growth from there to the largest seen while measuring, over the episodes added, is the figure. The fixed part
  (before the run to the tenth) is reported beside it as `fixed MB`;
- admission-to-first-token latency p50/p99 (group admitted -> its episode's first request at the generator);
- failed (an ending other than done/horizon/context, an unsent trajectory, a group discarded for a failure) and
  lost (an admitted episode whose trajectory never arrived, or one refused by the buffer) after the drain.
The JSON line: `scale_max_in_flight` (the largest level at which no run failed or lost an episode), per level
`coordinator_cpu_ms_per_traj_<level>` (the worst over actor counts whose window saw trajectories),
`trajectories_per_s_<level>` (the best), `mb_per_episode_in_flight_<level>` (the mean over actor counts) and
`mb_per_episode_in_flight` (the largest level). With one actor holding thousands of episodes, its episodes move
in waves and a short window can see none end; such a row shows 0 episodes/s and its CPU per trajectory is void.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from core.stats import percentile
from launch.bench.report import emit, table

TRAINABLE = {"done", "horizon", "context_limit"}
HEADERS = ("in flight", "actors", "slots/actor", "mean in flight", "episodes/s", "traj/s", "driver cpu ms/traj",
           "driver gc ms/traj", "ray calls/traj", "pool cpu ms/step", "MB/episode", "driver KB/ep", "actors KB/ep", "fixed MB", "first token p50 ms", "p99 ms",
           "failed", "lost")


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CountingPools:
    """The supervisor as the coordinator sees it, counting how episodes ended."""

    def __init__(self, supervisor: Any):
        self.supervisor = supervisor
        self.endings: collections.Counter[str] = collections.Counter()
        self.unsent = 0
        self.completed = 0
        self.steps = 0

    async def run(self, spec):
        summary = await self.supervisor.run(spec)
        self.completed += 1
        self.steps += summary.turns
        self.endings[summary.termination] += 1
        self.unsent += not summary.sent
        return summary


def step_logger(out: Path, supervisor: Any, generator: Any, pids: list[int], tokenizer_dir: str, turns: int):
    """The training run's own step callback (TrainingSession._on_step) over this bench's roles: the same files
    and the same per-step calls (the pools' and generator's stats, every role's RSS); (callback, close)."""
    from types import SimpleNamespace

    from configs.load import load_config
    from core.horizon import HorizonSchedule
    from core.metrics import JsonlSink
    from launch.job.episodes import EPISODES_FILE, TrainingEpisodes
    from launch.job.progress import Progress
    from launch.job.role_stats import RoleMemory
    from launch.job.roles import Roles
    from launch.job.session import TrainingSession

    cfg = load_config(None, [])
    shim = SimpleNamespace(pools=supervisor, watch=SimpleNamespace(restarts=0), generators=[generator])
    logger = SimpleNamespace(
        cfg=cfg, failures=[], schedule=HorizonSchedule((turns,)), roles=SimpleNamespace(stats=lambda: Roles.stats(shim)),
        memory=RoleMemory(lambda: {"EnvPool": [(pid, True) for pid in pids]}),
        episodes=TrainingEpisodes(out / EPISODES_FILE, tokenizer_dir, cfg.logging.episodes_every,
                                  cfg.logging.episodes_per_sample, cfg.logging.episodes_max_mb),
        metrics=JsonlSink(out / "metrics.jsonl"), wandb=None, trained_log=open(out / "trained.jsonl", "a"),
        progress=Progress(cfg.trainer.total_steps, enabled=False))

    def close() -> None:
        logger.metrics.close()
        logger.trained_log.close()

    return (lambda step, metrics, batch: TrainingSession._on_step(logger, step, metrics, batch)), close


def run_level(in_flight: int, actors: int, args: argparse.Namespace, tokenizer_dir: str,
              reply_ids: list[int]) -> dict[str, Any]:
    import ray

    from actors.coordinator import Coordinator
    from actors.policy_client import PolicyClient
    from configs.env import EnvConfig
    from core.heap import CollectorClock
    from core.horizon import HorizonSchedule
    from core.rollout import EpisodeLimits
    from core.staleness import StalenessGate
    from core.transport import TrajectoryReceiver
    from environments.item_sampler import mix_sampler
    from launch.bench._scale_roles import EchoGenerator, ShippedLearners
    from launch.job.pools import PoolSupervisor

    groups = max(1, in_flight // args.group_size)
    slots = -(-groups * args.group_size // actors)
    # Thousands of episodes on two cores wait long for the CPU: env timeouts are raised so that only a real
    # failure, not a queue, ends an episode.
    env_cfg = EnvConfig(mix={"textcraft": 1.0}, num_actors=actors, slots_per_actor=slots, num_cpus_per_actor=0.01,
                        step_timeout_s=args.env_timeout_s, reset_timeout_s=args.env_timeout_s)
    gen_name = f"scale-echo-{os.getpid()}-{in_flight}-{actors}"
    generator = ray.remote(EchoGenerator).options(name=gen_name, num_cpus=0, max_concurrency=100_000).remote(reply_ids)
    receiver = TrajectoryReceiver(hwm=args.hwm)
    limits = EpisodeLimits(max_tokens_per_turn=32, max_context_tokens=4096)
    supervisor = PoolSupervisor(env_cfg, PolicyClient([generator], names=[gen_name]), tokenizer_dir, limits,
                                receiver.endpoints, num_actors=actors, name=f"scale-pool-{in_flight}")
    supervisor.wait_ready()
    ray.get(generator.get_stats.remote())
    pids = [i["pid"] for i in ray.get([a.info.remote() for a in supervisor.actors])]
    pools = CountingPools(supervisor)
    learners = ShippedLearners(generator)
    log_dir = tempfile.mkdtemp(prefix=f"bench-scale-steps-{in_flight}-{actors}-")
    on_step, close_log = step_logger(Path(log_dir), supervisor, generator, pids, tokenizer_dir,
                                    args.turns)
    admitted: dict[str, float] = {}
    noting = [False]

    def on_started(info) -> None:
        if noting[0]:
            admitted[info.group_id] = time.time()

    batch = max(1, groups // 8)  # a group waits about 8 batches to be trained: eta 16 keeps it fresh
    coordinator = Coordinator(
        pools=pools, learners=learners, receiver=receiver, sampler=mix_sampler(env_cfg, "train", seed=0),
        gate=StalenessGate(16, batch), schedule=HorizonSchedule((args.turns,)), group_size=args.group_size,
        total_steps=1 << 40, max_in_flight=max(1, groups // 10), on_step=on_step, should_checkpoint=lambda s: False,
        save=lambda s: None, on_group_started=on_started)
    base_driver, base_actors = rss_kb(os.getpid()), sum(rss_kb(p) for p in pids)
    out: dict[str, Any] = {"in_flight": groups * args.group_size, "actors": actors, "slots": slots}

    async def rss_peak(samples: int) -> tuple[int, int]:
        driver, actor_sum = 0, 0
        for _ in range(samples):
            driver, actor_sum = max(driver, rss_kb(os.getpid())), max(actor_sum, sum(rss_kb(p) for p in pids))
            await asyncio.sleep(0.5)
        return driver, actor_sum

    async def measure() -> None:
        began = time.monotonic()
        deadline = began + args.warmup_s
        warm_n = coordinator.max_in_flight * args.group_size
        while coordinator._received < warm_n and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        warm_driver, warm_actors = await rss_peak(4)
        out["fixed_mb"] = (warm_driver + warm_actors - base_driver - base_actors) / 1024
        coordinator.max_in_flight = groups
        received_at_fill = coordinator._received
        while coordinator._received - received_at_fill < out["in_flight"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.to_thread(lambda: ray.get(generator.take_first_seen.remote()))
        noting[0] = True
        out["fill_s"] = time.monotonic() - began
        t0, cpu0, recv0, done0, steps0 = time.monotonic(), time.process_time(), coordinator._received, \
            pools.completed, pools.steps
        calls0 = supervisor.counters["pool/start_calls"] + supervisor.counters["pool/collect_calls"]
        pool_cpu0 = sum(cpu_s(p) for p in pids)
        peak_driver, peak_actors, in_flight_seen = 0, 0, []
        with CollectorClock() as collector:
            # the window lasts `--seconds`, and longer (up to `--warmup-s` more) until `--min-episodes` have ended
            # and as many trajectories have reached the coordinator: a rate over a window in which nothing ended
            # (or nothing arrived) says nothing
            limit = args.seconds + args.warmup_s
            while time.monotonic() - t0 < args.seconds or (
                    min(pools.completed - done0, coordinator._received - recv0) < args.min_episodes
                    and time.monotonic() - t0 < limit):
                await asyncio.sleep(0.5)
                peak_driver = max(peak_driver, rss_kb(os.getpid()))
                peak_actors = max(peak_actors, sum(rss_kb(p) for p in pids))
                in_flight_seen.append(coordinator.buffer.in_flight * args.group_size)
        seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
        received, completed = coordinator._received - recv0, pools.completed - done0
        calls = supervisor.counters["pool/start_calls"] + supervisor.counters["pool/collect_calls"] - calls0
        pool_cpu = sum(cpu_s(p) for p in pids) - pool_cpu0
        noting[0] = False
        first = await asyncio.to_thread(lambda: ray.get(generator.take_first_seen.remote()))
        latencies = [t - admitted[sid.rsplit(".a", 1)[0]] for sid, t in first.items()
                     if sid.rsplit(".a", 1)[0] in admitted]
        n = out["in_flight"]
        out.update({
            "mean_in_flight": sum(in_flight_seen) / len(in_flight_seen), "episodes_per_s": completed / seconds,
            "trajectories_per_s": received / seconds, "driver_cpu_ms_per_traj": 1000 * cpu / max(1, received),
            "driver_gc_ms_per_traj": 1000 * collector.seconds / max(1, received),
            "ray_calls_per_traj": calls / max(1, received),
            "pool_cpu_ms_per_step": 1000 * pool_cpu / max(1, pools.steps - steps0),
            "driver_kb_per_episode": (peak_driver - warm_driver) / max(1, n - warm_n),
            "actors_kb_per_episode": (peak_actors - warm_actors) / max(1, n - warm_n),
            "first_token_p50_ms": 1000 * percentile(latencies, 0.5),
            "first_token_p99_ms": 1000 * percentile(latencies, 0.99)})
        out["mb_per_episode"] = (out["driver_kb_per_episode"] + out["actors_kb_per_episode"]) / 1024
        coordinator.max_in_flight = 0  # drain: no new groups; every episode admitted must come back
        drain_from = time.monotonic()
        while (coordinator.buffer.in_flight or coordinator._episodes) and time.monotonic() < drain_from + args.drain_s:
            await asyncio.sleep(0.2)
        out["drain_s"] = time.monotonic() - drain_from
        coordinator.stop_requested = True

    async def main() -> None:
        watcher = asyncio.ensure_future(measure())
        try:
            await coordinator.run()
        finally:
            if not watcher.done():
                watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    error = ""
    started = time.monotonic()
    try:
        asyncio.run(main())
    except Exception as exc:  # reported as a failed level, with its cause
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        out["run_s"] = time.monotonic() - started
        close_log()
        out["steps_logged"] = sum(1 for _ in open(Path(log_dir) / "metrics.jsonl"))
        out["rank_tokens"] = learners.rank_tokens  # what the rank actors read: the batches did reach them
        out["samples_with_advantages"] = learners.samples_with_advantages
        shutil.rmtree(log_dir, ignore_errors=True)
        supervisor.shutdown()
        for rank in learners.ranks:
            ray.kill(rank)
        ray.kill(generator)
        receiver.close()
        out["shutdown_s"] = time.monotonic() - started - out["run_s"]
    buf = coordinator.buffer
    failed_endings = sum(c for e, c in pools.endings.items() if e not in TRAINABLE)
    discarded = sum(c for r, c in buf.discarded.items() if r != "stale")
    out["failed"] = failed_endings + pools.unsent + discarded + int(supervisor.counters.get("pool/lost", 0)) \
        + bool(error)
    out["lost"] = buf.in_flight * args.group_size + buf.orphans + sum(buf.rejected.values()) \
        + learners.trained_twice * args.group_size
    out["stale_groups"] = buf.discarded.get("stale", 0)
    out["error"] = error
    return out


def row(r: dict[str, Any]) -> list:
    return [r["in_flight"], r["actors"], r["slots"], r.get("mean_in_flight", 0.0), r.get("episodes_per_s", 0.0),
            r.get("trajectories_per_s", 0.0), r.get("driver_cpu_ms_per_traj", 0.0), r.get("driver_gc_ms_per_traj", 0.0),
            r.get("ray_calls_per_traj", 0.0),
            r.get("pool_cpu_ms_per_step", 0.0), r.get("mb_per_episode", 0.0), r.get("driver_kb_per_episode", 0.0),
            r.get("actors_kb_per_episode", 0.0), r.get("fixed_mb", 0.0), r.get("first_token_p50_ms", 0.0), r.get("first_token_p99_ms", 0.0),
            r["failed"], r["lost"]]


def figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    by_level: dict[int, list[dict]] = collections.defaultdict(list)
    for r in results:
        by_level[r["in_flight"]].append(r)
    out: dict[str, Any] = {"scale_max_in_flight": max(
        [n for n, rs in by_level.items() if all(r["failed"] == 0 and r["lost"] == 0 for r in rs)], default=0)}
    for n, rs in sorted(by_level.items()):
        key = f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)
        timed = [r for r in rs if r.get("trajectories_per_s", 0.0) > 0] or rs  # a window with none measures nothing
        out[f"coordinator_cpu_ms_per_traj_{key}"] = max(r.get("driver_cpu_ms_per_traj", 0.0) for r in timed)
        out[f"trajectories_per_s_{key}"] = max(r.get("trajectories_per_s", 0.0) for r in rs)
        out[f"mb_per_episode_in_flight_{key}"] = sum(r.get("mb_per_episode", 0.0) for r in rs) / len(rs)
        out[f"fixed_mb_{key}"] = sum(r.get("fixed_mb", 0.0) for r in rs) / len(rs)
        out[f"first_token_p99_ms_{key}"] = max(r.get("first_token_p99_ms", 0.0) for r in rs)
        out[f"pool_cpu_ms_per_step_{key}"] = sum(r.get("pool_cpu_ms_per_step", 0.0) for r in rs) / len(rs)
    if by_level:
        top = max(by_level)
        key = f"{top // 1000}k" if top >= 1000 and top % 1000 == 0 else str(top)
        out["mb_per_episode_in_flight"] = out[f"mb_per_episode_in_flight_{key}"]
    return out


def reply_tokens(tokenizer_dir: str) -> list[int]:
    """The stand-in generator's one reply (a valid TextCraft action), ending with the end-of-turn token."""
    from transformers import AutoTokenizer

    from launch.bench._scale_roles import TEXTCRAFT_REPLY

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return list(tok.encode(TEXTCRAFT_REPLY, add_special_tokens=False)) + [tok.eos_token_id]


def run_all(levels: list[int], actor_counts: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    from core.tiny_model import build_tiny_model
    from launch.job import ray_cluster

    ray_cluster.connect(num_cpus=64, quiet=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tokenizer_dir = str(build_tiny_model(tmp))
        reply_ids = reply_tokens(tokenizer_dir)
        for n in levels:
            for a in actor_counts:
                r = run_level(n, a, args, tokenizer_dir, reply_ids)
                print(table(HEADERS, [row(r)]).splitlines()[-1] + (f"  {r['error']}" if r["error"] else ""),
                      flush=True)
                results.append(r)
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launch.bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--in-flight", default="100,1000,10000", help="episodes in flight, comma-separated")
    p.add_argument("--actors", default="1,2,4", help="env actor counts, comma-separated")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=2, help="turns per episode (the horizon)")
    p.add_argument("--seconds", type=float, default=10.0, help="measuring window per run")
    p.add_argument("--min-episodes", type=int, default=0,
                   help="keep measuring past --seconds (up to --warmup-s more) until this many episodes have ended")
    p.add_argument("--warmup-s", type=float, default=150.0, help="at most this long to fill the pipeline")
    p.add_argument("--drain-s", type=float, default=120.0, help="at most this long to drain it")
    p.add_argument("--env-timeout-s", type=float, default=900.0, help="env.step_timeout_s and reset_timeout_s")
    p.add_argument("--hwm", type=int, default=64, help="the trajectory channel's high-water mark")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    levels = [int(x) for x in args.in_flight.split(",")]
    actor_counts = [int(x) for x in args.actors.split(",")]
    print("the model roles are stand-ins that answer at once (a generator replying TextCraft's `inventory`, "
          f"a learner group taking each batch through prepare_samples and Ray to a rank that reads it, every step "
          f"logged as a run logs it): the control plane is what is measured; {args.turns} turns "
          f"per episode, groups of {args.group_size}, env slots per actor = in flight / actors", flush=True)
    print(table(HEADERS, []), flush=True)
    results = run_all(levels, actor_counts, args)
    print(table(HEADERS, [row(r) for r in results]))
    emit(figures(results))
    return 0
