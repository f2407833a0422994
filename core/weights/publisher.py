"""ZeroMQ weights channel: one publisher (learner rank 0) to every generator, versioned, chunked, acknowledged.
This module is the data plane (a version's chunks, the shelf, the fan-outs, the acks awaited); who may subscribe
and what they say is core.weights.peers.

Protocol (every control payload is msgpack, core.weights.control; tensor bytes travel as raw zero-copy frames):
  subscriber -> publisher  [b"H", {"name", "relay"?, "nonce"}]     hello: register to receive weights
  publisher -> subscriber  [b"K", {"nonce", "version", "key", "digests"}]
                                                                   the answer to a hello, and before each version's
                                                                   chunks: the version (aes-gcm: its chunk key;
                                                                   auth off with relay: its chunks' digests), for
                                                                   the incarnation that sent the nonce
  publisher -> subscriber  [b"C", header, part_0, ..., part_k]     one chunk of version `header.version`
  subscriber -> publisher  [b"A", {"version", "ok", "error"}]       ack after the caller applied the version
  subscriber -> publisher  [b"P", {...}], publisher -> it [b"L", {...}]   relay progress and links
  publisher -> subscriber  [b"M", {"path"}], subscriber -> it [b"M", {"token"}]   same-node probe (shm=True)
  publisher -> subscriber  [b"S", {"version", "path", "index"}]      a version on the shelf (core.weights.shm)

Fan-out: `star` sends every chunk to every subscriber; `relay` (core.weights.relay) sends each chunk once, to
the head of a chain of subscribers, each forwarding it to the next, so the publisher's cost does not grow with
the number of replicas.

A chunk header is {"version", "seq", "n_chunks", "parts": [[name, dtype, shape, offset, total_nbytes], ...]}:
part i holds bytes [offset, offset + len(frame_i)) of tensor `name`. Tensors larger than `chunk_bytes` span
several chunks; small ones share a chunk. dtype is a string ("float32", "bfloat16", ...): the channel moves
bytes and never interprets them, so core needs no torch. A subscriber exposes a version only once every
byte of every tensor has arrived; a version that is superseded mid-transfer is discarded.

Under the run's keys every message above is sealed over plain TCP (transport.cipher=aes-gcm, core.weights.seal:
chunks once, under a key per version that the publisher sends each subscriber in a "K" message), and every
connection first passes core.admission's handshake (a token only a holder of a subscriber key can make), so an
outsider makes the publisher hold at most one handshake frame of `MAX_CONTROL_BYTES` and delivers nothing; or
the sockets use CurveZMQ (`curvezmq`). Without keys (auth off, loopback only) frames are capped at
`MAX_CONTROL_BYTES`, but a local process can still send one unfinished multipart message of any size.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import msgpack
import zmq

from core.curve import CurveServer, release_handler
from core.transport import LOOPBACK
from core.weights.control import MAX_DIGESTS, chunk_digest
from core.weights.peers import PACE_S, ROUND_BUDGET, SUBSCRIBED_AFTER, Peers
from core.weights.seal import SealedChunks
from core.weights.tensors import TensorBytes, byte_view, chunk_tensors

log = logging.getLogger("agentgym.weights")

__all__ = ["SUBSCRIBED_AFTER", "TensorBytes", "WeightPublisher"]  # what callers import from here


def _chunk_messages(version: int, tensors: list[TensorBytes], chunk_bytes: int) -> list[list]:
    """`version` as chunk messages [b"C", header, part, ...] (zero-copy views of the tensors' bytes)."""
    chunks = list(chunk_tensors(tensors, chunk_bytes))
    return [[b"C", msgpack.packb({"version": version, "seq": seq, "n_chunks": len(chunks),
                                  "parts": [[t.name, t.dtype, list(t.shape), off, byte_view(t.data).nbytes]
                                            for t, off, _ in chunk]})] + [view for _, _, view in chunk]
            for seq, chunk in enumerate(chunks)]


class WeightPublisher(Peers):
    """The learner's end. Binds; generators connect and say hello.

    What must hold:
    - Only registered subscribers receive weights and are heard: a hello names a subscriber; with CURVE its
      name must be the one its key was issued under, without CURVE it must be one of `expected` (when given).
      Acks count only from the connection that said hello under that name.
    - A malformed control message is dropped and counted (`drops`); nothing a peer sends raises here.
    - A flood on one connection cannot stall a publish: `poll` handles at most `POLL_BUDGET` messages per call,
      and a publish at most `ROUND_BUDGET` per send round (ZeroMQ's ROUTER takes them from its connections in
      turn, so the subscribers' own messages still come through).
    - Without keys (auth off, loopback), a hello under the name of a subscriber whose connection is still open
      is refused, counted in `drops` (reason "name") and logged: another local process cannot displace a live
      subscriber; a restarted one (its old connection closed) takes its place. With keys, the name is the
      key's, and a new connection under the same key replaces the old (the same holder, restarted).
    - A subscriber that stops reading cannot stall the others: each peer is fed as far as its queue allows,
      and one that takes no chunk for `stall_timeout_s` is skipped for the rest of that version, named in
      the log and in `stalled[version]`. With `fanout="relay"` the same holds of a chain member that dies or
      stalls: the chain is re-linked around it (core.weights.relay), counted in `relinked`.
    - Nobody waits for an ack that cannot come: a subscriber that says hello again under its name (a restarted
      process) counts as having skipped the versions it had not acked, and `wait_acks` does not wait for the
      subscribers the caller names as down (`excused`). Publishing a version again sends it to them anew.
    """

    def __init__(self, host: str = LOOPBACK, port: int = 0, chunk_bytes: int = 4 << 20,
                 hwm: int = 8, ctx: zmq.Context | None = None, curve: CurveServer | None = None,
                 expected: Iterable[str] | None = None, stall_timeout_s: float = 30.0, fanout: str = "star",
                 shm: bool = False, await_expected: bool = False):
        """`shm`: serve subscribers on this node through shared memory (core.weights.shm) once they prove it.
        `await_expected`: `wait_acks` waits for every `expected` name, connected or not (see there)."""
        if fanout not in ("star", "relay"):
            raise ValueError(f"fanout must be star or relay, got {fanout!r}")
        super().__init__(host, port, hwm, ctx, curve, expected, shm, await_expected)
        # Chunks stay well under glibc's 32 MB mmap threshold, so the receiver's per-message buffers are
        # recycled from the heap instead of being mapped (and page-faulted) afresh for every chunk.
        self.chunk_bytes = chunk_bytes
        self.stall_timeout_s = stall_timeout_s
        self.fanout = fanout
        self.suspects: set[str] = set()  # lost in the last relayed version: placed at the chain's tail
        self.relinked = 0  # times a relay chain was re-linked around a member
        self.chunks_sent = 0
        self.link_epoch = 0
        self.shelved: frozenset[str] = frozenset()  # subscribers served by the shelf in the current version

    # -- publishing -------------------------------------------------------------------------------------------

    def publish(self, version: int, tensors: Iterable[TensorBytes]) -> int:
        """Send `version` to every registered peer; returns the number of bytes per peer.

        Each peer's queue is bounded by `hwm` chunks, so memory stays bounded; a peer whose queue stays full
        for `stall_timeout_s` is skipped for this version (see the class docstring).
        """
        self.poll(0, ROUND_BUDGET + 2 * len(self.peers))  # hellos waiting (a flood takes its turn only)
        if not self.peers:
            log.warning("weights publisher: version %d has no subscribers", version)
        self.published = max(self.published, version)
        tensors = list(tensors)
        # Auth off, relay: a relayed chunk is checked against its digest, sent on the publisher's own connection
        # (which nobody else can write to), so nothing pushed into a relay socket can alter a version. Two
        # subscribers over TCP or more: none of them is served from the shelf alone, so the chunks are needed.
        over_tcp = [n for n in self.peers.values() if n not in self.same_node]
        relayed = self.fanout == "relay" and not self.authenticated and len(over_tcp) > 1
        messages = _chunk_messages(version, tensors, self.chunk_bytes) if relayed else None
        relayed = relayed and len(messages) <= MAX_DIGESTS
        self._digests = (version, b"".join(chunk_digest(m[1:]) for m in messages) if relayed else b"")
        for routing, name in self.peers.items():  # the version (and its chunk key) before any of its chunks
            self._keys_owed[routing] = (name, version)
        self._send_keys()
        self.stalled.pop(version, None)  # sent again (to a restarted subscriber): whoever skipped it gets it now
        for old in [v for v in self.acks if v < version - 4]:  # bounded bookkeeping
            self.acks.pop(old, None)
            self.stalled.pop(old, None)
        self.shelved = self._shelve(version, tensors)
        if self.shelved and self.shelved.issuperset(self.peers.values()):
            return sum(byte_view(t.data).nbytes for t in tensors)
        if messages is None:
            messages = _chunk_messages(version, tensors, self.chunk_bytes)
        sent = sum(len(part) for m in messages for part in m[2:])
        if self.seal is not None:
            messages = SealedChunks(version, messages, self.seal.chunks, self.seal.buffers)
        if self.fanout == "relay":
            from core.weights.relay import RelayFanout

            RelayFanout(self, version, messages).run()
        else:
            self._fan_out(version, messages)
        return sent

    def _shelve(self, version: int, tensors: list[TensorBytes]) -> frozenset[str]:
        """Put `version` on the shelf for the same-node subscribers; the names it was announced to."""
        names = frozenset(n for n in self.peers.values() if n in self.same_node)
        if self.shelf is None or not names:
            return frozenset()
        live = set(self.peers.values())

        def released(held: int, readers: frozenset[str]) -> bool:
            skipped = self.stalled.get(held, {})
            return all(self.acked.get(n, -1) >= held or n not in live or n in skipped for n in readers)

        placed = self.shelf.put(version, tensors, names, released)
        if placed is None:
            log.info("weights publisher: no shelf slot free (a generator still loads an older version); "
                     "version %d goes over TCP", version)
            return frozenset()
        path, index = placed
        message = [b"S", msgpack.packb({"version": version, "path": path, "index": index})]
        sent = set()
        for routing, name in list(self.peers.items()):
            if name in names:
                try:
                    self.send_to(routing, name, message)
                    sent.add(name)
                except zmq.ZMQError:  # a full or vanished peer: chunks over TCP instead (or nothing)
                    pass
        return frozenset(sent)

    def _fan_out(self, version: int, messages: list[list]) -> None:
        now = time.monotonic()
        cursor = {peer: 0 for peer, name in self.peers.items() if name not in self.shelved}
        progress = {peer: now for peer in self.peers}
        while cursor:
            moved = False
            for peer in list(cursor):
                i = cursor[peer]
                while i < len(messages):
                    try:
                        self.send_chunk(peer, messages[i])
                    except zmq.Again:  # this peer's queue is full: serve the others meanwhile
                        break
                    except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer went away
                        log.warning("weights publisher: dropping peer %s (%s)", self.peers.pop(peer, "?"), exc)
                        i = -1
                        break
                    i += 1
                    moved = True
                    self.chunks_sent += 1
                    progress[peer] = time.monotonic()
                if i < 0 or i >= len(messages):
                    del cursor[peer]
                    continue
                cursor[peer] = i
                idle = time.monotonic() - progress[peer]
                if idle > self.stall_timeout_s:
                    name = self.peers.get(peer, peer.hex())
                    self.stalled.setdefault(version, {})[name] = f"stalled: took no chunk for {idle:.1f} s"
                    log.warning("weights publisher: %s took no chunk of version %d for %.1f s; skipping it "
                                "for this version (%d of %d chunks sent)", name, version, idle, i, len(messages))
                    del cursor[peer]
            # acks and hellos keep flowing, a few per round; a short wait when nobody moved (paced: a flood
            # makes the poll return at once)
            if moved:
                self.poll(0, ROUND_BUDGET)
            else:
                self._paced_poll(1)

    def wait_acks(self, version: int, timeout_s: float, excused: Iterable[str] = ()) -> dict[str, tuple[bool, str]]:
        """Wait until every registered peer acked `version`; returns {peer name: (ok, error)}.

        A peer skipped as stalled for this version counts as answered, with (False, "stalled: ..."); so does
        one named in `excused` (the run knows its process is down) that has not acked. With `await_expected` (a
        run's publisher: every `expected` name is a replica of the run), one not connected now is waited for
        too, unless excused: a restarted one says hello, and a hello after the
        version went out answers for it ("stalled: subscribed after ...", `_missed`), so the run sends it again.
        Raises TimeoutError naming the peers that did not answer in time.
        """
        deadline = time.monotonic() + timeout_s
        excused = frozenset(excused)
        flooded = False
        while True:
            got = dict(self.acks.get(version, {}))
            for name, why in self.stalled.get(version, {}).items():
                got.setdefault(name, (False, why))
            for name in excused & set(self.peers.values()):
                got.setdefault(name, (False, "stalled: its process is down"))
            registered = set(self.peers.values())
            absent = self.expected - registered - excused if self.await_expected else set()
            missing = [n for n in sorted(registered | absent) if n not in got]
            if not missing:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {version}: no ack from {', '.join(sorted(missing))}")
            if flooded:  # the last poll found more waiting than it took, and no answer among them: a pause
                time.sleep(PACE_S)
            # the answers are checked every few messages, flood or not
            flooded = self.poll(50, ROUND_BUDGET) >= ROUND_BUDGET

    def close(self, linger_ms: int = 0) -> None:
        if self.shelf is not None:
            self.shelf.close()
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
        self._sock.close(linger_ms)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()
