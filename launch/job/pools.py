"""Env pools as Ray actors, and the supervisor that dispatches episodes to them.

Restarts are Ray core's: each EnvPool actor is created with `max_restarts=env.max_actor_restarts` and
`max_task_retries=0`, so when its process dies (e.g. SIGKILL) Ray reruns its constructor, and every call that
was running on it fails with a RayActorError instead of being replayed (an episode is not idempotent: it
already sent tokens to the generator and maybe a trajectory to the coordinator). RLlib's
FaultTolerantActorManager was considered: it adds health probes and restore callbacks around the same Ray
restarts, but it is built for lockstep `foreach_actor` rounds polled with `fetch_ready_async_reqs`, while
this supervisor awaits one call per episode and routes each to the least-loaded actor; it would also add
`ray[rllib]` (414 MB) for a few lines of bookkeeping. So the bookkeeping is here:

What must hold:
- `run(spec)` sends the episode to the actor with the fewest episodes in flight and returns its
  EpisodeSummary. Dispatch is batched: the episodes routed to one actor within `dispatch_delay_s` (or until
  `dispatch_batch` wait) go in one `start` call, with at most one `start` call in flight per actor (what is
  routed to an actor meanwhile waits for it, so batches grow when the driver is busy), and one long-polling
  `finished` call per busy actor brings their summaries back (lingering `collect_linger_s` for more to join).
  A Ray call costs the driver about 2 ms of CPU, far more than the rest of an episode's handling: this keeps
  calls to about one per ten episodes or fewer at scale. The window and the linger apply only at scale (at
  least `dispatch_batch` episodes out per actor); below that an admission's burst goes at once and summaries
  come back without waiting, since latency matters more than calls there. Specs and summaries cross as tuples
  of plain values.
- If that actor dies meanwhile, the episode is reported lost (a summary with termination `lost`, counted in
  `pool/lost` and kept in `lost_specs`), never silently dropped; `resubmit=n` retries it up to n times on
  whichever actor is then least loaded. An episode dispatched to an actor as it dies is reported lost even if
  a restarted actor ran it (its trajectory is then an orphan, never trained).
- A dead actor gets no new episodes until it answers again: calls to a restarting actor fail at once with
  ActorUnavailableError, so after a failure the supervisor probes the actor and dispatches to the others
  meanwhile. Its return is detected by the pool's incarnation id changing and counted in
  `pool/actor_restarts`; an actor out of restarts is counted in `pool/actors_dead` and never used again.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Any, Callable

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from actors.env_pool import EnvPool
from actors.episode_summary import EpisodeSummary
from core.curve import CurveClient
from core.env import Env
from core.policy import Policy
from core.rollout import EpisodeLimits, EpisodeSpec
from environments.item_sampler import family_of
from launch.job.placement import pool_actor_options, with_role_log

log = logging.getLogger("agentgym.pools")


def pool_names(n: int, prefix: str = "envpool") -> list[str]:
    """The names of the first `n` env-pool actors (they also name their trajectory-channel keys)."""
    return [f"{prefix}-{k}" for k in range(n)]


def sent_tokenizer_class(tokenizer_dir: str) -> str:
    """The class of the tokenizer in `tokenizer_dir` as AutoTokenizer resolves it, named for every pool
    (core.tokenizer_load). Each pool loads that class itself, without AutoTokenizer's import of torch. The driver
    loads the tokenizer once (launch.job.episodes.chat_for: it writes transcripts and evaluates with it too)."""
    from core.tokenizer_load import class_path
    from launch.job.episodes import chat_for

    return class_path(chat_for(tokenizer_dir).tok)


class PoolSupervisor:
    def __init__(self, env_cfg: Any, policy: Policy, tokenizer_dir: str, limits: EpisodeLimits,
                 trajectory_endpoint: str | None, num_actors: int | None = None, name: str = "envpool",
                 send_timeout_s: float | None = 600.0, env_factory: Callable[[str, Any], Env] | None = None,
                 trajectory_curve: dict[str, CurveClient] | None = None, log_dir: str | None = None,
                 actor_options: dict[str, dict] | None = None):
        """`trajectory_curve`: each actor's CURVE credentials by name (`<name>-<k>`), when the channel has them.
        `actor_options`: each actor's Ray options by name, as the run's placement plan has them (launch.job.plan);
        None: computed here."""
        self.env_cfg = env_cfg
        count = num_actors or env_cfg.num_actors
        self.names = pool_names(count, name)
        if actor_options is not None and set(actor_options) != set(self.names):
            raise ValueError(f"the placement plan names env pools {sorted(actor_options)}, not {self.names}")
        remote, options = ray.remote(EnvPool), pool_actor_options(env_cfg)  # no GPU visible, SPREAD
        self.actors = [remote.options(**(actor_options[actor_name] if actor_options is not None
                                         else with_role_log(options, log_dir, actor_name))).remote(
                           env_cfg, policy, tokenizer_dir, limits, trajectory_endpoint, actor_name, send_timeout_s,
                           env_factory, trajectory_curve=trajectory_curve[actor_name] if trajectory_curve else None,
                           tokenizer_class=sent_tokenizer_class(tokenizer_dir))
                       for actor_name in self.names]
        self._in_flight: list[dict[str, EpisodeSpec]] = [{} for _ in range(count)]
        self._incarnations: list[str | None] = [None] * count
        self._down: set[int] = set()  # failed, being probed until they answer again
        self._dead: set[int] = set()  # out of restarts
        self._watchers: dict[int, asyncio.Task] = {}
        self._up_event: asyncio.Event | None = None
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[dict[str, asyncio.Future]] = [{} for _ in range(count)]  # by trajectory id
        self._outbox: list[list[EpisodeSpec]] = [[] for _ in range(count)]
        self._flush_due = False
        self._collectors: dict[int, asyncio.Task] = {}
        self._calls: set[asyncio.Task] = set()
        # Latency traded for fewer Ray calls (each costs the driver more than the rest of an episode's handling);
        # `dispatch_batch` episodes per actor go at once. Episodes last seconds: 0.25 s of dispatch delay is
        # small, and so is a summary's 0.25 s linger (the trajectory itself does not wait: it travels over ZeroMQ).
        # The linger widens the window in which an actor's death reports as lost an episode that had sent its
        # trajectory (its group is then discarded, never trained twice) by those 0.25 s. Measured with
        # `python -m launch.bench scale` (1,000 in flight, 4 actors): 0.064-0.076 Ray calls per trajectory against
        # 0.18 with 0.1 s and no linger.
        self.collect_wait_s, self.collect_linger_s = 5.0, 0.25
        self.dispatch_delay_s, self.dispatch_batch = 0.25, 64
        self._starting: set[int] = set()  # actors with a `start` call in flight
        self._pending = 0
        self.counters: dict[str, float] = collections.defaultdict(float)
        self.lost_specs: list[EpisodeSpec] = []

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every actor has started (constructors load the tokenizer)."""
        infos = ray.get([a.info.remote() for a in self.actors], timeout=timeout_s)
        self._incarnations = [i["incarnation"] for i in infos]

    async def _pick(self) -> int:
        """The least-loaded actor that is up; waits while every live actor is restarting."""
        while True:
            usable = [k for k in range(len(self.actors)) if k not in self._down and k not in self._dead]
            if usable:
                break
            if len(self._dead) == len(self.actors):
                raise RuntimeError("every env pool actor is dead (out of restarts: env.max_actor_restarts)")
            self._up_event = self._up_event or asyncio.Event()
            await self._up_event.wait()
            self._up_event = None
        best = min(len(self._in_flight[k]) for k in usable)
        # Rotate among the least loaded so ties spread evenly.
        for step in range(len(self.actors)):
            k = (self._next + step) % len(self.actors)
            if k in usable and len(self._in_flight[k]) == best:
                self._next = k + 1
                return k
        raise AssertionError("unreachable")

    def _mark_down(self, k: int) -> None:
        if k in self._down or k in self._dead:
            return
        self._down.add(k)
        self._watchers[k] = asyncio.ensure_future(self._watch(k))

    async def _watch(self, k: int, interval_s: float = 0.25) -> None:
        """Probe a failed actor until Ray has restarted it (or has given up on it)."""
        while True:
            try:
                info = await self.actors[k].info.remote()
            except ActorDiedError:
                self._dead.add(k)
                self.counters["pool/actors_dead"] += 1
                log.error("env pool %s is dead for good (out of restarts)", self.names[k])
                break
            except RayActorError:
                await asyncio.sleep(interval_s)
                continue
            if info["incarnation"] != self._incarnations[k]:
                self.counters["pool/actor_restarts"] += 1
                self._incarnations[k] = info["incarnation"]
            log.warning("env pool %s is back (pid %s)", self.names[k], info["pid"])
            break
        self._down.discard(k)
        self._watchers.pop(k, None)
        if self._up_event is not None:
            self._up_event.set()

    async def run(self, spec: EpisodeSpec, resubmit: int = 0) -> EpisodeSummary:
        k = await self._pick()
        tid = spec.trajectory_id
        self._in_flight[k][tid] = spec
        outcome = self._bind().create_future()
        self._waiting[k][tid] = outcome
        self._outbox[k].append(spec)
        self._pending += 1
        if self._pending >= self.dispatch_batch * len(self.actors):
            self._flush()
        elif not self._flush_due:
            self._flush_due = True
            if self._at_scale():
                self._loop.call_later(self.dispatch_delay_s, self._flush)
            else:  # after the episodes started in this same turn of the loop (one admission's burst)
                self._loop.call_soon(self._flush)
        try:
            return await outcome
        except RayActorError as exc:
            self._mark_down(k)
            self.counters["pool/lost"] += 1
            self.counters[f"pool/{self.names[k]}/lost"] += 1
            self.lost_specs.append(spec)
            log.warning("episode %s lost: actor %s died (%s)", tid, self.names[k], type(exc).__name__)
            if resubmit > 0:
                self.counters["pool/resubmitted"] += 1
                return await self.run(spec, resubmit - 1)
            return EpisodeSummary.lost(tid, spec.item_id, family_of(spec.item_id, self.env_cfg),
                                       self.names[k], f"{type(exc).__name__}: {str(exc)[:300]}")
        finally:
            self._in_flight[k].pop(tid, None)
            self._waiting[k].pop(tid, None)

    def _at_scale(self) -> bool:
        """Whether enough episodes are out for batching to pay: `dispatch_batch` per actor. Below that, episodes
        go at once and summaries come back without lingering (latency matters more than calls there)."""
        return sum(map(len, self._in_flight)) >= self.dispatch_batch * len(self.actors)

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The running loop; a new one (in-process users may run one after another) starts from a clean slate."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._flush_due, self._collectors, self._pending = loop, False, {}, 0
            self._starting = set()
            self._outbox = [[] for _ in self.actors]
        return loop

    def _flush(self) -> None:
        """One `start` call per actor for the episodes routed to it since the last flush, except to an actor
        whose previous call is still in flight: its episodes go when that call returns."""
        self._flush_due, self._pending = False, 0
        for k, specs in enumerate(self._outbox):
            if specs and k not in self._starting:
                self._outbox[k] = []
                self._starting.add(k)
                self._spawn(self._start(k, specs))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return task

    async def _start(self, k: int, specs: list[EpisodeSpec]) -> None:
        self.counters["pool/start_calls"] += 1
        failed = None
        try:
            await self.actors[k].start.remote([dataclasses.astuple(s) for s in specs])
        except RayActorError as exc:
            failed = exc
        finally:  # a cancelled call (shutdown) frees the actor too, and sends nothing more
            self._starting.discard(k)
        if self._outbox[k] and not self._flush_due:  # episodes routed here while the call was out
            self._flush_due = True
            self._loop.call_soon(self._flush)
        if failed is not None:
            self._fail(k, [s.trajectory_id for s in specs], failed)
            return
        if k not in self._collectors:
            self._collectors[k] = self._spawn(self._collect(k))

    async def _collect(self, k: int) -> None:
        """Bring actor k's summaries back while it has episodes out; its failure fails every one of them."""
        try:
            while self._waiting[k]:
                self.counters["pool/collect_calls"] += 1
                try:
                    linger = self.collect_linger_s if self._at_scale() else 0.0
                    outcomes = await self.actors[k].finished.remote(self.collect_wait_s, linger)
                except RayActorError as exc:
                    self._fail(k, list(self._waiting[k]), exc)
                    return
                for tid, fields, error in outcomes:
                    waiting = self._waiting[k].get(tid)
                    if waiting is None or waiting.done():
                        continue  # its caller gave up (cancelled)
                    if error:
                        waiting.set_exception(RuntimeError(error))
                    else:
                        waiting.set_result(EpisodeSummary(*fields))
        finally:
            if self._collectors.get(k) is asyncio.current_task():
                del self._collectors[k]

    def _fail(self, k: int, tids: list[str], exc: BaseException) -> None:
        for tid in tids:
            waiting = self._waiting[k].get(tid)
            if waiting is not None and not waiting.done():
                waiting.set_exception(exc)

    async def run_many(self, specs: list[EpisodeSpec], resubmit: int = 0) -> list[EpisodeSummary]:
        return list(await asyncio.gather(*(self.run(s, resubmit) for s in specs)))

    def in_flight(self) -> dict[str, list[str]]:
        return {n: list(f) for n, f in zip(self.names, self._in_flight)}

    def stats(self, timeout_s: float = 10.0) -> dict[str, float]:
        """Every live actor's counters summed, plus the supervisor's own (restarts, lost episodes)."""
        out: dict[str, float] = collections.defaultdict(float)
        for k, actor in enumerate(self.actors):
            try:
                info, stats = ray.get([actor.info.remote(), actor.stats.remote()], timeout=timeout_s)
            except (RayActorError, GetTimeoutError) as exc:
                self.counters["pool/stats_unavailable"] += 1
                log.warning("stats of %s unavailable: %s", self.names[k], type(exc).__name__)
                continue
            if self._incarnations[k] is not None and info["incarnation"] != self._incarnations[k] \
                    and k not in self._down:
                self.counters["pool/actor_restarts"] += 1  # a restart no episode noticed
                self._incarnations[k] = info["incarnation"]
            for key, value in stats.items():
                out[key] += value
        for key, value in self.counters.items():
            out[key] += value
        out["pool/actors"] = float(len(self.actors))
        return dict(out)

    def shutdown(self) -> None:
        for task in [*self._watchers.values(), *self._calls]:
            if not task.done():
                task.cancel()
        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=15)
            except Exception as exc:  # already dead or hung: kill it anyway
                log.warning("closing an env pool failed: %r", exc)
            ray.kill(actor, no_restart=True)
