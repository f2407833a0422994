"""The coordinator: admits episodes, assembles groups, trains, publishes weights, logs and checkpoints.

What must hold:
- Generation never waits for a full rollout round and training never waits for stragglers beyond the batch:
  episodes run as independent tasks on the env pools; a batch is the first `groups_per_step` groups to
  complete (or, with `batch_order="submission"`, the next groups in the order they started, once all are
  complete: batches then do not depend on timing). The only couplings are the staleness gate
  (core.staleness: admission and the freshness filter) and the horizon, `schedule.horizon_at(step)`, fixed
  for each group when it starts.
- eta = 0 is the synchronous mode with the same code: one batch is admitted per policy version, so generation
  is idle while the learner trains.
- Admission counts from the version every generator has acked (actors/weights/publication.py), freshness from the
  learner's own: the learner trains the next step while the generators take the version just published.
- Ids: group `g<counter>-<item>`, trajectory `<group>.a<incarnation>.s<sample>`; the incarnation counts
  resumes, so no id repeats across a crash. A group is trained at most once: its id goes into the lineage
  log `trained.jsonl` with the step that trained it, and a resumed run truncates that log to its checkpoint.
- Groups started but not trained when a checkpoint is written are regenerated after a resume, before new
  draws; the sampler's cursor continues exactly.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from actors.episode_watch import EpisodesFailing, EpisodeWatch
from actors.group_buffer import GroupBuffer, GroupInfo
from actors.weights.publication import Publication
from core.heap import freeze_startup_heap, thaw_heap
from core.horizon import HorizonSchedule
from core.metrics import rollout_metrics
from core.rollout import EpisodeSpec
from core.sampler import ItemSampler
from core.staleness import StalenessGate
from core.trajectory import Trajectory

log = logging.getLogger("agentgym.coordinator")


@dataclass
class RunState:
    """What the coordinator checkpoints (with the sampler's and the gate's own state)."""

    step: int = 0
    version: int = 0
    next_group: int = 0
    incarnation: int = 0
    pending: list[dict] = field(default_factory=list)  # groups started, not trained: regenerated on resume
    counters: dict[str, float] = field(default_factory=dict)
    wandb_run_id: str = ""


class Coordinator:
    def __init__(self, *, pools: Any, learners: Any, receiver: Any, sampler: ItemSampler, gate: StalenessGate,
                 schedule: HorizonSchedule, group_size: int, total_steps: int, max_in_flight: int,
                 on_step: Callable[[int, dict[str, float], list[GroupInfo]], None],
                 should_checkpoint: Callable[[int], bool], save: Callable[[RunState], None],
                 state: RunState | None = None, ack_timeout_s: float = 300.0,
                 on_group_started: Callable[[GroupInfo], None] | None = None,
                 health: Callable[[], str] | None = None, health_every_s: float = 5.0,
                 needs_republish: Callable[[], bool] | None = None, episode_watch: EpisodeWatch | None = None,
                 max_trained_turns: int = 0, batch_order: str = "completion",
                 down: Callable[[], Sequence[str]] = lambda: (), admit_during_step: bool = True):
        """`health()` names a broken role's channel ("" when all is well); it is asked every `health_every_s`,
        also while weight acks are awaited, and a non-empty answer stops the run with that cause;
        `needs_republish()` (asked after it) asks for the current weights to be published again, for a
        generator replica that was restarted; `down()` names the generator replicas (weights subscribers) seen
        down, whose acks are not waited for."""
        self.pools, self.learners, self.receiver = pools, learners, receiver
        self.sampler, self.gate, self.schedule = sampler, gate, schedule
        self.group_size, self.total_steps, self.max_in_flight = group_size, total_steps, max_in_flight
        self.max_trained_turns = max_trained_turns  # 0: no budget of trained turns
        self.admit_during_step = admit_during_step  # trainer.admit_during_step
        self.on_step, self.should_checkpoint, self.save = on_step, should_checkpoint, save
        self.state = state or RunState()
        self.on_group_started = on_group_started
        if batch_order not in ("completion", "submission"):
            raise ValueError(f"batch_order: expected completion or submission, got {batch_order!r}")
        self.buffer = GroupBuffer(group_size, ordered=batch_order == "submission")
        self.stop_requested = False
        self._regenerate = list(self.state.pending)
        self._episodes: set[asyncio.Task] = set()
        self._arrived: asyncio.Queue | None = None
        self._gen_tokens = 0.0
        self._training = False  # a step is training: groups the gate allows start meanwhile
        self._received = 0
        self._fatal: BaseException | None = None
        self._pump_error: BaseException | None = None
        self.health, self.health_every_s, self.needs_republish = health, health_every_s, needs_republish
        self._health_lock = asyncio.Lock()  # the loop and a background ack wait both ask
        self._health_at = time.monotonic()
        self.weights = Publication(lambda: self.learners, self.state.version, ack_timeout_s,
                                   lambda: self.stop_requested, self._served, on_wait=self._check_health,
                                   excused=down)
        self.episode_watch = episode_watch or EpisodeWatch()

    # -- admission --------------------------------------------------------------------------------------------

    def _start_group(self) -> None:
        # While a step trains, a group starts as it would once that step is done (its horizon is that step's).
        step, state = self.state.step + int(self._training), self.state
        if self._regenerate:
            old = self._regenerate.pop(0)
            group_id, item_id, draw = old["group_id"], old["item_id"], old["draw"]
        else:
            item_id, draw = self.sampler.next_item(), self.sampler.drawn - 1
            group_id = f"g{state.next_group:07d}-{item_id}"
            state.next_group += 1
        info = GroupInfo(group_id, item_id, self.schedule.horizon_at(step), step, self.weights.served, draw,
                         attempt=state.incarnation)
        self.buffer.start(info)
        self.gate.on_started()
        if self.on_group_started is not None:
            self.on_group_started(info)
        for i in range(self.group_size):
            spec = EpisodeSpec(trajectory_id=f"{group_id}.a{info.attempt}.s{i}", item_id=item_id, group_id=group_id,
                               sample_index=i, horizon=info.horizon, priority=draw)
            task = asyncio.ensure_future(self._episode(spec))
            self._episodes.add(task)
            task.add_done_callback(self._episodes.discard)

    async def _episode(self, spec: EpisodeSpec) -> None:
        try:
            summary = await self.pools.run(spec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the pools cannot run episodes at all (e.g. every actor dead): stop the run
            self._fatal = self._fatal or exc
            return
        try:
            self.episode_watch.record(summary.family, summary.termination)
        except EpisodesFailing as exc:
            self._fatal = self._fatal or exc
        if summary.termination == "lost" or not summary.sent:
            if self.buffer.discard(spec.group_id, "lost" if summary.termination == "lost" else "unsent"):
                self.gate.on_discarded()

    def _admit(self) -> None:
        room = min(self.gate.capacity(self.weights.served, self.total_steps),
                   self.max_in_flight - self.buffer.in_flight)
        for _ in range(max(0, room)):
            self._start_group()

    # -- trajectories -----------------------------------------------------------------------------------------

    def _pump(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """Receiver thread: ZMQ -> the event loop (the socket is used by this thread only).

        The receiver drops bad messages itself; anything that still escapes ends this thread, and the loop's
        watchdog (`_check_channels`) then stops the run with it instead of waiting forever."""
        try:
            while not stop.is_set():
                traj = self.receiver.recv(100)
                if traj is None:
                    continue
                # What is already queued goes over in the same hand-off: one loop wake-up per burst, not per record.
                arrived = [traj]
                while len(arrived) < 256 and (traj := self.receiver.recv(0)) is not None:
                    arrived.append(traj)
                loop.call_soon_threadsafe(self._arrived.put_nowait, arrived)
        except BaseException as exc:
            self._pump_error = exc  # the watchdog raises it in the run's own task
            log.critical("the trajectory receiver thread died: %r", exc)

    async def _check_channels(self, pump: threading.Thread) -> None:
        """The watchdog: a dead receiver thread or a role reporting a broken channel ends the run, named."""
        if not pump.is_alive():
            raise RuntimeError(f"the trajectory receiver thread died: {self._pump_error!r}") from self._pump_error
        await self.weights.check()
        await self._check_health()
        if (self.needs_republish is not None and self.needs_republish()) or self.weights.take_resend():
            log.warning("publishing weights version %d again for a restarted generator", self.state.version)
            await self.weights.publish(wait=True)

    async def _check_health(self) -> None:
        """Ask `health()` if `health_every_s` has passed since it was last asked; raise what it names."""
        if self.health is None:
            return
        async with self._health_lock:
            if time.monotonic() - self._health_at < self.health_every_s:
                return
            problem = await asyncio.to_thread(self.health)
            self._health_at = time.monotonic()
        if problem:
            raise RuntimeError(f"a channel of the run failed: {problem}")

    def _file(self, traj: Trajectory) -> None:
        self._received += 1
        outcome = self.buffer.add(traj)
        if outcome == "rejected":  # not a sample this run issued: nothing of it counts
            return
        self._gen_tokens += traj.metrics.get("gen_tokens", 0.0)
        if outcome == "discarded":
            self.gate.on_discarded()

    def _fresh_batch(self) -> list[GroupInfo] | None:
        """The next `groups_per_step` complete groups that pass the freshness filter, or None if not yet."""
        n = self.gate.groups_per_step
        while len(self.buffer.ready) >= n:
            batch = self.buffer.take_in_order(n) if self.buffer.started is not None else self.buffer.take(n)
            if not batch:  # the next groups in start order are not all complete yet
                return None
            stale = [g for g in batch if not all(self.gate.is_fresh(t.oldest_version(), self.state.version)
                                                 for t in g.samples)]
            for g in stale:
                self.gate.on_dropped_stale()
                self.buffer.discarded["stale"] += 1
            fresh = [g for g in batch if g not in stale]
            if len(fresh) == len(batch):
                return batch
            self.buffer.put_back(fresh)
        return None

    # -- the loop ---------------------------------------------------------------------------------------------

    async def run(self) -> RunState:
        loop = asyncio.get_running_loop()
        freeze_startup_heap()  # the driver's imports and roles stay out of the collector's full passes
        self._arrived = asyncio.Queue()
        stop = threading.Event()
        pump = threading.Thread(target=self._pump, args=(loop, stop), name="trajectory-pump", daemon=True)
        pump.start()
        try:
            if self.state.step > 0:  # a resumed run: generators start from the base weights
                await self.weights.publish(wait=True)
            waited_since = time.monotonic()
            self._health_at = waited_since
            while self.state.step < self.total_steps and not self.stop_requested and not self.turns_spent:
                await self._check_channels(pump)
                if isinstance(self._fatal, EpisodesFailing):
                    raise self._fatal
                if self._fatal is not None:
                    raise RuntimeError(f"the env pools failed: {self._fatal!r}") from self._fatal
                self._admit()
                try:
                    for traj in await asyncio.wait_for(self._arrived.get(), timeout=0.5):
                        self._file(traj)
                    while not self._arrived.empty():
                        for traj in self._arrived.get_nowait():
                            self._file(traj)
                except asyncio.TimeoutError:
                    pass
                batch = self._fresh_batch()
                if batch is None:
                    continue
                wait_s = time.monotonic() - waited_since
                await self._run_step(batch, wait_s)
                waited_since = time.monotonic()
                if self.should_checkpoint(self.state.step):
                    await asyncio.to_thread(self.save, self.snapshot())
            await self.weights.settle()  # what runs next (the final evaluation) samples the last version
            return self.state
        finally:
            await self.weights.close()
            stop.set()
            for task in list(self._episodes):
                task.cancel()
            await asyncio.gather(*self._episodes, return_exceptions=True)
            pump.join(timeout=5)
            thaw_heap()  # a process that goes on after the run (tests, benches) collects as before

    def _served(self, version: int) -> None:
        """Every generator has `version`: admission may go on, so the loop wakes at once."""
        if self._arrived is not None:
            self._arrived.put_nowait([])

    async def _run_step(self, batch: list[GroupInfo], wait_s: float) -> None:
        """Train `batch`; with admit_during_step, admission goes on meanwhile: a group the staleness gate allows
        starts during the step, not only after it. The gate's version moves when the generators take a
        published version, which is mostly while the next step trains; admitting only between steps leaves the
        generators idle through every step whose batch was complete when it began (with eta = 1, every other
        step of the 100-step soak)."""
        if not self.admit_during_step:
            await self._train(batch, wait_s)
            return
        self._training = True
        step = asyncio.ensure_future(self._train(batch, wait_s))
        try:
            while not step.done():
                if not self.stop_requested:
                    self._admit()
                await asyncio.wait({step}, timeout=0.5)
        except BaseException:
            step.cancel()
            raise
        finally:
            self._training = False
        await step

    async def _train(self, batch: list[GroupInfo], wait_s: float) -> None:
        trajs = [t for g in batch for t in sorted(g.samples, key=lambda t: t.sample_index)]
        metrics = rollout_metrics(trajs, version=self.state.version)
        started = time.monotonic()
        train = await asyncio.to_thread(self.learners.train_step, trajs)
        train_s = time.monotonic() - started
        # On a stop request the trained step is kept (and checkpointed) without waiting to publish it: the
        # learner holds the next version, which the generators receive after the resume.
        if self.stop_requested:
            publish_s, self.state.version = 0.0, self.state.version + 1
        else:
            publish_s = await self.weights.publish()
            self.state.version = self.weights.published
        self.state.step += 1
        turns = float(sum(t.num_turns for t in trajs))
        self.state.counters["trained_turns"] = self.state.counters.get("trained_turns", 0.0) + turns
        step_s = wait_s + train_s + publish_s
        metrics.update(train)
        metrics.update({
            "perf/step_seconds": step_s, "perf/train_seconds": train_s, "perf/publish_seconds": publish_s,
            "perf/learner_idle_frac": wait_s / step_s if step_s else 0.0,
            "perf/gen_tokens_per_s": self._gen_tokens / step_s if step_s else 0.0,
            "perf/train_tokens_per_s": sum(t.num_tokens for t in trajs) / train_s if train_s else 0.0,
            "staleness/dropped_groups": float(self.gate.dropped_stale),
            "staleness/dropped_frac": self.gate.dropped_stale / max(1, self.gate.started),
            "rollout/groups_in_flight": float(self.buffer.in_flight),
            "rollout/orphans": float(self.buffer.orphans),
            "rollout/data_cursor": float(self.sampler.drawn),
            "policy/version": float(self.state.version),
            "rollout/trained_turns": turns, "rollout/trained_turns_total": self.state.counters["trained_turns"],
            **self.transport_metrics(),
        })
        for reason, count in self.buffer.discarded.items():
            metrics[f"rollout/discarded_groups/{reason}"] = float(count)
        self._gen_tokens = 0.0
        self.on_step(self.state.step, metrics, batch)

    @property
    def turns_spent(self) -> bool:
        """Whether the budget of trained turns (max_trained_turns) is used up."""
        return 0 < self.max_trained_turns <= self.state.counters.get("trained_turns", 0.0)

    def transport_metrics(self) -> dict[str, float]:
        """What the channels refused: bad messages per reason, refused handshakes, trajectories not admitted."""
        stats = self.receiver.stats
        out = {"transport/bad_messages": float(stats.dropped),
               "transport/auth_refused": float(getattr(self.receiver, "auth_refused", 0)),
               **self.weights.channel}
        for reason, count in stats.dropped_by_reason.items():
            out[f"transport/bad_messages/{reason}"] = float(count)
        for reason, count in self.buffer.rejected.items():
            out[f"transport/not_admitted/{reason}"] = float(count)
        return out

    def snapshot(self) -> RunState:
        """The state to checkpoint now: groups in flight or waiting are regenerated after a resume."""
        groups = list(self.buffer.open.values()) + list(self.buffer.ready)
        if self.buffer.started is not None:  # batches in start order: regenerated in that order too
            position = {group_id: i for i, group_id in enumerate(self.buffer.started)}
            groups.sort(key=lambda g: position.get(g.group_id, len(position)))
        pending = [{"group_id": g.group_id, "item_id": g.item_id, "draw": g.draw} for g in groups]
        pending += [p for p in self._regenerate if p["group_id"] not in {q["group_id"] for q in pending}]
        self.state.pending = pending
        self.state.counters = {"gate_started": float(self.gate.started), "orphans": float(self.buffer.orphans),
                               "trained_turns": self.state.counters.get("trained_turns", 0.0),
                               **{f"discarded_{k}": float(v) for k, v in self.buffer.discarded.items()}}
        return self.state
