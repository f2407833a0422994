"""Seeded generators of hostile inputs for the channels' fuzz tests (trajectory frames, weight chunks, control
messages). Each draws one mutation family at a time from a valid message, so most outputs are invalid in one
specific way: bit flips, truncation, extension, dropped or extra frames, wrong types, overflowing integers,
declared-huge lengths, nesting bombs, NaN/inf, mismatched lengths and inconsistent turns."""
from __future__ import annotations

import random

import msgpack
import numpy as np

from core.codec import encode
from launch.bench.samples import make_trajectory

HUGE_INTS = [2**31 - 1, 2**31, -(2**31), 2**32, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1]
ODD_FLOATS = [float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324, 1e30]
F32_ODD = np.array([np.nan, np.inf, -np.inf, 3.4e38, -0.0, 1e-45, 1e30], np.float32)  # the same, as float32


def odd_value(rng: random.Random):
    """A value of a random type, often an extreme one."""
    return rng.choice([
        None, True, False, rng.choice(HUGE_INTS), rng.choice(ODD_FLOATS), "", "x" * rng.randrange(1, 600),
        b"\x00\xff" * rng.randrange(0, 8), [], [1, "a", None], {}, {"k": [1]}, {b"bytes-key": 1},
        rng.randrange(-5, 5), rng.random(),
    ])


def nesting_bomb(depth: int) -> bytes:
    """msgpack for a list nested `depth` deep, built as bytes (packb itself would recurse)."""
    return b"\x91" * depth + b"\xc0"  # fixarray of one element, `depth` times, around a nil


def flip_bits(rng: random.Random, data: bytes, n: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(n):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def mangle_frames(rng: random.Random, frames: list[bytes], kind: int) -> list[bytes]:
    """Frame-level damage: 0 bit flips, 1 truncation, 2 extension of one frame; 3 frames dropped or repeated."""
    frames = list(frames)
    i = rng.randrange(len(frames))
    if kind == 0:
        frames[i] = flip_bits(rng, frames[i], rng.randrange(1, 8))
    elif kind == 1:
        frames[i] = frames[i][:rng.randrange(len(frames[i]) + 1)]
    elif kind == 2:
        frames[i] = frames[i] + rng.randbytes(rng.randrange(1, 64))
    elif rng.random() < 0.5:
        frames = frames[:rng.randrange(1, len(frames))]
    else:
        frames = frames + [frames[-1]] * rng.randrange(1, 4)
    return frames


def _repack(header: dict) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def trajectory_frames(rng: random.Random) -> list[bytes]:
    """One hostile trajectory message (without the routing frame)."""
    traj = make_trajectory(num_tokens=rng.randrange(0, 120), num_turns=rng.randrange(0, 5), seed=rng.randrange(99))
    frames = [bytes(f) for f in encode(traj)]
    header = msgpack.unpackb(frames[0], raw=False)
    kind = rng.randrange(16)
    if kind < 4:
        frames = mangle_frames(rng, frames, kind)
    elif kind == 4:
        header[rng.choice(sorted(header))] = odd_value(rng)
        frames[0] = _repack(header)
    elif kind == 5:
        key = rng.choice(["sample_index", "horizon", "schema"])
        header[key] = rng.choice(HUGE_INTS)
        frames[0] = _repack(header)
    elif kind == 6:
        desc = header["arrays"][rng.randrange(4)]
        desc[2] = rng.choice(HUGE_INTS + [1 << 40, -1])
        frames[0] = _repack(header)
    elif kind == 7:
        header["metrics"] = {"bomb": 0}
        packed = _repack(header)
        frames[0] = packed.replace(b"\xa4bomb\x00", b"\xa4bomb" + nesting_bomb(rng.choice([50, 5000, 100_000])))
    elif kind == 8:
        which = rng.randrange(3)
        if which == 0 and traj.num_tokens:
            lp = np.frombuffer(frames[3], "<f4").copy()
            lp[rng.randrange(lp.size)] = F32_ODD[rng.randrange(F32_ODD.size)]
            frames[3] = lp.tobytes()
        elif which == 1:
            header["turn_rewards"] = np.full(traj.num_turns, F32_ODD[rng.randrange(F32_ODD.size)], "<f4").tobytes()
            frames[0] = _repack(header)
        else:
            header["metrics"] = {"m": rng.choice(ODD_FLOATS)}
            frames[0] = _repack(header)
    elif kind == 9:  # one array of another length, header and frame consistent with each other
        i = rng.randrange(4)
        n = traj.num_tokens + rng.choice([-1, 1, 7])
        if n >= 0:
            desc = header["arrays"][i]
            desc[2] = n
            frames[1 + i] = (frames[1 + i] * 2 + b"\x00" * 64)[:n * np.dtype(desc[1]).itemsize]
            frames[0] = _repack(header)
    elif kind == 10:  # inconsistent turns
        ends = [rng.choice(HUGE_INTS[:3] + [0, 1, 2, traj.num_tokens, traj.num_tokens + 1]) for _ in range(3)]
        header["turn_ends"] = np.array(ends, np.int64).astype("<i4").tobytes()
        header["turn_rewards"] = np.array([1.0] * len(ends), "<f4").tobytes()
        frames[0] = _repack(header)
    elif kind == 11:  # a reward on a turn that no sampled token precedes
        mask = np.zeros(traj.num_tokens, "u1")
        header["turn_rewards"] = np.array([1.0] * traj.num_turns, "<f4").tobytes()
        frames[2] = mask.tobytes()
        frames[3] = np.zeros(traj.num_tokens, "<f4").tobytes()
        frames[4] = np.full(traj.num_tokens, -1, "<i4").tobytes()
    elif kind == 12:  # str and bytes keys together
        header[b"turn_ends"] = header.pop("turn_ends")
        frames[0] = _repack(header)
    elif kind == 13:  # missing or extra keys
        if rng.random() < 0.5:
            del header[rng.choice(sorted(header))]
        else:
            header[rng.choice(["x", "pad", "Kind"])] = 1
        frames[0] = _repack(header)
    elif kind == 14:
        frames = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 8))]
    else:  # token ids past any vocabulary, or negative
        if traj.num_tokens:
            tokens = np.frombuffer(frames[1], "<i4").copy()
            tokens[rng.randrange(tokens.size)] = rng.choice([-1, 2**31 - 1, 10**6])
            frames[1] = tokens.tobytes()
    return frames


