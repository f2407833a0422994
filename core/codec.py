"""msgpack encoding of trajectory records, with the per-token arrays as separate zero-copy frames.

A record is one multipart message:
  frame 0: msgpack header {"schema", "kind": "trajectory", ids, horizon, termination, turn arrays, metrics,
           "turn_actions": [str, ...], "arrays": [[name, dtype, length], ...]}
  frames 1..4: the raw little-endian bytes of tokens, loss_mask, logprobs, versions (in that order).

Nothing is pickled. Decoding checks the schema version, every field's type, the frame count and sizes, and
then the record's own invariants (`Trajectory.validate`); any failure raises `WireError` naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import msgpack
import numpy as np

from core.trajectory import (
    LOGPROB_DTYPE,
    MASK_DTYPE,
    TOKEN_DTYPE,
    VERSION_DTYPE,
    Termination,
    Trajectory,
    WireError,
)

SCHEMA_VERSION = 2  # 2: turn_actions
KIND = "trajectory"
ARRAY_FIELDS: tuple[tuple[str, np.dtype], ...] = (
    ("tokens", TOKEN_DTYPE),
    ("loss_mask", MASK_DTYPE),
    ("logprobs", LOGPROB_DTYPE),
    ("versions", VERSION_DTYPE),
)
_HEADER_KEYS = {
    "schema", "kind", "trajectory_id", "group_id", "item_id", "env", "sample_index", "horizon",
    "termination", "turn_ends", "turn_rewards", "metrics", "turn_actions", "arrays",
}


@dataclass(frozen=True)
class WireLimits:
    """Size limits a decoder enforces before it allocates anything, and what the consumer's model accepts."""

    max_header_bytes: int = 1 << 20
    max_tokens: int = 1 << 22
    max_turns: int = 1 << 16
    vocab_size: int = 0  # token ids must be below this (0: unchecked)
    max_abs_reward: float = 1e6

    @property
    def max_message_bytes(self) -> int:
        """The largest a whole valid message (every frame together) can be."""
        per_token = sum(dtype.itemsize for _, dtype in ARRAY_FIELDS)
        return self.max_header_bytes + self.max_tokens * per_token


def encode(traj: Trajectory) -> list[bytes | memoryview]:
    """Encode a record into frames; the array frames are views of the record's own buffers (no copy)."""
    header = {
        "schema": SCHEMA_VERSION,
        "kind": KIND,
        "trajectory_id": traj.trajectory_id,
        "group_id": traj.group_id,
        "item_id": traj.item_id,
        "env": traj.env,
        "sample_index": traj.sample_index,
        "horizon": traj.horizon,
        "termination": traj.termination.value,
        "turn_ends": np.ascontiguousarray(traj.turn_ends, TOKEN_DTYPE).tobytes(),
        "turn_rewards": np.ascontiguousarray(traj.turn_rewards, LOGPROB_DTYPE).tobytes(),
        "metrics": {k: float(v) for k, v in traj.metrics.items()},
        "turn_actions": list(traj.turn_actions),
        "arrays": [[name, dtype.str, int(getattr(traj, name).shape[0])] for name, dtype in ARRAY_FIELDS],
    }
    frames: list[bytes | memoryview] = [msgpack.packb(header, use_bin_type=True)]
    for name, dtype in ARRAY_FIELDS:
        arr = np.ascontiguousarray(getattr(traj, name), dtype)
        frames.append(memoryview(arr).cast("B"))
    return frames


