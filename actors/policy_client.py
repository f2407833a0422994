"""A `Policy` that routes requests over N generator actors: session affinity, least-loaded for new sessions.

What must hold:
- Every request of one session (episode) goes to the same replica, whose prefix cache holds the episode's
  conversation so far (and whose admission slot the episode holds).
- A new session goes to the replica with the lowest load (admitted + waiting episodes over its capacity),
  asked from the replicas themselves (several env pools route independently, so a local count alone would
  be blind to the others); sessions this client routed whose first request is not answered yet are counted
  too (the replica may not count them yet), so a burst of new episodes spreads instead of piling onto one
  replica. Ties rotate from a random start, so independent clients do not all prefer replica 0.
- A replica whose process died is marked down (logged once per failure, not per episode): its episodes end
  `lost` (`PolicyLost`), new sessions go to the replicas that are up, and it is probed every `probe_s` until
  it answers again (Ray restarts it; a restarted replica waits for the current weights before it serves).
  When no replica is up, a new session waits for one, at most `recovery_wait_s`, then fails naming why.
- It is picklable (the routing table starts empty in the new process), so it can be given to env-pool actors.
  Given the replicas' Ray actor names, it travels as those names and looks the handles up on first use: a
  constructor argument holding actor handles is one Ray cannot promise to restore when it restarts the actor
  (it logs an error saying so, ray-project/ray#53727), while names always resolve. It never imports the
  generator.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import Any, Sequence

from ray.exceptions import RayActorError

from core.policy import GenerationRequest, GenerationResult, PolicyLost

log = logging.getLogger("agentgym.policy")


class PolicyClient:
    def __init__(self, handles: Sequence[Any], max_sessions_tracked: int = 1 << 16,
                 recovery_wait_s: float = 300.0, probe_s: float = 2.0, names: Sequence[str] | None = None):
        """`names`: the replicas' Ray actor names (same order as `handles`), which a pickled copy carries."""
        if not handles:
            raise ValueError("PolicyClient needs at least one generator handle")
        if names is not None and len(names) != len(handles):
            raise ValueError(f"PolicyClient: {len(names)} names for {len(handles)} handles")
        self._handles: list | None = list(handles)
        self.names = list(names) if names is not None else None
        self.num_replicas = len(handles)
        self.max_sessions_tracked = max_sessions_tracked
        self.recovery_wait_s, self.probe_s = recovery_wait_s, probe_s
        self._init_state()

    def _init_state(self) -> None:
        self._sticky: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pending = [0] * self.num_replicas  # routed here, first request not answered yet
        self._route_lock: asyncio.Lock | None = None
        self._next = random.randrange(self.num_replicas)  # ties rotate, from a random start per client
        self._down: dict[int, float] = {}  # replica -> when it was last seen failing
        self.lost = 0  # requests that failed because their replica died

    _SETTINGS = ("names", "num_replicas", "max_sessions_tracked", "recovery_wait_s", "probe_s")

    @property
    def handles(self) -> list:
        if self._handles is None:  # a copy that travelled by name: look the replicas up once
            import ray

            self._handles = [ray.get_actor(name) for name in self.names]
        return self._handles

    def __getstate__(self) -> dict:
        state = {k: getattr(self, k) for k in self._SETTINGS}
        state["_handles"] = None if self.names is not None else self._handles
        return state

    def __setstate__(self, state: dict) -> None:
        for k in (*self._SETTINGS, "_handles"):
            setattr(self, k, state[k])
        self._init_state()

    def replica_of(self, session_id: str) -> int | None:
        return self._sticky.get(session_id)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        index = self._sticky.get(request.session_id)
        first = index is None
        if first:
            index = await self._route_new()
            self._remember(request.session_id, index)
        else:
            self._sticky.move_to_end(request.session_id)
        try:
            return await self.handles[index].generate.remote(request)
        except RayActorError as exc:
            self._mark_down(index, exc)
            self._sticky.pop(request.session_id, None)
            raise PolicyLost(f"generator replica {index} died during episode {request.session_id}") from None
        finally:
            if first:
                self._pending[index] -= 1

    def _mark_down(self, index: int, exc: BaseException) -> None:
        self.lost += 1
        if index not in self._down:
            log.warning("generator replica %d is down (%s); routing new episodes to the others until it is back",
                        index, type(exc).__name__)
        self._down[index] = time.monotonic()

    async def _up(self) -> list[int]:
        """The replicas that are up; a down one is probed again once `probe_s` has passed since it failed."""
        due = [i for i, since in self._down.items() if time.monotonic() - since >= self.probe_s]
        if due:
            answers = await asyncio.gather(*(self.handles[i].load.remote() for i in due), return_exceptions=True)
            for i, answer in zip(due, answers):
                if isinstance(answer, BaseException):
                    self._down[i] = time.monotonic()
                else:
                    log.warning("generator replica %d is back", i)
                    del self._down[i]
        return [i for i in range(self.num_replicas) if i not in self._down]

    async def _wait_for_replicas(self) -> list[int]:
        deadline = time.monotonic() + self.recovery_wait_s
        while not (up := await self._up()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no generator replica has been up for {self.recovery_wait_s:.0f} s "
                                   "(generator.recovery_wait_s); they died and did not come back")
            await asyncio.sleep(min(self.probe_s, 1.0))
        return up

    async def end_session(self, session_id: str) -> None:
        index = self._sticky.pop(session_id, None)
        if index is not None:
            await self.handles[index].end_session.remote(session_id)

    async def _route_new(self) -> int:
        if self.num_replicas == 1 and not self._down:
            self._pending[0] += 1
            return 0
        if self._route_lock is None:
            self._route_lock = asyncio.Lock()
        async with self._route_lock:  # one routing decision at a time, so `_pending` is current for each
            up = await self._wait_for_replicas()
            answers = await asyncio.gather(*(self.handles[i].load.remote() for i in up), return_exceptions=True)
            scores = {}
            for i, load in zip(up, answers):
                if isinstance(load, BaseException):
                    self._mark_down(i, load)
                    continue
                scores[i] = (load["sessions"] + load["waiting"] + self._pending[i]) / max(1, load["capacity"])
            if not scores:  # every replica failed just now: wait for one to come back
                return await self._route_new_unlocked()
            n = self.num_replicas
            index = min(scores, key=lambda i: (scores[i], (i - self._next) % n))
            self._next = (index + 1) % n
            self._pending[index] += 1
            return index

    async def _route_new_unlocked(self) -> int:
        up = await self._wait_for_replicas()
        index = up[0]
        self._pending[index] += 1
        return index

    def _remember(self, session_id: str, index: int) -> None:
        self._sticky[session_id] = index
        while len(self._sticky) > self.max_sessions_tracked:  # sessions whose end was never signalled
            self._sticky.popitem(last=False)
