"""Relay fan-out of one weights version: the publisher sends each chunk once, to the head of a chain of
subscribers; each forwards every chunk it accepted to its successor (core.weights.forward), so a version reaches
N replicas in about one transfer time plus N chunk latencies, and the publisher's cost does not grow with N.

How the chain is formed: the relay subscribers in the order they registered, those lost in the previous version
last (a dead one then holds up nobody); a subscriber without a forwarding socket is fed directly. Each member is
told its successor's endpoint (and, with CURVE, the successor's public key, which the successor's forwarding
socket serves with, and its predecessor's key, which it admits) by a link message, sent only when it changes.

What must hold:
- Every member ends the version complete or counted lost (`stalled[version]`, named, "stalled: ..."): `run`
  returns only then. Members report progress (chunks held, whether their forwarding is blocked) every fraction
  of a second while they poll.
- A member that dies or stalls holds up the others for at most about `stall_timeout_s`: a member that has had
  chunks to take, took none for that long and is not blocked by its own successor is either silent for that
  long (dead, stopped, or not polling: lost; its successor is fed from its last reported chunk by the
  publisher, and its predecessor forwards to nobody) or alive with a broken link into it (fed by the publisher
  from its last reported chunk). Re-links are counted in `relinked`. A re-fed chunk that a member already holds
  is ignored there, so a stale progress report costs bytes, never correctness.
"""
from __future__ import annotations

import logging
import time

import zmq

from core.weights.control import Link, link_message

log = logging.getLogger("agentgym.weights")

LINK_CONFIRM_S = 2.0  # how long a changed chain waits for its members to confirm their links before sending
PROBE_S = 1.0  # a member silent this long is sent its link again: a closed connection then shows at once


