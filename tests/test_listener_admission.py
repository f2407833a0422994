"""Admission before memory (core.admission): a peer without the run's keys streams one multipart message that never
ends (every frame with the MORE flag) into each listener the run binds, and the listening process's memory must
not follow it. The attacker speaks ZMTP by hand over a raw TCP socket, so nothing in a client library holds it
back: it answers whatever security mechanism the listener's greeting names (NULL: READY and the frames at once;
PLAIN: a HELLO with credentials it made up, then the frames without waiting for an answer; CURVE: the frames),
and reconnects whenever the listener hangs up, until it has sent (had the kernel accept) 1 GiB. The listener runs
in a process of its own (tests/listener_target.py), whose resident memory (VmRSS) is read as the attack goes."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GiB, MiB = 1 << 30, 1 << 20
BOUND = 64 * MiB  # the most a keyless stream may grow the listener's memory by
STOP = 256 * MiB  # growth at which the attack stops early: the bound is broken already (and the host is shared)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting (64 bytes), as a client."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\x00") + b"\x00" + bytes(31)


def command(name: bytes, body: bytes) -> bytes:
    payload = bytes([len(name)]) + name + body
    return bytes([0x04, len(payload)]) + payload if len(payload) < 256 else \
        bytes([0x06]) + struct.pack(">Q", len(payload)) + payload


def more_frames(frame_bytes: int, count: int) -> bytes:
    """`count` long frames of `frame_bytes` each, every one flagged MORE: a message that does not end here."""
    return (b"\x03" + struct.pack(">Q", frame_bytes) + bytes(frame_bytes)) * count


def opening(sock: socket.socket) -> bytes:
    """Greet with the mechanism the listener's greeting names (it sends all of its greeting once it has the
    first 11 bytes of ours); what to send before the frames."""
    sock.sendall(greeting(b"NULL")[:11])
    theirs = b""
    while len(theirs) < 64:
        got = sock.recv(64 - len(theirs))
        if not got:
            raise ConnectionResetError("closed during the greeting")
        theirs += got
    mechanism = theirs[12:32].rstrip(b"\x00")
    sock.sendall(greeting(mechanism)[11:])
    if mechanism == b"NULL":
        return command(b"READY", b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER")
    if mechanism == b"PLAIN":  # user name: a public key of 40 characters; password: a token of 64
        return command(b"HELLO", bytes([40]) + b"0" * 40 + bytes([64]) + b"f" * 64)
    return b""


def attack(endpoint: str, pid: int, frame_bytes: int, total: int = GiB) -> dict:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    batch = more_frames(frame_bytes, max(1, (4 * MiB) // frame_bytes))
    start, sent, connections, peak = rss(pid), 0, 0, 0
    deadline = time.monotonic() + 240
    while sent < total and peak - start <= STOP and time.monotonic() < deadline:
        connections += 1
        try:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                view = memoryview(opening(sock) + batch)
                while sent < total and peak - start <= STOP:
                    n = sock.send(view)
                    sent += n
                    view = view[n:] if n < len(view) else memoryview(batch)
                    peak = max(peak, rss(pid))
        except (ConnectionError, socket.timeout, OSError):
            pass
        peak = max(peak, rss(pid))
    time.sleep(0.5)
    peak = max(peak, rss(pid))
    return {"sent": sent, "growth": peak - start, "connections": connections}


def listener(kind: str, cipher: str):
    proc = subprocess.Popen([sys.executable, "-m", "tests.listener_target", kind, cipher], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"the {kind} listener did not start")
    time.sleep(1.0)  # its imports and first allocations settle before the baseline is read
    return proc, json.loads(line)["endpoint"]


# The frames: 8 MiB where the listener takes frames that large; the weights publisher's socket only takes
# control messages, so there each frame is just under its cap (64 KiB), which is all a peer can send it.
@pytest.mark.parametrize("cipher", ["aes-gcm", "curvezmq"])
@pytest.mark.parametrize("kind,frame_bytes", [("trajectory", 8 * MiB), ("weights", 60 << 10), ("relay", 8 * MiB)])
def test_a_keyless_never_ending_message_does_not_grow_the_listener(kind, frame_bytes, cipher):
    proc, endpoint = listener(kind, cipher)
    try:
        result = attack(endpoint, proc.pid, frame_bytes)
        alive = proc.poll() is None
    finally:
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait(30)
    assert alive, f"the {kind} listener died under the attack"
    assert result["sent"] >= GiB and result["growth"] <= BOUND, (kind, result, out)


def one_long_frame(endpoint: str, pid: int, frame_bytes: int) -> dict:
    """Greet, then send a single handshake frame of `frame_bytes` (a command, as ZMTP allows any size for one):
    what the listener holds of it before the mechanism can look at it is all its frame cap lets in."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    start, sent = rss(pid), 0
    peak = start
    chunk = bytes(4 * MiB)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            opening(sock)
            sock.sendall(bytes([0x06]) + struct.pack(">Q", frame_bytes))
            while sent < frame_bytes and peak - start <= STOP:
                sent += sock.send(chunk[:min(len(chunk), frame_bytes - sent)])
                peak = max(peak, rss(pid))
    except (ConnectionError, socket.timeout, OSError):
        pass
    time.sleep(0.5)
    return {"sent": sent, "growth": max(peak, rss(pid)) - start}


@pytest.mark.parametrize("kind", ["trajectory", "weights", "relay"])
def test_a_keyless_peer_cannot_make_a_listener_hold_one_frame_larger_than_its_cap(kind):
    """One 256 MiB handshake frame: each listener's frame cap (the largest valid frame; 64 KiB for the
    publisher; a relay's `chunk_frame_cap` of the run's chunk size, as a generator replica sets it) cuts the
    connection long before it is held."""
    proc, endpoint = listener(kind, "aes-gcm")
    try:
        result = one_long_frame(endpoint, proc.pid, 256 * MiB)
        alive = proc.poll() is None
    finally:
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait(30)
    assert alive, f"the {kind} listener died"
    assert result["growth"] <= BOUND, (kind, result, out)
