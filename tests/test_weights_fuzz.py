"""A seeded fuzz of the weights subscriber's receive loop with mutated chunks interleaved with genuine versions, in
three modes (core.weights.subscriber, core.weights.assembly, core.weights.seal):

- sealed: an outsider's chunks (aes-gcm): genuine sealed chunks bit-flipped, cut, extended, with frames dropped,
  added or swapped, headers and parts of other chunks, another publisher's key; and captured genuine chunks and
  K messages replayed (early, twice, from older versions);
- inner: chunks sealed with the genuine version key whose inner chunk is malformed (what only a holder of the
  publisher's key could send: a bad kind, header, version, seq, chunk count, part descriptor, dtype, shape,
  name, offset, or a part that overruns, ends early or leaves the version unfinished), and replays;
- plain (auth off): the same malformed inner chunks, random damage to any frame, and replays, all into the relay
  path (the only one an outsider reaches without keys); the publisher's K message vouches for each chunk by its
  digest (core.weights.control.chunk_digest), so a well-formed forged chunk is refused too.

Every mutated message goes through `_receive`, the receive loop's body, on the socket path it names. Asserted, in
every mode: no exception escapes it, ever; each mutated message is refused or ignored, counted once, and leaves
the assembly exactly as it was (but a genuine chunk sent early, which may be taken: it is the genuine one); every
genuine version completes with its own bytes (none blocked, none altered).

`pytest` runs 20,000 mutated chunks per mode (about a second each); `python -m tests.test_weights_fuzz --chunks N
--seed S` runs any size and prints one summary line per mode. A failure names the mode, the seed and the round, so it replays.
"""
from __future__ import annotations

import argparse
import random
import time

import msgpack
import numpy as np
import pytest
import zmq

from core.curve import RunKeys
from core.weights.control import chunk_digest, key_message
from core.weights.seal import PublisherSeal
from core.weights.subscriber import WeightSubscriber
from tests.fuzz_inputs import mangle_frames, nesting_bomb
from tests.test_weights_seal import _mutate

SEED = 20261206
EXPECTED = {"w": (6,), "v": (2, 2)}
PUBLISHER, RELAY = "the publisher", "a relay predecessor"
CI_CHUNKS = 20_000  # the acceptance figure: about a second per mode


class Received:
    """What `recv_multipart(copy=False)` gives: objects with a `buffer`."""

    def __init__(self, data: bytes):
        self.buffer = memoryview(data)


def values(version: int) -> dict[str, bytes]:
    w, v = np.arange(6, dtype=np.float32) * version, np.full((2, 2), version, np.float32)
    return {"w": w.tobytes(), "v": v.tobytes()}


def genuine_version(version: int) -> list[list[bytes]]:
    """Two chunks in the publisher's layout: all of w and half of v, then the rest of v."""
    want = values(version)
    return [[b"C", msgpack.packb({"version": version, "seq": 0, "n_chunks": 2,
                                  "parts": [["w", "float32", [6], 0, 24], ["v", "float32", [2, 2], 0, 16]]}),
             want["w"], want["v"][:8]],
            [b"C", msgpack.packb({"version": version, "seq": 1, "n_chunks": 2,
                                  "parts": [["v", "float32", [2, 2], 8, 16]]}), want["v"][8:]]]


