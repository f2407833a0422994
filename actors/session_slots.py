"""Admission of episodes (sessions) to one generator, sized so that their prefixes stay in the KV cache.

Multi-turn episodes re-send their whole conversation every turn and rely on vLLM's prefix cache to skip it.
If more episodes are in flight than the cache holds, each one's cached prefix is evicted while its env
steps, every turn recomputes every prompt, and throughput collapses (measured: 265 -> 41 tokens/s by turn 10
with 160 episodes over a 2 GiB cache). So a generator admits at most `capacity` sessions at once:

- a session takes a slot on its first request and keeps it across its turns, without re-queueing;
- a new session waits (first come, first served) while every slot is held;
- a slot is freed by `release` (the rollout loop's `end_session` when the episode ends), or when its session
  has had no request in flight for `idle_s` seconds (a backstop for ends that were never signalled; such a
  session simply queues again on its next request).
"""
from __future__ import annotations

import asyncio
import collections
import time


class SessionSlots:
    def __init__(self, capacity: int, idle_s: float):
        self.idle_s = idle_s
        self._last: dict[str, float] = {}  # holder -> time its last request ended (or started)
        self._busy: collections.Counter[str] = collections.Counter()  # holder -> requests in flight
        self._waiters: collections.deque[tuple[str, asyncio.Future]] = collections.deque()
        self.expired = 0
        self.admitted = 0
        self.resize(capacity)

    @property
    def active(self) -> int:
        return len(self._last)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, session: str) -> float:
        """Mark a request of `session` in flight, taking a slot first if it holds none. Returns seconds waited."""
        started = time.monotonic()
        if session not in self._last:
            if len(self._last) >= self.capacity or self._waiters:
                self._expire_idle()
            if len(self._last) >= self.capacity or self._waiters:
                future = asyncio.get_running_loop().create_future()
                self._waiters.append((session, future))
                try:
                    while not future.done():
                        await asyncio.wait({future}, timeout=max(1.0, self.idle_s / 4))
                        if not future.done():
                            self._expire_idle()
                except BaseException:
                    if future.done() and not future.cancelled():
                        self._drop(session)  # granted while we were being cancelled: give it back
                    else:
                        self._remove_waiter(session, future)
                    raise
            else:
                self._grant(session)
        self._busy[session] += 1
        self._last[session] = time.monotonic()
        return time.monotonic() - started

    def done(self, session: str) -> None:
        """A request of `session` finished (its slot is kept for the next turn)."""
        if self._busy[session] <= 1:
            self._busy.pop(session, None)
        else:
            self._busy[session] -= 1
        if session in self._last:
            self._last[session] = time.monotonic()

    def resize(self, capacity: int) -> None:
        """A new capacity (e.g. episodes grow longer with the horizon); holders above it keep their slots."""
        if capacity < 1:
            raise ValueError(f"session capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._wake()

    def release(self, session: str) -> bool:
        """The session ended: free its slot. Returns whether it held one."""
        held = session in self._last
        self._drop(session)
        return held

    def _grant(self, session: str) -> None:
        self._last[session] = time.monotonic()
        self.admitted += 1

    def _drop(self, session: str) -> None:
        self._last.pop(session, None)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and len(self._last) < self.capacity:
            session, future = self._waiters.popleft()
            if future.done():
                continue
            self._grant(session)
            future.set_result(None)

    def _remove_waiter(self, session: str, future: asyncio.Future) -> None:
        try:
            self._waiters.remove((session, future))
        except ValueError:
            pass

    def _expire_idle(self) -> None:
        now = time.monotonic()
        stale = [s for s, t in self._last.items() if not self._busy.get(s) and now - t > self.idle_s]
        for s in stale:
            self._last.pop(s)
        self.expired += len(stale)
        if stale:
            self._wake()