def chunk_message(rng: random.Random, version: int = 1) -> list[bytes]:
    """One hostile weights chunk [kind, header, parts...] around a valid one-chunk version of two tensors."""
    a = np.arange(6, dtype=np.float32)
    b = np.ones((2, 2), dtype=np.float32)
    parts = [["w", "float32", [6], 0, 24], ["v", "float32", [2, 2], 0, 16]]
    header = {"version": version, "seq": 0, "n_chunks": 1, "parts": parts}
    frames = [b"C", msgpack.packb(header), a.tobytes(), b.tobytes()]
    kind = rng.randrange(12)
    if kind < 4:
        frames = mangle_frames(rng, frames, kind)
    elif kind == 4:
        header[rng.choice(sorted(header))] = odd_value(rng)
        frames[1] = msgpack.packb(header)
    elif kind == 5:  # overflowing or declared-huge numbers
        p = parts[rng.randrange(2)]
        slot = rng.choice([2, 3, 4])
        p[slot] = [rng.choice(HUGE_INTS)] * rng.randrange(1, 9) if slot == 2 else rng.choice(HUGE_INTS + [1 << 40])
        frames[1] = msgpack.packb(header)
    elif kind == 6:
        header[rng.choice(["version", "seq", "n_chunks"])] = rng.choice(HUGE_INTS + ODD_FLOATS + [-1])
        frames[1] = msgpack.packb(header)
    elif kind == 7:
        parts[rng.randrange(2)][1] = rng.choice(["complex256", "object", "", "float32\x00", "int4"])
        frames[1] = msgpack.packb(header)
    elif kind == 8:  # a name this model does not have, or a shape it does not have
        parts[0][0] = rng.choice(["model.evil", "w" * 300, ""]) if rng.random() < 0.5 else "w"
        parts[0][2], parts[0][4] = [3, 2], 24
        frames[1] = msgpack.packb(header)
    elif kind == 9:
        frames[1] = nesting_bomb(rng.choice([100, 100_000]))
    elif kind == 10:  # a second chunk of a version never begun
        header.update(seq=1, n_chunks=2)
        frames[1] = msgpack.packb(header)
    else:
        frames = [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 6))]
    return frames


def control_message(rng: random.Random) -> list[bytes]:
    """One hostile control message [kind, body] for the weights publisher."""
    good = rng.choice([[b"H", {"name": "generator-0"}], [b"A", {"version": 0, "ok": True, "error": ""}]])
    kind_frame, body = good[0], dict(good[1])
    kind = rng.randrange(8)
    if kind == 0:
        return [kind_frame, flip_bits(rng, msgpack.packb(body), rng.randrange(1, 5))]
    if kind == 1:
        body[rng.choice(sorted(body))] = odd_value(rng)
    elif kind == 2:
        body["version"] = rng.choice(HUGE_INTS + ODD_FLOATS + [-1])
    elif kind == 3:
        return [kind_frame, nesting_bomb(rng.choice([10, 100_000]))]
    elif kind == 4:
        return [rng.choice([b"", b"X", b"HH", b"C", b"\x00" * 9]), msgpack.packb(body)]
    elif kind == 5:
        return [kind_frame] + [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(0, 4))]
    elif kind == 6:
        return [kind_frame, msgpack.packb(rng.choice([[1], "s", 5, None, {1: 2}]))]
    else:
        body["name"] = rng.choice(["", "x" * 200, "generator-9", "intruder"])
    return [kind_frame, msgpack.packb(body)]