def _get(header: dict, key: str, typ: type) -> Any:
    if key not in header:
        raise WireError(key, "missing from header")
    value = header[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise WireError(key, f"expected {typ.__name__}, got {type(value).__name__}")
    return value


def _get_int(header: dict, key: str, lo: int, hi: int) -> int:
    value = _get(header, key, int)
    if not lo <= value <= hi:
        raise WireError(key, f"expected an int in [{lo}, {hi}], got {value}")
    return value


def _array_from_bytes(name: str, raw: bytes, dtype: np.dtype, limit: int) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise WireError(name, f"{len(raw)} bytes is not a multiple of {dtype.itemsize}")
    if len(raw) // dtype.itemsize > limit:
        raise WireError(name, f"{len(raw) // dtype.itemsize} entries exceed the limit of {limit}")
    return np.frombuffer(raw, dtype=dtype)


def decode(frames: Sequence[bytes | memoryview], limits: WireLimits = WireLimits()) -> Trajectory:
    """Decode and validate frames produced by `encode`. Array fields are read-only views of the frames.

    Raises only `WireError`, whatever the bytes: a failure this module did not foresee is still reported as
    one (field `record`), so that a receiver can drop the message and go on.
    """
    try:
        return _decode(frames, limits)
    except WireError:
        raise
    except Exception as exc:  # a gap in the checks below; the input is still the sender's fault
        raise WireError("record", f"undecodable ({type(exc).__name__}: {exc!s:.200})") from None


def _decode(frames: Sequence[bytes | memoryview], limits: WireLimits) -> Trajectory:
    if len(frames) != 1 + len(ARRAY_FIELDS):
        raise WireError("frames", f"expected {1 + len(ARRAY_FIELDS)} frames, got {len(frames)}")
    head_buf = frames[0]
    if len(head_buf) > limits.max_header_bytes:
        raise WireError("header", f"{len(head_buf)} bytes exceed the limit of {limits.max_header_bytes}")
    try:
        header = msgpack.unpackb(
            head_buf, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=limits.max_header_bytes, max_str_len=limits.max_header_bytes,
            max_array_len=limits.max_turns, max_map_len=1024,
        )
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise WireError("header", f"not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise WireError("header", f"expected a map, got {type(header).__name__}")
    bad_keys = [k for k in header if not isinstance(k, str)]
    if bad_keys:
        raise WireError("header", f"keys must be strings, got {bad_keys[0]!r:.40}")
    unknown = sorted(set(header) - _HEADER_KEYS)
    if unknown:
        raise WireError(unknown[0][:64], "unknown header field")
    missing = sorted(_HEADER_KEYS - set(header))
    if missing:
        raise WireError(missing[0], "missing from header")
    schema = _get(header, "schema", int)
    if schema != SCHEMA_VERSION:
        raise WireError("schema", f"version {schema} is not supported (this build reads {SCHEMA_VERSION})")
    kind = _get(header, "kind", str)
    if kind != KIND:
        raise WireError("kind", f"expected {KIND!r}, got {kind!r:.40}")
    reason = _get(header, "termination", str)
    try:
        termination = Termination(reason)
    except ValueError:
        raise WireError("termination", f"unknown reason {reason!r:.40}") from None

    declared = _get(header, "arrays", list)
    if len(declared) != len(ARRAY_FIELDS):
        raise WireError("arrays", f"expected {len(ARRAY_FIELDS)} array descriptors, got {len(declared)}")
    arrays: dict[str, np.ndarray] = {}
    for (name, dtype), desc, frame in zip(ARRAY_FIELDS, declared, frames[1:]):
        if not (isinstance(desc, list) and len(desc) == 3 and desc[0] == name and desc[1] == dtype.str
                and isinstance(desc[2], int) and not isinstance(desc[2], bool)):
            raise WireError(name, f"bad array descriptor {desc!r:.80}")
        if not 0 <= desc[2] <= limits.max_tokens:
            raise WireError(name, f"declared length {desc[2]} outside [0, {limits.max_tokens}]")
        if len(frame) != desc[2] * dtype.itemsize:
            raise WireError(name, f"frame has {len(frame)} bytes, header declares {desc[2] * dtype.itemsize}")
        arrays[name] = np.frombuffer(frame, dtype=dtype)

    traj = Trajectory(
        trajectory_id=_get(header, "trajectory_id", str),
        group_id=_get(header, "group_id", str),
        item_id=_get(header, "item_id", str),
        env=_get(header, "env", str),
        sample_index=_get_int(header, "sample_index", 0, (1 << 31) - 1),
        horizon=_get_int(header, "horizon", 1, (1 << 31) - 1),
        termination=termination,
        turn_ends=_array_from_bytes("turn_ends", _get(header, "turn_ends", bytes), TOKEN_DTYPE, limits.max_turns),
        turn_rewards=_array_from_bytes(
            "turn_rewards", _get(header, "turn_rewards", bytes), LOGPROB_DTYPE, limits.max_turns),
        metrics=_get(header, "metrics", dict),
        turn_actions=_get(header, "turn_actions", list),
        **arrays,
    )
    traj.validate(max_tokens=limits.max_tokens, max_turns=limits.max_turns, vocab_size=limits.vocab_size,
                  max_abs_reward=limits.max_abs_reward)
    return traj
