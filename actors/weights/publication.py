"""Publishing the learner's weights to the generators, with their acks followed in the background.

What must hold:
- One version is in flight at a time: a version is published only once every generator acked the one before
  (or was skipped as stalled), so a generator never has two versions to load.
- The learner does not wait for the acks: it trains the next step while the generators take the version just
  published (they finish their requests in flight first, with `on_weight_update=finish`, which on a busy
  generator takes as long as a reply). The acks are awaited before the next publish, or at once on `wait`.
- `served` is the newest version every generator has (or skipped as stalled); admission counts from it, so
  no group starts on weights older than admission assumes. The learner's own version is `published`.
- A generator that fails to apply a version stops the run, named, as soon as its ack arrives (`check`).
- A stop request ends the wait for acks within seconds; the version stays published as far as it got.
- The run's watch goes on while acks are awaited (`on_wait`, between slices of the wait): a generator that
  dies before it acks is seen down and excused (`excused()`), and once restarted and subscribed again it
  counts as having skipped the version, so the wait ends without reaching `ack_timeout_s`.
- A replica whose hello reached the learner after the current version went out (a restart racing the run's
  republish for it) is named so in the acks, and the version goes out again (`take_resend`): it never waits
  for weights that nobody will send.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Sequence

from core.weights.publisher import SUBSCRIBED_AFTER

log = logging.getLogger("agentgym.coordinator")


class Publication:
    def __init__(self, learners: Callable[[], Any], version: int, ack_timeout_s: float,
                 stopping: Callable[[], bool], on_served: Callable[[int], None] = lambda version: None,
                 slice_s: float = 2.0, on_wait: Callable[[], Awaitable[None]] | None = None,
                 excused: Callable[[], Sequence[str]] = lambda: ()):
        """`learners()`: the learner group now (publish_weights() -> {"version", ...}, wait_acks(version,
        timeout_s, excused) -> {name: (ok, error)}). `version`: what the generators hold now. `on_served(v)` is
        called once every generator has v. `on_wait()` runs after each slice of an ack wait that ended without
        all acks (the run's health check; what it raises ends the wait); `excused()` names the subscribers
        known down, whose acks are not waited for."""
        self.learners, self.ack_timeout_s, self.slice_s = learners, ack_timeout_s, slice_s
        self.stopping, self.on_served, self.on_wait, self.excused = stopping, on_served, on_wait, excused
        self.published = self.served = version
        self.channel: dict[str, float] = {}  # transport metrics of the weights channel
        self._acks: asyncio.Task | None = None
        self.resend = False  # the current version must go out again (`take_resend`)

    async def publish(self, wait: bool = False) -> float:
        """Publish the learner's current version after the previous one is acked; returns the seconds this
        took (the previous version's acks included). `wait`: its own acks too."""
        started = time.monotonic()
        await self.settle()
        info = await asyncio.to_thread(self.learners().publish_weights)
        version = int(info["version"])
        self.published = version
        self.channel["transport/weights_bad_control_messages"] = float(info.get("bad_control_messages", 0))
        self.channel["transport/weights_auth_refused"] = float(info.get("auth_refused", 0))
        self._acks = asyncio.ensure_future(self._follow(version))
        if wait:
            await self.settle()
        return time.monotonic() - started

    def take_resend(self) -> bool:
        """Whether the current version must be published again: its acks named a replica that subscribed (a
        restarted one) after it went out, which holds no weights until it gets them (asked once)."""
        wanted, self.resend = self.resend, False
        return wanted

    async def settle(self) -> None:
        """Wait for the acks of the version last published; raises what a failed generator reported."""
        task, self._acks = self._acks, None
        if task is not None:
            await task

    async def check(self) -> None:
        """Raise now if the acks of the version last published arrived and named a failure."""
        if self._acks is not None and self._acks.done():
            await self.settle()

    async def close(self) -> None:
        """Stop following acks (the run is ending on an error or a stop)."""
        task, self._acks = self._acks, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follow(self, version: int) -> None:
        acks = await self._wait_acks(version)
        if acks is None:  # a stop was requested: the version is trained and saved, published after a resume
            return
        # A replica skipped as stalled keeps its older weights; the staleness gate bounds what it contributes.
        stalled = {name: err for name, (ok, err) in acks.items() if not ok and err.startswith("stalled:")}
        failed = {name: err for name, (ok, err) in acks.items() if not ok and name not in stalled}
        if failed:
            raise RuntimeError(f"generators failed to apply weights version {version}: {failed}")
        if stalled:
            log.warning("weights version %d skipped stalled generators: %s", version, stalled)
        if any(err.startswith(SUBSCRIBED_AFTER) for err in stalled.values()) and version >= self.published:
            self.resend = True  # a replica whose hello came after the version went out: it waits for it
        self.channel["transport/weights_stalled"] = self.channel.get("transport/weights_stalled", 0.0) + len(stalled)
        self.served = max(self.served, version)
        self.on_served(version)

    async def _wait_acks(self, version: int) -> dict | None:
        """Every generator's ack of `version`, waited for in short slices so that a stop request is seen within
        seconds (and the learner is free for the final checkpoint); None when a stop came first."""
        deadline = time.monotonic() + self.ack_timeout_s
        while True:
            if self.stopping():
                return None
            left = deadline - time.monotonic()
            try:
                return await asyncio.to_thread(self.learners().wait_acks, version,
                                               max(0.05, min(self.slice_s, left)), list(self.excused()))
            except Exception as exc:  # a Ray error wrapping the publisher's TimeoutError, or that error itself
                if "no ack from" not in str(exc) or left <= self.slice_s:
                    raise
            if self.on_wait is not None:
                await self.on_wait()
