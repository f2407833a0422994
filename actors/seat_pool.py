"""Engine seats (`max_num_seqs`) handed to replies by group age, with a short hold for an episode's next turn.

vLLM decodes at most `max_num_seqs` requests at once; with `scheduling: priority` it admits the waiting request
of the oldest group first. That is not enough for multi-turn episodes: between two turns (the env steps, the
next prompt is tokenized and sent) an episode has no request in the engine, and a newer group's waiting turn
takes its seat at once and keeps it for a whole reply. With as many groups in flight as asynchrony allows, each
turn of the group the next batch waits for then waits about one reply for a seat, so that group, and with it
the learner, takes up to twice as long as it needs.

So the generator gives out the seats itself, before a request reaches the engine:

- a request takes a free seat at once; when there is none, it waits, and waiting requests are served oldest
  group first (lowest `priority`, then arrival);
- when a reply ends, its seat goes at once to a waiting request of the same or an older group; otherwise it is
  held for `hold_s` seconds for the episode's next turn, or for any request of the same or an older group,
  before it goes to a newer group's request;
- the hold ends early when the episode ends (`end`), so an episode's last turn holds nothing back.

What must hold: at most `seats` requests hold a seat; a seat is never idle while a request waits, except held
for at most `hold_s` for a request at least as old as the one that freed it; a request cancelled while waiting
leaves no seat taken. `hold_s` = 0 is a plain priority queue over the seats.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time


class SeatPool:
    def __init__(self, seats: int, hold_s: float):
        if seats < 1:
            raise ValueError(f"seats must be >= 1, got {seats}")
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s}")
        self.seats, self.hold_s = seats, hold_s
        self.in_use = 0
        self._holds: dict[str, tuple[int, asyncio.TimerHandle]] = {}  # session -> (its group's priority, expiry)
        self._waiting: list[tuple[int, int, asyncio.Future]] = []  # heap of (priority, arrival, future)
        self._arrival = itertools.count()
        self.wait_s = 0.0  # seconds requests spent waiting for a seat, summed
        self.held_turns = 0  # requests that took a held seat

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._waiting if not f.done())

    @property
    def held(self) -> int:
        return len(self._holds)

    def _free(self) -> int:
        return self.seats - self.in_use - len(self._holds)

    async def acquire(self, session: str, priority: int) -> None:
        """Take a seat for one request of `session`, whose group has `priority` (lower is older)."""
        if self._free() > 0 and not self.waiting:
            self.in_use += 1
            return
        if self._claim(session, priority):
            self.held_turns += 1
            self.in_use += 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrival), future))
        started = time.monotonic()
        try:
            await future  # the seat is counted in in_use by whoever granted it
        except BaseException:
            if future.done() and not future.cancelled():
                self.release_now()  # granted while we were being cancelled: give it back
            else:
                future.cancel()  # left in the heap, skipped when it comes up
            raise
        finally:
            self.wait_s += time.monotonic() - started

    def _claim(self, session: str, priority: int) -> bool:
        """Take the session's own hold, else the hold of the newest group not older than this request's."""
        if session not in self._holds:
            fits = [s for s, (p, _) in self._holds.items() if p >= priority]
            if not fits:
                return False
            session = min(fits, key=lambda s: self._holds[s][0])  # keep the newer groups' holds for more takers
        _, timer = self._holds.pop(session)
        timer.cancel()
        return True

    def release(self, session: str, priority: int) -> None:
        """A request of `session` ended: its seat goes to a waiting request at least as old, or is held."""
        self.in_use -= 1
        if self._grant_next(max_priority=priority):
            return
        dropped = self._drop_hold(session)  # a hold left by another request of the session: one per session
        hold = self.hold_s > 0 and self._free() > 0
        if hold:
            timer = asyncio.get_running_loop().call_later(self.hold_s, self._expire, session)
            self._holds[session] = (priority, timer)
        if dropped or not hold:
            self._dispatch()

    def release_now(self) -> None:
        """Give a seat back with no hold (a request cancelled after it was granted one)."""
        self.in_use -= 1
        self._dispatch()

    def end(self, session: str) -> None:
        """The episode ended: a seat held for its next turn is free again."""
        if self._drop_hold(session):
            self._dispatch()

    def _drop_hold(self, session: str) -> bool:
        hold = self._holds.pop(session, None)
        if hold is not None:
            hold[1].cancel()
        return hold is not None

    def _expire(self, session: str) -> None:
        self._holds.pop(session, None)
        self._dispatch()

    def _grant_next(self, max_priority: int | None = None) -> bool:
        """Hand a seat to the oldest waiting request (only if its priority <= max_priority, when given)."""
        while self._waiting and self._waiting[0][2].done():
            heapq.heappop(self._waiting)  # cancelled while waiting
        if not self._waiting or (max_priority is not None and self._waiting[0][0] > max_priority):
            return False
        _, _, future = heapq.heappop(self._waiting)
        self.in_use += 1
        future.set_result(None)
        return True

    def _dispatch(self) -> None:
        while self._free() > 0 and self._grant_next():
            pass