class RelayFanout:
    def __init__(self, pub, version: int, messages: list[list]):
        self.pub, self.version, self.messages = pub, version, messages
        self.n = len(messages)
        self.start = time.monotonic()
        names = [n for n in dict.fromkeys(pub.peers.values()) if n not in pub.shelved]
        relays = [n for n in names if pub.relays.get(n)]
        self.chain = [n for n in relays if n not in pub.suspects] + [n for n in relays if n in pub.suspects]
        self.prev = {b: a for a, b in zip(self.chain, self.chain[1:])}
        self.feeds = {n: 0 for n in self.chain[:1] + [n for n in names if n not in relays]}
        self.members = self.chain + [n for n in names if n not in relays]
        self.lost: set[str] = set()
        self.advanced = {n: self.start for n in self.members}
        self.seen = {n: -1 for n in self.members}
        self.outbox: dict[str, list] = {}
        self.probed: dict[str, float] = {}

    # -- what each member holds ---------------------------------------------------------------------------------

    def chunks(self, name: str) -> int:
        p = self.pub.progress.get(name)
        if p is None or p.version < self.version:
            return 0
        return self.n if (p.done or p.version > self.version) else p.chunks

    def done(self, name: str) -> bool:
        acked = self.pub.acks.get(self.version, {})
        return name in acked or self.chunks(name) >= self.n

    def blocked(self, name: str) -> bool:
        p = self.pub.progress.get(name)
        return p is not None and p.blocked

    def feeder_ahead(self, name: str) -> bool:
        if name in self.feeds:
            return self.feeds[name] > self.chunks(name)
        before = self.prev.get(name)
        return before is not None and self.chunks(before) > self.chunks(name)

    # -- links ------------------------------------------------------------------------------------------------

    def link(self, name: str, successor: str, again: bool = False) -> bool:
        """Tell `name` to forward to `successor` ("" : nobody), if that is not what it was told last (`again`:
        even so; a member answers every link with a progress report)."""
        if self.pub.links.get(name) == successor and name not in self.outbox and not again:
            return False
        self.pub.link_epoch += 1
        keys = self.pub.keys
        message = link_message(Link(self.pub.link_epoch, self.pub.relays.get(successor, "") if successor else "",
                                    keys.get(successor, "") if successor else "", keys.get(self._before(name), ""),
                                    self.pub.stall_timeout_s))
        self.pub.links[name] = successor
        self.outbox[name] = message
        self._deliver()
        return True

    def _before(self, name: str) -> str:
        return self.prev.get(name, "")

    def _deliver(self) -> None:
        routes = self.routes()
        for name in list(self.outbox):
            message = self.outbox.pop(name, None)
            routing = routes.get(name)
            if message is None or routing is None:
                continue
            try:
                self.pub.send_to(routing, name, message)
            except zmq.Again:  # its queue is full: tried again on the next turn (unless a newer link replaced it)
                self.outbox.setdefault(name, message)
            except zmq.ZMQError as exc:
                self.gone(name, routing, exc)

    def gone(self, name: str, routing: bytes, exc: Exception) -> None:
        """Its connection is closed (EHOSTUNREACH): it is no subscriber any more, as under star fan-out."""
        if self.pub.peers.pop(routing, None) is not None:
            log.warning("weights relay: dropping peer %s (%s)", name, exc)
        if name in self.members and name not in self.lost:
            self.lose(name, f"stalled: unreachable ({exc})")

    def routes(self) -> dict[str, bytes]:
        return {name: routing for routing, name in self.pub.peers.items()}

    def form(self) -> None:
        """Send the links of this version's chain, and wait briefly for the changed ones to be confirmed."""
        epoch = self.pub.link_epoch
        changed = [a for a, b in zip(self.chain, self.chain[1:] + [""]) if self.link(a, b)]
        changed = [n for n in changed if n not in self.pub.suspects and n in self.routes()]
        deadline = time.monotonic() + min(LINK_CONFIRM_S, self.pub.stall_timeout_s)
        while changed and time.monotonic() < deadline:
            self.pub.poll(20)
            self._deliver()
            if all((p := self.pub.progress.get(n)) is not None and p.epoch > epoch for n in changed):
                break

    # -- the version ----------------------------------------------------------------------------------------

    def run(self) -> None:
        self.form()
        while True:
            moved = self._send()
            self._deliver()
            self.pub.poll(0 if moved else 1)
            now = time.monotonic()
            live = [n for n in self.members if n not in self.lost and not self.done(n)]
            if not live:
                break
            for name in live:
                have = self.chunks(name)
                if have > self.seen[name] or not self.feeder_ahead(name):
                    # The clock runs only while it has had chunks to take and took none: waiting on its feeder
                    # (or on a successor that blocks its forwarding) is not its fault.
                    self.seen[name], self.advanced[name] = have, now
                silent = now - max(self.pub.heard.get(name, 0.0), self.start)
                if silent > PROBE_S and now - self.probed.get(name, 0.0) > PROBE_S and name in self.chain:
                    self.probed[name] = now  # a killed member's connection is gone: sending to it says so
                    self.link(name, self.pub.links.get(name, ""), again=True)
                if name in self.lost or now - self.advanced[name] <= self.pub.stall_timeout_s:
                    continue
                if silent > self.pub.stall_timeout_s:
                    self.lose(name, f"stalled: sent nothing for {silent:.1f} s while relaying version {self.version}")
                elif not self.blocked(name):  # alive, not waiting on its successor: the way in is broken
                    self.refeed(name, "took no chunk from its feeder")
        self.pub.suspects = set(self.lost)

    def _send(self) -> bool:
        moved = False
        routes = self.routes()
        for name in list(self.feeds):
            routing = routes.get(name)
            if routing is None or name in self.lost:
                self.feeds.pop(name)
                if routing is None and name not in self.lost:
                    self.lose(name, "stalled: its connection was replaced or closed")
                continue
            i = self.feeds[name]
            while i < self.n:
                try:
                    self.pub.send_chunk(routing, self.messages[i])
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:  # EHOSTUNREACH: it went away
                    self.gone(name, routing, exc)
                    break
                i += 1
                moved = True
                self.pub.chunks_sent += 1
            if name in self.feeds:
                self.feeds[name] = i
        return moved

    def lose(self, name: str, why: str) -> None:
        """Count `name` out of this version and re-link the chain around it."""
        self.lost.add(name)
        self.pub.stalled.setdefault(self.version, {})[name] = why
        self.feeds.pop(name, None)
        before = self.prev.pop(name, None)
        after = next((b for b, a in self.prev.items() if a == name), None)
        log.warning("weights relay: %s is out of version %d (%s)", name, self.version, why)
        if before is not None:
            self.link(before, "")
        if name in self.chain:
            self.link(name, "")  # if it comes back, it forwards to nobody
        if after is not None:
            self.refeed(after, f"its predecessor {name} was lost")

    def refeed(self, name: str, why: str) -> None:
        """The publisher feeds `name` itself from its last reported chunk; its predecessor forwards to nobody."""
        before = self.prev.pop(name, None)
        if before is not None:
            self.link(before, "")
        self.feeds[name] = self.chunks(name)
        self.advanced[name] = time.monotonic()
        self.pub.relinked += 1
        log.warning("weights relay: feeding %s directly from chunk %d of version %d (%s)", name,
                    self.feeds[name], self.version, why)
