"""Control messages of the weights channel (core.weights.publisher has the data protocol), each checked on decode.

  subscriber -> publisher  [b"H", {"name", "relay"?, "nonce"}]            hello ("relay": its forwarding endpoint;
                                                                          "nonce": random, per incarnation)
  subscriber -> publisher  [b"A", {"version", "ok", "error"}]             ack after the caller applied a version
  subscriber -> publisher  [b"P", {"version", "chunks", "done", "epoch", "blocked"}]
                                                                          progress: what it holds (relay)
  publisher -> subscriber  [b"L", {"epoch", "next", "next_key", "prev_key", "stall_s"}]
                                                                          relay link: whom to forward to
  publisher -> subscriber  [b"K", {"nonce", "version", "key", "digests"}]
                                                                          the version (aes-gcm: its chunk key, hex),
                                                                          for the hello that carried "nonce"; auth
                                                                          off with relay fan-out: each chunk's digest

A parser raises only `WireError`, naming the field; every string and number is bounded before use.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import msgpack

from core.trajectory import WireError

MAX_CONTROL_BYTES = 64 << 10  # hellos, acks, progress reports and links are a few dozen bytes
MAX_VERSION = (1 << 62) - 1
MAX_ENDPOINT = 256
KEY_CHARS = 40  # a Z85-encoded CURVE public key
CONTROL_KINDS = (b"H", b"A", b"P", b"M")


def unpack_map(buf, max_array_len: int = 16) -> dict:
    """A msgpack map of short strings, numbers and arrays of at most `max_array_len`; WireError otherwise."""
    try:
        body = msgpack.unpackb(buf, raw=False, max_str_len=4096, max_bin_len=0, max_array_len=max_array_len,
                               max_map_len=16, max_ext_len=0)
    except Exception as exc:
        raise WireError("body", f"not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise WireError("body", f"expected a map, got {type(body).__name__}")
    return body


def control(frames: list) -> tuple[bytes, dict]:
    """Parse a subscriber's control message [kind, msgpack map] (buffers); WireError if malformed."""
    if len(frames) != 2:
        raise WireError("frames", f"expected 2 frames, got {len(frames)}")
    kind = bytes(frames[0][:8])
    if kind not in CONTROL_KINDS:
        raise WireError("kind", f"unknown control message {kind[:8]!r}")
    return kind, unpack_map(frames[1])


def field(body: dict, key: str, typ: type):
    value = body.get(key)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise WireError(key, f"expected {typ.__name__}, got {type(value).__name__}")
    return value


def int_field(body: dict, key: str, lo: int, hi: int) -> int:
    value = field(body, key, int)
    if not lo <= value <= hi:
        raise WireError(key, f"expected an int in [{lo}, {hi}], got {value}")
    return value


def endpoint_field(body: dict, key: str) -> str:
    value = field(body, key, str)
    if value and (len(value) > MAX_ENDPOINT or not value.startswith("tcp://")):
        raise WireError(key, f"expected a tcp:// endpoint of at most {MAX_ENDPOINT} characters")
    return value


def key_field(body: dict, key: str) -> str:
    value = field(body, key, str)
    if value and len(value) != KEY_CHARS:
        raise WireError(key, f"expected a {KEY_CHARS}-character Z85 key or nothing")
    return value


@dataclass(frozen=True)
class Progress:
    """What a subscriber holds: `chunks` of `version` (being assembled), or all of it when `done`."""

    version: int
    chunks: int
    done: bool
    epoch: int
    blocked: bool  # its successor's queue is full: it waits for downstream, not for its feeder


def parse_progress(body: dict) -> Progress:
    return Progress(int_field(body, "version", -1, MAX_VERSION), int_field(body, "chunks", 0, 1 << 24),
                    field(body, "done", bool), int_field(body, "epoch", 0, MAX_VERSION), field(body, "blocked", bool))


def progress_message(version: int, chunks: int, done: bool, epoch: int, blocked: bool) -> list[bytes]:
    return [b"P", msgpack.packb({"version": version, "chunks": chunks, "done": done, "epoch": epoch,
                                 "blocked": blocked})]


@dataclass(frozen=True)
class Link:
    epoch: int
    next: str  # the successor's forwarding endpoint ("": forward to nobody)
    next_key: str  # the successor's public key, which its forwarding socket serves with (CURVE)
    prev_key: str  # the predecessor's public key, to admit (CURVE)
    stall_s: float  # drop a successor that takes nothing for this long


