"""The env pool: runs whole episodes in a fixed number of concurrent slots and ships their trajectories.

A plain class; launch/job/pools.py makes it a Ray actor. It is passive: the coordinator (through the supervisor)
decides what runs and when by calling `run(spec)`.

What must hold:
- At most `slots_per_actor` episodes run at once (asyncio); a family's `max_instances_per_actor(family_cfg)`
  hook, when present, caps its live envs and concurrent episodes further. Blocking envs run off the event loop
  (ThreadedEnv), except those whose calls are short CPU work (core.env.SyncEnv.inline: BabyAI, TextCraft); env
  construction runs in a worker thread.
- Envs are reused across episodes, per family. An env whose episode ended in `env_error` or `env_timeout` is
  closed (bounded by a timeout: a hung env thread is abandoned, never awaited forever) and replaced by a fresh
  one on next use; the counts show in `stats()` as `env/<family>/errors`, `.../timeouts`, `.../replaced`.
- An env that cannot even be built ends its episode as `env_error` like one that raises in reset.
- Each trajectory is sent on the ZMQ channel from one dedicated thread (sockets are not thread-safe); the slot
  stays held until the send completes, so a slow consumer slows the pool without blocking its event loop and
  without trajectories piling up in memory. A send that times out is counted and logged, never silent.
- `run` returns a small EpisodeSummary; it never raises for env or policy failures.
- Batched dispatch (what the supervisor uses, one Ray call per batch rather than per episode): `start(rows)`
  runs each EpisodeSpec (given as the tuple of its fields: plain values cross Ray without pickling a class)
  as `run` would, in the background, and `finished(wait_s, linger_s)` hands back every outcome once, in the
  order the episodes ended, as `(trajectory_id, summary fields, error)`; `error` names an exception `run`
  raised (the fields are then None). Outcomes wait in memory until collected: at most one per episode started.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import os
import time
import uuid
from typing import Any, Callable

from actors.episode_summary import EpisodeSummary
from core.chat import ChatFormat
from core.cpu_affinity import pin_to_cores
from core.curve import CurveClient
from core.env import Env, Observation, StepResult, close_or_kill
from core.heap import freeze_startup_heap
from core.policy import Policy
from core.rollout import EpisodeLimits, EpisodeSpec, run_episode
from core.tokenizer_load import load as load_tokenizer
from core.trajectory import Termination, Trajectory
from core.transport import TrajectorySender
from environments.item_sampler import family_of
from environments.registry import get_family, make_env

log = logging.getLogger("agentgym.env_pool")

ENV_CLOSE_TIMEOUT_S = 10.0
REPLACE = (Termination.ENV_ERROR, Termination.ENV_TIMEOUT)


class _Unbuildable(Env):
    """Stands in for an env whose construction raised, so the episode ends as env_error the usual way."""

    def __init__(self, family: str, error: BaseException):
        self.family = family
        self.error = error

    async def reset(self, item_id: str) -> Observation:
        raise RuntimeError(f"could not create a {self.family} env: {self.error!r}")

    async def step(self, text: str) -> StepResult:
        raise RuntimeError(f"could not create a {self.family} env: {self.error!r}")


class EnvPool:
    def __init__(self, env_cfg: Any, policy: Policy, tokenizer_dir: str, limits: EpisodeLimits,
                 trajectory_endpoint: str | None, name: str = "", send_timeout_s: float | None = 600.0,
                 env_factory: Callable[[str, Any], Env] | None = None,
                 close_timeout_s: float = ENV_CLOSE_TIMEOUT_S, trajectory_curve: CurveClient | None = None,
                 tokenizer_class: str = ""):
        """`env_cfg` is the `env` config section; `policy` a picklable core.policy.Policy; the tokenizer in
        `tokenizer_dir` renders the chat; `trajectory_endpoint` the coordinator's receiver (None: nothing is
        sent, for local use); `env_factory(family, env_cfg)` replaces the registry (tests use it);
        `trajectory_curve` this actor's CURVE credentials when the channel is authenticated. `tokenizer_class`:
        the class of that tokenizer as the caller loaded it (core.tokenizer_load.class_path): loaded by it here,
        without AutoTokenizer, which imports torch through transformers' auto classes (about 4 CPU-seconds of
        every pool's start, most of it)."""
        pin_to_cores(getattr(env_cfg, "cpu_cores", []), "env.cpu_cores")
        self.name = name or f"envpool-{os.getpid()}"
        self.incarnation = uuid.uuid4().hex[:12]  # changes when Ray restarts this actor
        self.env_cfg = env_cfg
        self.policy = policy
        self.limits = dataclasses.replace(limits, step_timeout_s=env_cfg.step_timeout_s,
                                          reset_timeout_s=env_cfg.reset_timeout_s)
        self.chat = ChatFormat(load_tokenizer(tokenizer_dir, tokenizer_class))
        self._factory = env_factory or make_env
        self._close_timeout_s = close_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None  # semaphores belong to one event loop
        self._slots = asyncio.Semaphore(env_cfg.slots_per_actor)
        self._family_slots: dict[str, asyncio.Semaphore] = {}
        self._idle: dict[str, list[Env]] = collections.defaultdict(list)
        self._send_timeout_ms = None if send_timeout_s is None else int(send_timeout_s * 1000)
        self._send_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trajectory-send")
        # The socket is created, used and closed on the send thread only. Its routing id names the incarnation:
        # a restarted actor reusing its predecessor's id would be refused by the receiver's ROUTER socket.
        sender_id = f"{self.name}-{self.incarnation}"
        self._sender = self._send_thread.submit(
            TrajectorySender, trajectory_endpoint, sender_id, curve=trajectory_curve).result() \
            if trajectory_endpoint else None
        self._counters: dict[str, float] = collections.defaultdict(float)
        self.in_flight = 0
        self._started: dict[asyncio.Task, EpisodeSpec] = {}  # batched episodes running (strong references)
        self._outcomes: list[tuple[str, tuple | None, str]] = []
        self._outcome_ready = asyncio.Event()
        freeze_startup_heap()  # the tokenizer and the imports: out of the collector's full passes

    # -- episodes ----------------------------------------------------------------------------------------
    async def run(self, spec: EpisodeSpec) -> EpisodeSummary:
        """Run one episode in a free slot, send its trajectory, and return its summary."""
        family = family_of(spec.item_id, self.env_cfg)
        self._bind_loop()
        async with self._family_slot(family):  # waiting for a family's instance holds no slot
            await self._slots.acquire()
            self.in_flight += 1
            try:
                env = self._idle[family].pop() if self._idle[family] else await self._build(family)
                traj = await run_episode(env, self.policy, self.chat, spec, self.limits)
                await self._settle(family, env, traj)
            except BaseException:
                self.in_flight -= 1
                self._slots.release()
                raise
        try:
            sent = await self._send(traj)  # the slot is held until the channel took it: backpressure
        finally:
            self.in_flight -= 1
            self._slots.release()
        return EpisodeSummary.of(traj, self.name, sent)

    async def start(self, rows: list[tuple]) -> str:
        """Begin the episodes whose EpisodeSpec fields are `rows` in the background (each as `run`); collect their
        outcomes with `finished`. Returns this process's incarnation id."""
        self._bind_loop()
        for row in rows:
            spec = row if isinstance(row, EpisodeSpec) else EpisodeSpec(*row)
            task = asyncio.ensure_future(self.run(spec))
            self._started[task] = spec
            task.add_done_callback(self._episode_ended)
        return self.incarnation

    def _episode_ended(self, task: asyncio.Task) -> None:
        spec = self._started.pop(task)
        if task.cancelled():
            self._outcomes.append((spec.trajectory_id, None, f"{self.name}: episode cancelled"))
        elif task.exception() is not None:
            exc = task.exception()
            self._outcomes.append((spec.trajectory_id, None, f"{self.name}: {type(exc).__name__}: {exc}"[:500]))
        else:
            self._outcomes.append((spec.trajectory_id, dataclasses.astuple(task.result()), ""))
        self._outcome_ready.set()

    async def finished(self, wait_s: float = 5.0, linger_s: float = 0.0) -> list[tuple[str, tuple | None, str]]:
        """The outcomes of batched episodes that ended since the last call: waits up to `wait_s` for a first, then
        `linger_s` more for others to join it (fewer calls per episode when episodes end one by one)."""
        self._bind_loop()
        if not self._outcomes:
            self._outcome_ready.clear()
            try:
                await asyncio.wait_for(self._outcome_ready.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        if self._outcomes and linger_s > 0:
            await asyncio.sleep(linger_s)
        out, self._outcomes = self._outcomes, []
        return out

    def _bind_loop(self) -> None:
        """A Ray actor has one loop for life; in-process users (tests, benches) may run one loop after another."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self.in_flight:
            raise RuntimeError(f"{self.name}: used from two event loops at once")
        self._loop = loop
        self._slots = asyncio.Semaphore(self.env_cfg.slots_per_actor)
        self._family_slots = {}
        self._outcome_ready = asyncio.Event()

    def _family_slot(self, family: str) -> asyncio.Semaphore:
        if family not in self._family_slots:
            cap = get_family(family).extras.get("max_instances_per_actor")
            limit = self.env_cfg.slots_per_actor
            if cap is not None:
                limit = max(1, min(limit, int(cap(getattr(self.env_cfg, family)))))
            self._family_slots[family] = asyncio.Semaphore(limit)
        return self._family_slots[family]

    async def _build(self, family: str) -> Env:
        self._counters[f"env/{family}/created"] += 1
        try:
            return await asyncio.to_thread(self._factory, family, self.env_cfg)
        except Exception as exc:
            log.error("%s: building a %s env failed: %r", self.name, family, exc)
            return _Unbuildable(family, exc)

    async def _settle(self, family: str, env: Env, traj: Trajectory) -> None:
        c, m = self._counters, traj.metrics
        c[f"env/{family}/episodes"] += 1
        c[f"env/{family}/successes"] += m.get("success", 0.0)
        c[f"env/{family}/turns"] += traj.num_turns
        c[f"env/{family}/reward"] += traj.total_reward
        c[f"env/{family}/env_seconds"] += m.get("env_seconds", 0.0)
        c[f"env/{family}/valid_actions"] += m.get("valid_actions", 0.0)
        c[f"env/{family}/judged_turns"] += m.get("judged_turns", float(traj.num_turns))
        c["pool/gen_seconds"] += m.get("gen_seconds", 0.0)
        c["pool/episode_seconds"] += m.get("episode_seconds", 0.0)
        c[f"pool/termination/{traj.termination.value}"] += 1
        if traj.termination not in REPLACE:
            self._idle[family].append(env)
            return
        c[f"env/{family}/{'errors' if traj.termination is Termination.ENV_ERROR else 'timeouts'}"] += 1
        c[f"env/{family}/replaced"] += 1
        log.warning("%s: %s env ended %s in %s; replacing it", self.name, family, traj.termination.value,
                    traj.trajectory_id)
        await self._close(family, env)

    async def _close(self, family: str, env: Env) -> None:
        """Close an env; one whose close hangs or fails is killed (its JVM or browser with it) and counted."""
        outcome = await close_or_kill(env, self._close_timeout_s)
        if outcome != "closed":
            self._counters[f"env/{family}/close_failures"] += 1
            self._counters[f"env/{family}/killed"] += outcome == "killed"
            log.warning("%s: a %s env did not close in %.0f s: %s", self.name, family, self._close_timeout_s,
                        outcome)

    async def _send(self, traj: Trajectory) -> bool:
        if self._sender is None:
            return False
        t0 = time.monotonic()
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._send_thread, self._sender.send, traj, self._send_timeout_ms)
        except TimeoutError as exc:
            self._counters["pool/send_timeouts"] += 1
            log.error("%s: trajectory %s not sent: %s", self.name, traj.trajectory_id, exc)
            return False
        self._counters["pool/sent"] += 1
        self._counters["pool/send_seconds"] += time.monotonic() - t0
        return True

    # -- introspection -----------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        out = dict(self._counters)
        out["pool/in_flight"] = float(self.in_flight)
        out["rollout/lost_episodes"] = float(getattr(self.policy, "lost", 0))  # their generator replica died
        out["pool/cpu_seconds"] = time.process_time()  # this process, all threads: load-independent cost
        for family, envs in self._idle.items():
            out[f"env/{family}/idle"] = float(len(envs))
        return out

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "incarnation": self.incarnation, "pid": os.getpid()}

    async def close(self) -> None:
        for family, envs in self._idle.items():
            for env in envs:
                await self._close(family, env)
            envs.clear()
        if self._sender is not None:
            await asyncio.get_running_loop().run_in_executor(self._send_thread, self._sender.close)
        self._send_thread.shutdown(wait=False)
