"""The trajectory record and its msgpack codec: round trips and every validation error."""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from core.codec import SCHEMA_VERSION, WireLimits, decode, encode
from core.trajectory import Termination, Trajectory, WireError
from launch.bench.samples import make_trajectory


def roundtrip(traj: Trajectory, limits: WireLimits = WireLimits()) -> Trajectory:
    return decode([bytes(f) for f in encode(traj)], limits)


def assert_same(a: Trajectory, b: Trajectory) -> None:
    for f in dataclasses.fields(Trajectory):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def test_roundtrip_keeps_every_field():
    traj = make_trajectory(num_tokens=300, num_turns=4)
    assert traj.loss_mask.sum() > 0 and traj.num_turns == 4
    assert_same(traj, roundtrip(traj))


def test_roundtrip_empty_trajectory():
    traj = make_trajectory(num_tokens=0, num_turns=0)
    traj.termination = Termination.ENV_ERROR
    out = roundtrip(traj)
    assert out.num_tokens == 0 and out.num_turns == 0 and out.termination is Termination.ENV_ERROR
    assert out.oldest_version() == -1


def test_roundtrip_100k_tokens():
    traj = make_trajectory(num_tokens=100_000, num_turns=30)
    out = roundtrip(traj)
    assert_same(traj, out)
    assert out.prompt_len == traj.prompt_len and out.oldest_version() == 3


def test_arrays_travel_as_separate_frames_without_copy():
    traj = make_trajectory(num_tokens=1000)
    frames = encode(traj)
    assert len(frames) == 5
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.int32), traj.tokens)
    assert len(frames[0]) < 1000  # the header holds no per-token data


def mutate_header(traj: Trajectory, **changes) -> list[bytes]:
    frames = [bytes(f) for f in encode(traj)]
    header = msgpack.unpackb(frames[0], raw=False)
    for key, value in changes.items():
        if value is KeyError:
            del header[key]
        else:
            header[key] = value
    frames[0] = msgpack.packb(header, use_bin_type=True)
    return frames


GOOD = make_trajectory(num_tokens=64, num_turns=3)


@pytest.mark.parametrize("changes, field", [
    ({"schema": SCHEMA_VERSION + 1}, "schema"),
    ({"schema": "1"}, "schema"),
    ({"kind": "weights"}, "kind"),
    ({"trajectory_id": KeyError}, "trajectory_id"),
    ({"trajectory_id": ""}, "trajectory_id"),
    ({"trajectory_id": 7}, "trajectory_id"),
    ({"group_id": "x" * 300}, "group_id"),
    ({"horizon": 0}, "horizon"),
    ({"horizon": True}, "horizon"),
    ({"sample_index": -1}, "sample_index"),
    ({"termination": "exploded"}, "termination"),
    ({"turn_ends": b"\x01\x00\x00"}, "turn_ends"),
    ({"turn_ends": np.array([5, 5, 9], "<i4").tobytes()}, "turn_ends"),
    ({"turn_ends": np.array([5, 10, 99], "<i4").tobytes()}, "turn_ends"),
    ({"turn_rewards": np.array([1.0], "<f4").tobytes()}, "turn_rewards"),
    ({"turn_rewards": np.array([0, 0, np.nan], "<f4").tobytes()}, "turn_rewards"),
    ({"metrics": {"a": "b"}}, "metrics"),
    ({"metrics": [1, 2]}, "metrics"),
    ({"surprise": 1}, "surprise"),
    ({"arrays": [["tokens", "<i4", 64]]}, "arrays"),
    ({"arrays": [["tokens", "<i8", 64], ["loss_mask", "|u1", 64], ["logprobs", "<f4", 64],
                 ["versions", "<i4", 64]]}, "tokens"),
    ({"arrays": [["tokens", "<i4", 65], ["loss_mask", "|u1", 64], ["logprobs", "<f4", 64],
                 ["versions", "<i4", 64]]}, "tokens"),
])
def test_bad_header_names_the_field(changes, field):
    with pytest.raises(WireError) as err:
        decode(mutate_header(GOOD, **changes))
    assert err.value.field == field, str(err.value)


def test_bad_frames_name_the_field():
    frames = [bytes(f) for f in encode(GOOD)]
    with pytest.raises(WireError, match="frames"):
        decode(frames[:3])
    with pytest.raises(WireError) as err:
        decode([b"\xc1not msgpack"] + frames[1:])
    assert err.value.field == "header"
    with pytest.raises(WireError) as err:
        decode([msgpack.packb([1, 2])] + frames[1:])
    assert err.value.field == "header"
    with pytest.raises(WireError) as err:
        decode(frames[:1] + [frames[1][:-4]] + frames[2:])  # a truncated token frame
    assert err.value.field == "tokens"


@pytest.mark.parametrize("array, value, field", [
    ("loss_mask", 2, "loss_mask"),
    ("tokens", -5, "tokens"),
    ("logprobs", 0.5, "logprobs"),  # a sampled token with logprob > 0
    ("logprobs", np.inf, "logprobs"),
    ("versions", -1, "versions"),  # a sampled token without a version
])
def test_invariants_on_sampled_tokens(array, value, field):
    traj = make_trajectory(num_tokens=64, num_turns=3)
    t = int(np.flatnonzero(traj.loss_mask)[0])
    getattr(traj, array)[t] = value
    with pytest.raises(WireError) as err:
        roundtrip(traj)
    assert err.value.field == field


@pytest.mark.parametrize("array, value, field", [("logprobs", -0.3, "logprobs"), ("versions", 2, "versions")])
def test_unsampled_tokens_carry_no_logprob_or_version(array, value, field):
    traj = make_trajectory(num_tokens=64, num_turns=3)
    getattr(traj, array)[0] = value  # token 0 is prompt
    with pytest.raises(WireError) as err:
        roundtrip(traj)
    assert err.value.field == field


def test_size_limits_are_enforced_before_use():
    big = make_trajectory(num_tokens=5000)
    with pytest.raises(WireError) as err:
        roundtrip(big, WireLimits(max_tokens=4096))
    assert err.value.field == "tokens"
    with pytest.raises(WireError) as err:
        roundtrip(big, WireLimits(max_header_bytes=32))
    assert err.value.field == "header"
    many_turns = make_trajectory(num_tokens=400, num_turns=20)
    with pytest.raises(WireError) as err:
        roundtrip(many_turns, WireLimits(max_turns=8))
    assert err.value.field in ("header", "turn_ends")


def test_nothing_is_pickled():
    frames = encode(make_trajectory())
    assert not any(b"\x80\x04\x95" in bytes(f)[:3] for f in frames)  # pickle protocol 4 magic
    header = msgpack.unpackb(frames[0], raw=False)  # plain msgpack types only
    assert header["schema"] == SCHEMA_VERSION and isinstance(header["metrics"], dict)
