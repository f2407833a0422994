"""A `Policy` that routes requests over N generator actors: session affinity, least-loaded for new sessions.

What must hold:
- Every request of one session (episode) goes to the same replica, whose prefix cache holds the episode's
  conversation so far (and whose admission slot the episode holds).
- A new session goes to the replica with the lowest load (admitted + waiting episodes over its capacity),
  asked from the replicas themselves (several env pools route independently, so a local count alone would
  be blind to the others); sessions this client routed whose first request is not answered yet are counted
  too (the replica may not count them yet), so a burst of new episodes spreads instead of piling onto one
  replica. Ties rotate from a random start, so independent clients do not all prefer replica 0.
- It is picklable (the handles travel; the routing table starts empty in the new process), so it can be given
  to env-pool actors. It holds handles, never imports the generator.
"""
from __future__ import annotations

import asyncio
import collections
import random
from typing import Any, Sequence

from core.policy import GenerationRequest, GenerationResult


class PolicyClient:
    def __init__(self, handles: Sequence[Any], max_sessions_tracked: int = 1 << 16):
        if not handles:
            raise ValueError("PolicyClient needs at least one generator handle")
        self.handles = list(handles)
        self.max_sessions_tracked = max_sessions_tracked
        self._init_state()

    def _init_state(self) -> None:
        self._sticky: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pending = [0] * len(self.handles)  # routed here, first request not answered yet
        self._route_lock: asyncio.Lock | None = None
        self._next = random.randrange(len(self.handles))  # ties rotate, from a random start per client

    def __getstate__(self) -> dict:
        return {"handles": self.handles, "max_sessions_tracked": self.max_sessions_tracked}

    def __setstate__(self, state: dict) -> None:
        self.handles = state["handles"]
        self.max_sessions_tracked = state["max_sessions_tracked"]
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
        finally:
            if first:
                self._pending[index] -= 1

    async def end_session(self, session_id: str) -> None:
        index = self._sticky.pop(session_id, None)
        if index is not None:
            await self.handles[index].end_session.remote(session_id)

    async def _route_new(self) -> int:
        if len(self.handles) == 1:
            self._pending[0] += 1
            return 0
        if self._route_lock is None:
            self._route_lock = asyncio.Lock()
        async with self._route_lock:  # one routing decision at a time, so `_pending` is current for each
            loads = await asyncio.gather(*(h.load.remote() for h in self.handles))
            scores = [(load["sessions"] + load["waiting"] + self._pending[i]) / max(1, load["capacity"])
                      for i, load in enumerate(loads)]
            n = len(scores)
            index = min(range(n), key=lambda i: (scores[i], (i - self._next) % n))
            self._next = (index + 1) % n
            self._pending[index] += 1
            return index

    def _remember(self, session_id: str, index: int) -> None:
        self._sticky[session_id] = index
        while len(self._sticky) > self.max_sessions_tracked:  # sessions whose end was never signalled
            self._sticky.popitem(last=False)