def malformed(rng: random.Random, chunk: list[bytes], seq: int, sealed: bool) -> list[bytes]:
    """`chunk` (seq `seq` of a two-chunk version) made invalid by itself, for any state of the subscriber
    (`sealed`: its kind frame is not sent, so it is left alone)."""
    frames = list(chunk)
    header = msgpack.unpackb(frames[1], raw=False)
    parts = header["parts"]
    kind = rng.randrange(1 if sealed else 0, 17)
    if kind == 0:
        frames[0] = rng.choice([b"X", b"", b"CC", b"K"])
    elif kind == 1:
        frames[1] = rng.choice([rng.randbytes(rng.randrange(0, 40)), nesting_bomb(rng.choice([50, 100_000])),
                                frames[1][:rng.randrange(len(frames[1]))], msgpack.packb([1, 2, 3])])
    elif kind == 2:
        if rng.random() < 0.5:
            del header[rng.choice(sorted(header))]
        else:
            header[rng.choice(["x", "Version", "pad"])] = 1
    elif kind == 3:
        header["version"] = rng.choice([header["version"] + 1, -1, 1 << 62, (1 << 64) - 1, "x", 1.5, None, True])
    elif kind == 4:
        header["seq"] = rng.choice([2, -1, 1 << 40, "0", None, 1.0])
    elif kind == 5:
        header["n_chunks"] = rng.choice([0, -1, 1 << 25, "2", None] + ([3] if seq == 1 else [1]))
    elif kind == 6:
        if rng.random() < 0.5 or len(parts) == 1:
            parts.append(list(parts[-1]))
        else:
            parts.pop()
    elif kind == 7:
        p = parts[rng.randrange(len(parts))]
        slot = rng.randrange(5)
        p[slot] = rng.choice([5, "x", None, [1], 2.5]) if slot != 2 else rng.choice(["x", 5, None])
        if rng.random() < 0.3:
            p.pop()
    elif kind == 8:
        parts[rng.randrange(len(parts))][1] = rng.choice(["complex256", "", "float32\x00", "object", "int4"])
    elif kind == 9:
        parts[0][2] = [7] if parts[0][0] == "w" else [2, 3]
    elif kind == 10:
        parts[0][0] = rng.choice(["model.evil", "w" * 300, "ww"])
    elif kind == 11:  # a shape this model does not have, consistent with its byte count
        parts[0][2] = [3, 2] if parts[0][0] == "w" else [4]
    elif kind == 12:
        parts[0][3] += rng.choice([4, 8, -8]) if parts[0][3] else rng.choice([4, 8])
    elif kind == 13:  # a part longer than what is left of its tensor (all of w, or the rest of v)
        frames[2] = frames[2] + rng.randbytes(rng.randrange(4, 64, 4))
    elif kind == 14:  # ends before its tensor does: inside a chunk (w), or in the last chunk (v)
        frames[2] = frames[2][:rng.randrange(0, len(frames[2]), 4)]
    elif kind == 15:
        parts[0][4] += 4
        parts[0][2] = [parts[0][4] // 4]
    else:  # a frame no descriptor names
        frames.append(rng.randbytes(rng.randrange(0, 16)))
    if 2 <= kind <= 12 or kind == 15:
        frames[1] = msgpack.packb(header)
    if frames == list(chunk):  # a choice that changed nothing: a part that overruns instead
        frames[2] = frames[2] + b"\x00" * 4
    return frames


class Harness:
    """One subscriber with a stand-in publisher socket (nothing arrives on it), fed through `_receive`."""

    def __init__(self, mode: str, seed: int):
        self.mode, self.seed, self.rng = mode, seed, random.Random(seed)
        self.ctx = zmq.Context()
        self.fake = self.ctx.socket(zmq.ROUTER)
        self.fake.bind(f"inproc://weights-fuzz-{mode}")
        keys = RunKeys.generate(["g"], cipher="aes-gcm") if mode != "plain" else None
        self.sub = WeightSubscriber(f"inproc://weights-fuzz-{mode}", name="g", ctx=self.ctx, expected=EXPECTED,
                                    curve=keys.weights_client("g") if keys else None)
        self.fake.recv_multipart()  # its hello
        self.sub.key_wait_s = 0  # nothing would come: a chunk of a version not announced is refused at once
        self.seal = PublisherSeal(keys.weights_server_side(["g"]), 64 << 10) if keys else None
        self.captured: list[list[bytes]] = []  # genuine chunks, replayed later
        self.announcements: list[list[bytes]] = []  # genuine K messages, replayed later
        self.k_replayed = 0
        self.escapes: list[str] = []
        self.mutated = self.altered = self.blocked = self.completed = 0

    def deliver(self, frames: list[bytes], source: str, context: str) -> None:
        try:
            self.sub._receive([Received(bytes(f)) for f in frames], source)
        except Exception as exc:  # noqa: BLE001 - the property under test
            self.escapes.append(f"{context}: {type(exc).__name__}: {exc}")

    def announce(self, version: int) -> None:
        key = self.seal.chunks.key(version) if self.seal is not None else b""
        digests = b"" if self.seal is not None else b"".join(chunk_digest(c[1:]) for c in genuine_version(version))
        message = key_message(self.sub.nonce, version, key, digests)
        message = self.seal.to("g", message) if self.seal is not None else message
        self.announcements.append([bytes(f) for f in message])
        del self.announcements[:-8]
        self.deliver(message, PUBLISHER, f"{self.mode} seed {self.seed} K {version}")

    def wrap(self, version: int, chunk: list[bytes]) -> list[bytes]:
        return [bytes(f) for f in self.seal.chunks.seal(version, chunk)] if self.seal is not None else chunk

    def hostile(self, version: int, seq: int, chunk: list[bytes], sealed: list[bytes]) -> tuple[list[bytes], bool]:
        """A mutated message, and whether it must leave the subscriber as it was (all but a genuine chunk: plain
        mode's chunk "sent as another version's" is the genuine one, as wrapping does nothing there, and random
        damage that happens to change nothing)."""
        rng = self.rng
        if self.captured and rng.random() < 0.3:  # a genuine chunk captured before
            return rng.choice(self.captured[-12:]), True
        if rng.random() < 0.15:  # a genuine chunk of this version before its turn (seen on another path)
            if seq == 0:
                return self.wrap(version, genuine_version(version)[1]), True
            if rng.random() < 0.5:
                return self.wrap(version, genuine_version(version)[0]), True
            return self.wrap(version - 1, chunk), self.mode != "plain"
        if self.mode == "sealed":
            return _mutate(rng, sealed, self.captured[-1] if self.captured else sealed), True
        if self.mode == "inner":
            return self.wrap(version, malformed(rng, chunk, seq, sealed=True)), True
        if rng.random() < 0.5:
            return malformed(rng, chunk, seq, sealed=False), True
        damaged = [bytes(f) for f in mangle_frames(rng, chunk, rng.randrange(4))]
        return damaged, damaged != [bytes(f) for f in chunk]

    def state(self):
        a, sub = self.sub._assembly, self.sub
        held = (id(a), a.version, a.next_seq, dict(a.filled), a.allocated) if a is not None else None
        return held, sub.latest_version, sub._ready is None, sub.drops.total + sub.ignored.total

    def round(self, version: int, mutate: bool) -> None:
        rng, sub = self.rng, self.sub
        context = f"{self.mode} seed {self.seed} version {version}"
        self.announce(version)
        taken = False  # a genuine chunk was taken before its turn this round (what follows may then fit)
        for seq, chunk in enumerate(genuine_version(version)):
            sealed = self.wrap(version, chunk)
            for _ in range(rng.randrange(1, 4) if mutate else 0):
                if rng.random() < 0.05:  # a K message captured before (not counted as a chunk)
                    frames, strict = rng.choice(self.announcements), True
                    self.k_replayed += 1
                else:
                    frames, strict = self.hostile(version, seq, chunk, sealed)
                    self.mutated += 1
                before = self.state()
                self.deliver(frames, rng.choice([PUBLISHER, RELAY]) if self.mode != "plain" else RELAY, context)
                after = self.state()
                if not strict and after[:3] != before[:3]:
                    taken = True
                if strict and not taken:  # refused or ignored, counted once, nothing changed
                    assert after[:3] == before[:3], (context, sub.drops.last_error, sub.ignored.last_error)
                    assert after[3] == before[3] + 1, (context, sub.drops.last_error)
            self.deliver(sealed, rng.choice([PUBLISHER, RELAY]), context)
            self.captured.append(sealed)
        ready = sub._ready
        if ready is None or ready.version != version:
            self.blocked += 1
            assert False, f"{context}: the genuine version did not complete"
        else:
            got = {n: bytes(t.data) for n, t in ready.tensors.items()}
            assert {n: t.shape for n, t in ready.tensors.items()} == EXPECTED, context
            if got != values(version):
                self.altered += 1
                assert False, f"{context}: altered content was taken"
            self.completed += 1
            sub._hand_out()
        if ready is not None and sub._ready is None:
            sub._spare.update(sub._handed_out)  # what the next poll() does
            sub._handed_out = {}
        del self.captured[:-24]

    def run(self, chunks: int) -> dict:
        start = time.monotonic()
        version = 1
        while self.mutated < chunks:
            version += 1
            self.round(version, mutate=True)
        sub = self.sub
        summary = {"mode": self.mode, "seed": self.seed, "mutated_chunks": self.mutated,
                   "replayed_k_messages": self.k_replayed, "versions": version - 1,
                   "complete_and_genuine": self.completed, "altered": self.altered, "blocked": self.blocked,
                   "escapes": len(self.escapes), "refused": dict(sub.drops.by_reason), "ignored":
                   dict(sub.ignored.by_reason), "seconds": round(time.monotonic() - start, 1)}
        self.close()
        return summary

    def close(self) -> None:
        self.sub.close()
        self.fake.close(0)
        self.ctx.term()


def fuzz(mode: str, chunks: int, seed: int = SEED) -> dict:
    harness = Harness(mode, seed)
    summary = harness.run(chunks)
    assert not harness.escapes, harness.escapes[:5]
    return summary


@pytest.mark.parametrize("mode", ["sealed", "inner", "plain"])
def test_mutated_chunks_never_escape_alter_or_block_a_genuine_version(mode):
    summary = fuzz(mode, CI_CHUNKS)
    assert summary["escapes"] == 0 and summary["mutated_chunks"] >= CI_CHUNKS
    assert summary["altered"] == 0 and summary["blocked"] == 0
    assert summary["complete_and_genuine"] == summary["versions"]
    assert summary["ignored"].get("early") and summary["ignored"].get("old")
    if mode == "plain":  # random damage that leaves a well-formed chunk is refused by its digest
        assert summary["refused"].get("digest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000, help="mutated messages per mode")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--modes", nargs="+", default=["plain", "sealed", "inner"])
    args = parser.parse_args()
    for mode in args.modes:
        print(fuzz(mode, args.chunks, args.seed), flush=True)


if __name__ == "__main__":
    main()
