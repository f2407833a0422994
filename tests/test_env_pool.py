"""Env pools: slots, env replacement on errors and hangs, trajectories on ZMQ, and Ray actors that die.

The failing envs here are real BabyAI envs with one method made to raise or hang: there is no way to make the
real simulator fail on cue, and the pool's handling is what is under test.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time

import pytest

from actors.env_pool import EnvPool
from configs.env import EnvConfig
from core.env import InlineEnv, ThreadedEnv, run_sync_env
from core.rollout import EpisodeLimits, EpisodeSpec
from core.scripted_policy import ScriptedPolicy
from core.transport import TrajectoryReceiver
from environments.babyai.env import BabyAIEnv
from environments.babyai.scripted import scripted_reply
from environments.registry import get_family, make_env

LIMITS = EpisodeLimits(max_tokens_per_turn=128, max_context_tokens=16384)


def spec(n: int, item: str | None = None, horizon: int = 20) -> EpisodeSpec:
    return EpisodeSpec(f"traj-{n}", item or f"babyai_{n}", f"group-{n}", 0, horizon)


def policy(tokenizer, delay_s: float = 0.0) -> ScriptedPolicy:
    rng = random.Random(0)
    return ScriptedPolicy(tokenizer, lambda text: scripted_reply(text, rng), delay_s=delay_s)


class Tracked:
    """Counts envs alive and episodes running at once, and can make chosen envs raise or hang."""

    def __init__(self, raise_in: set[int] = frozenset(), hang_in: set[int] = frozenset()):
        self.raise_in, self.hang_in = raise_in, hang_in
        self.built = 0
        self.release = threading.Event()

    def __call__(self, family, cfg):
        index = self.built
        self.built += 1
        tracked = self

        class Env(BabyAIEnv):
            steps = 0
            inline = False  # it can hang, unlike BabyAI itself: on a worker thread, where a timeout reaches it

            def step(self, reply):
                self.steps += 1
                if index in tracked.raise_in and self.steps == 2:
                    raise RuntimeError("simulator crashed")
                if index in tracked.hang_in and self.steps == 2:
                    tracked.release.wait(60)
                return super().step(reply)

        return run_sync_env(Env(parse_mode=cfg.babyai.parse_mode))


def make_pool(model_dir, tokenizer, slots=4, factory=None, endpoint=None, step_timeout_s=30.0, delay_s=0.0):
    cfg = EnvConfig(slots_per_actor=slots, step_timeout_s=step_timeout_s)
    return EnvPool(cfg, policy(tokenizer, delay_s), str(model_dir), LIMITS, endpoint, "test-pool",
                   env_factory=factory, close_timeout_s=1.0)


def test_episodes_run_in_slots_and_trajectories_arrive(tiny_model_dir, tiny_tokenizer):
    receiver = TrajectoryReceiver()
    pool = make_pool(tiny_model_dir, tiny_tokenizer, slots=3, endpoint=receiver.endpoint, delay_s=0.01)
    peak = 0

    async def main():
        nonlocal peak
        tasks = [asyncio.ensure_future(pool.run(spec(n))) for n in range(9)]
        while not all(t.done() for t in tasks):
            peak = max(peak, pool.in_flight)
            await asyncio.sleep(0.005)
        await pool.close()
        return [t.result() for t in tasks]

    summaries = asyncio.run(main())
    got = receiver.drain(20, timeout_ms=5000)
    receiver.close()
    assert peak == 3
    assert sorted(t.trajectory_id for t in got) == sorted(s.trajectory_id for s in summaries)
    assert all(s.sent and s.termination in ("done", "horizon") for s in summaries)
    by_id = {t.trajectory_id: t for t in got}
    for s in summaries:
        assert by_id[s.trajectory_id].total_reward == pytest.approx(s.reward) and s.turns >= 1
    stats = pool.stats()
    assert stats["env/babyai/episodes"] == 9 and stats["pool/sent"] == 9
    assert stats["env/babyai/created"] == 3  # envs are reused across episodes


def test_raising_env_is_replaced_and_counted(tiny_model_dir, tiny_tokenizer):
    factory = Tracked(raise_in={0})
    pool = make_pool(tiny_model_dir, tiny_tokenizer, slots=1, factory=factory)

    async def main():
        return [await pool.run(spec(n)) for n in range(3)]

    summaries = asyncio.run(main())
    assert summaries[0].termination == "env_error" and summaries[0].turns == 2
    assert [s.termination for s in summaries[1:]] != ["env_error"] * 2
    stats = pool.stats()
    assert stats["env/babyai/errors"] == 1 and stats["env/babyai/replaced"] == 1
    assert stats["env/babyai/created"] == 2 and stats["pool/termination/env_error"] == 1


def test_hanging_step_times_out_and_is_counted(tiny_model_dir, tiny_tokenizer):
    factory = Tracked(hang_in={0})
    pool = make_pool(tiny_model_dir, tiny_tokenizer, slots=2, factory=factory, step_timeout_s=0.5)
    try:
        async def main():
            t0 = time.monotonic()
            first = await pool.run(spec(0))
            return first, time.monotonic() - t0, await pool.run(spec(1))

        first, took, second = asyncio.run(main())
    finally:
        factory.release.set()
    assert first.termination == "env_timeout" and took < 15
    assert second.termination in ("done", "horizon")
    stats = pool.stats()
    assert stats["env/babyai/timeouts"] == 1 and stats["env/babyai/replaced"] == 1
    assert stats["env/babyai/close_failures"] == 1  # the hung env could not even close: abandoned


def test_unbuildable_env_ends_as_env_error(tiny_model_dir, tiny_tokenizer):
    def factory(family, cfg):
        raise OSError("no simulator here")

    pool = make_pool(tiny_model_dir, tiny_tokenizer, factory=factory)
    summary = asyncio.run(pool.run(spec(0)))
    assert summary.termination == "env_error" and pool.stats()["env/babyai/errors"] == 1


def test_max_instances_per_actor_is_honoured(tiny_model_dir, tiny_tokenizer, monkeypatch):
    monkeypatch.setitem(get_family("textcraft").extras, "max_instances_per_actor", lambda cfg: 2)
    pool = make_pool(tiny_model_dir, tiny_tokenizer, slots=6, delay_s=0.01)
    live = {"now": 0, "peak": 0}
    original = pool._factory

    def counting(family, cfg):
        env = original(family, cfg)
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        return env

    pool._factory = counting

    async def main():
        return await asyncio.gather(*(pool.run(spec(n, f"textcraft_{n}", horizon=5)) for n in range(6)))

    summaries = asyncio.run(main())
    assert len(summaries) == 6 and live["peak"] == 2
    assert pool.stats()["env/textcraft/created"] == 2


def test_a_blocked_send_does_not_block_the_event_loop(tiny_model_dir, tiny_tokenizer):
    pool = make_pool(tiny_model_dir, tiny_tokenizer, slots=2)

    class FullChannel:
        """Stands in for a channel at its high-water mark (the real blocking is the transport's, tested
        with it): each send blocks, then gives up as TrajectorySender does."""

        def send(self, traj, timeout_ms=None):
            time.sleep(0.5)
            raise TimeoutError("trajectory channel full")

    pool._sender = FullChannel()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async def main():
        tick = asyncio.ensure_future(ticker())
        summaries = await asyncio.gather(pool.run(spec(1)), pool.run(spec(2)))
        tick.cancel()
        return summaries

    summaries = asyncio.run(main())
    assert not any(s.sent for s in summaries) and pool.stats()["pool/send_timeouts"] == 2
    assert ticks >= 30  # the loop kept turning while both sends were stuck


# -- Ray ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    from launch.job import ray_cluster

    ray_cluster.connect(num_cpus=2)
    yield
    ray_cluster.shutdown()


def test_killed_actor_is_survived_and_its_episodes_reported_lost(ray_local, tiny_model_dir, tiny_tokenizer):
    import ray

    from launch.job.pools import PoolSupervisor

    receiver = TrajectoryReceiver()
    cfg = EnvConfig(num_actors=2, slots_per_actor=3, max_actor_restarts=2)
    supervisor = PoolSupervisor(cfg, policy(tiny_tokenizer, delay_s=0.05), str(tiny_model_dir), LIMITS,
                                receiver.endpoint, name="kill-test")
    try:
        supervisor.wait_ready()
        old_pid = ray.get(supervisor.actors[0].info.remote())["pid"]

        async def main():
            tasks = [asyncio.ensure_future(supervisor.run(spec(n))) for n in range(10)]
            while len(supervisor.in_flight()["kill-test-0"]) < 2:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            doomed = set(supervisor.in_flight()["kill-test-0"])
            os.kill(old_pid, signal.SIGKILL)
            first = await asyncio.gather(*tasks)
            deadline = time.monotonic() + 120
            while supervisor._down and time.monotonic() < deadline:  # Ray restarts it
                await asyncio.sleep(0.2)
            second = await supervisor.run_many([spec(n) for n in range(10, 16)])
            return doomed, first, second

        doomed, first, second = asyncio.run(main())
        lost = {s.trajectory_id for s in first if s.termination == "lost"}
        assert lost and lost <= doomed, (lost, doomed)
        assert all(s.termination in ("done", "horizon") for s in first if s.trajectory_id not in lost)
        assert all(s.family == "babyai" and s.actor == "kill-test-0" and s.error for s in first
                   if s.termination == "lost")
        assert all(s.termination in ("done", "horizon") for s in second)
        assert {s.actor for s in second} == {"kill-test-0", "kill-test-1"}  # the restarted actor works again
        assert ray.get(supervisor.actors[0].info.remote())["pid"] != old_pid
        stats = supervisor.stats()
        assert stats["pool/lost"] == len(lost) and stats["pool/actor_restarts"] == 1
        # The dead incarnation's counts are gone; the live ones' remain (how many episodes the killed process had
        # finished before the kill depends on the machine's load, so it is not bounded here).
        assert stats["env/babyai/episodes"] >= len([s for s in first if s.actor == "kill-test-1"]) + len(second)
        arrived = {t.trajectory_id for t in receiver.drain(64, timeout_ms=5000)}
        assert not arrived & lost and arrived >= {s.trajectory_id for s in second}
    finally:
        supervisor.shutdown()
        receiver.close()


def test_short_cpu_envs_run_on_the_event_loop_and_others_on_their_own_thread():
    from environments.sciworld.env import SciWorldEnv

    cfg = EnvConfig()
    assert isinstance(make_env("babyai", cfg), InlineEnv) and isinstance(make_env("textcraft", cfg), InlineEnv)
    assert not SciWorldEnv.inline  # a JVM behind a gateway: it can hang, so it keeps its thread
    seen = []

    class Spy(BabyAIEnv):
        def step(self, reply):
            seen.append(threading.get_ident())
            return super().step(reply)

    class ThreadedSpy(Spy):
        inline = False

    async def episode(env):
        await env.reset("babyai_1")
        await env.step("turn left")
        await env.close()

    inline, threaded = run_sync_env(Spy()), run_sync_env(ThreadedSpy())
    assert isinstance(inline, InlineEnv) and isinstance(threaded, ThreadedEnv)
    for env in (inline, threaded):
        asyncio.run(episode(env))
    assert seen == [threading.get_ident(), seen[1]] and seen[1] != threading.get_ident()