def parse_link(frames: list) -> Link:
    """A relay link from [kind, msgpack map] (buffers); WireError if malformed."""
    if len(frames) != 2:
        raise WireError("frames", f"a relay link has 2 frames, got {len(frames)}")
    body = unpack_map(frames[1])
    stall = field(body, "stall_s", float)
    if not 0 < stall < 1e6:
        raise WireError("stall_s", f"expected a positive number of seconds, got {stall!r:.20}")
    return Link(int_field(body, "epoch", 0, MAX_VERSION), endpoint_field(body, "next"),
                key_field(body, "next_key"), key_field(body, "prev_key"), stall)


def link_message(link: Link) -> list[bytes]:
    return [b"L", msgpack.packb({"epoch": link.epoch, "next": link.next, "next_key": link.next_key,
                                 "prev_key": link.prev_key, "stall_s": float(link.stall_s)})]


NONCE_CHARS = 32  # 16 random bytes, hex


def new_nonce() -> str:
    return os.urandom(NONCE_CHARS // 2).hex()


def hello_nonce(body: dict) -> str:
    """The nonce of a hello ("" if it has none); WireError if it is not 32 hex characters."""
    nonce = body.get("nonce", "")
    if not isinstance(nonce, str) or (nonce and (len(nonce) != NONCE_CHARS or not _is_hex(nonce))):
        raise WireError("nonce", f"expected {NONCE_CHARS} hex characters")
    return nonce


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


DIGEST_BYTES = 16  # SHA-256 of a chunk, cut to 128 bits (auth off: what a relayed chunk is checked against)
MAX_DIGESTS = 1 << 16  # chunks a K message can vouch for: 256 GiB at the default 4 MiB chunk


def chunk_digest(frames: list) -> bytes:
    """The digest of a chunk's header and parts (buffers): each frame's length, then its bytes, so frames cannot
    be re-cut without changing it."""
    h = hashlib.sha256()  # with the CPU's SHA instructions about twice blake2b's speed (1.7 GiB/s on one EPYC core)
    for frame in frames:
        view = memoryview(frame).cast("B")
        h.update(len(view).to_bytes(8, "little"))
        h.update(view)
    return h.digest()[:DIGEST_BYTES]


def key_message(nonce: str, version: int, key: bytes = b"", digests: bytes = b"") -> list[bytes]:
    """The K message answering the hello that carried `nonce`: `version`, (aes-gcm) its chunk key and (auth off,
    relay) the digests of its chunks in order (`chunk_digest` of each chunk's frames after the kind)."""
    return [b"K", msgpack.packb({"nonce": nonce, "version": version, "key": key.hex(), "digests": digests})]


def read_key_message(frames: list, nonce: str, sealed: bool) -> tuple[int, bytes, bytes]:
    """(version, chunk key, chunk digests) of a K message for the incarnation whose hello carried `nonce`;
    WireError otherwise (field "nonce" when it answers another hello)."""
    if len(frames) != 2:
        raise WireError("frames", f"a K message has 2 frames, got {len(frames)}")
    try:
        body = msgpack.unpackb(frames[1], raw=False, max_str_len=128, max_bin_len=MAX_DIGESTS * DIGEST_BYTES,
                               max_array_len=0, max_map_len=4, max_ext_len=0)
    except Exception as exc:
        raise WireError("body", f"not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(body, dict) or set(body) != {"nonce", "version", "key", "digests"}:
        raise WireError("body", "expected a map of nonce, version, key and digests")
    version, key, digests = body["version"], body["key"], body["digests"]
    if not isinstance(version, int) or isinstance(version, bool) or not -1 <= version <= MAX_VERSION:
        raise WireError("version", f"expected an int in [-1, {MAX_VERSION}]")
    want = 64 if sealed and version >= 0 else 0
    if not isinstance(key, str) or len(key) != want or not _is_hex(key):
        raise WireError("key", f"expected {want} hex characters")
    if not isinstance(digests, bytes) or len(digests) % DIGEST_BYTES or (sealed and digests):
        raise WireError("digests", f"expected a multiple of {DIGEST_BYTES} bytes (none when sealed)")
    if not nonce or body["nonce"] != nonce:
        raise WireError("nonce", "a K message answering another hello (an earlier incarnation's, replayed)")
    return version, bytes.fromhex(key), digests
