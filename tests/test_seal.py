"""Sealed messages (core.seal): what opens, what is refused and why, and a fuzz of the opener."""
from __future__ import annotations

import random

import pytest

from core.curve import CurveClient, KeyPair, RunKeys
from core.seal import HEADER, Opener, Sealer, SealError, overhead

SEED = 12


@pytest.fixture
def keys() -> RunKeys:
    return RunKeys.generate(["pool-0", "pool-1", "generator-0"])


def frames_of(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randrange(0, 300)) for _ in range(3)]


def test_a_sealed_message_opens_to_its_frames_under_the_name_of_its_key(keys):
    opener = Opener(keys.trajectory_server_side(["pool-0", "pool-1"]), b"trajectory")
    sealer = Sealer(keys.trajectory_client("pool-1"), b"trajectory")
    plain = [b"header", b"", b"\x00" * 1000]
    sealed = sealer.seal(plain)
    assert len(sealed) == 4 and sum(map(len, sealed)) == sum(map(len, plain)) + overhead(3)
    assert b"\x00" * 64 not in b"".join(sealed[1:])  # encrypted, not only authenticated
    assert opener.open(sealed, 3, 2000) == ("pool-1", plain)
    assert opener.open(sealer.seal(plain), 3, 2000)[0] == "pool-1"


def test_what_is_refused_and_why(keys):
    server = keys.trajectory_server_side(["pool-0"])
    opener = Opener(server, b"trajectory")
    plain = [b"a", b"b", b"c"]

    def refused(frames, plain_frames=3, max_bytes=1000) -> str:
        with pytest.raises(SealError) as err:
            opener.open(frames, plain_frames, max_bytes)
        assert err.value.field == "auth"
        return err.value.reason

    sealer = Sealer(keys.trajectory_client("pool-0"), b"trajectory")
    first, second = sealer.seal(plain), sealer.seal(plain)
    assert opener.open(second, 3, 1000)[0] == "pool-0"
    assert refused(first) == "replayed"  # an older counter of a session already seen
    assert refused(second) == "replayed"
    assert refused(plain) == "malformed"  # not sealed
    assert refused(Sealer(keys.trajectory_client("pool-0"), b"weights").seal(plain)) == "forged"  # other channel
    assert refused(Sealer(keys.trajectory_client("generator-0"), b"trajectory").seal(plain)) == "unknown_key"
    stranger = CurveClient(keys.trajectory_server.public, KeyPair.generate(), "aes-gcm")
    assert refused(Sealer(stranger, b"trajectory").seal(plain)) == "unknown_key"
    impostor = CurveClient(keys.trajectory_server.public,
                           KeyPair(keys.clients["pool-0"].public, KeyPair.generate().secret), "aes-gcm")
    assert refused(Sealer(impostor, b"trajectory").seal(plain)) == "forged"
    third = sealer.seal(plain)
    assert refused(third[:1] + [third[2], third[1], third[3]]) == "forged"  # frames swapped
    assert refused(third[:3], 2) == "forged"  # cut short, even when the receiver expects that many
    assert refused(sealer.seal([b"x" * 2000, b"", b""])) == "malformed"  # over the size cap
    assert opener.open(third, 3, 1000)[1] == plain  # none of that spent the genuine message
    assert opener.refused == {"replayed": 2, "malformed": 2, "forged": 4, "unknown_key": 2}


def test_sessions_are_remembered_up_to_the_bound(keys):
    opener = Opener(keys.trajectory_server_side(["pool-0"]), b"trajectory", max_sessions=2)
    sessions = [Sealer(keys.trajectory_client("pool-0"), b"trajectory") for _ in range(3)]
    for sealer in sessions:
        opener.open(sealer.seal([b"", b"", b""]), 3, 100)
    assert len(opener._sessions) == 2
    assert opener.open(sessions[0].seal([b"", b"", b""]), 3, 100)[0] == "pool-0"  # a forgotten session goes on


def _mutate(rng: random.Random, sealed: list[bytes]) -> list[bytes]:
    frames = [bytearray(f) for f in sealed]
    kind = rng.randrange(8)
    i = rng.randrange(len(frames))
    if kind == 0 and frames[i]:  # bit flips
        for _ in range(rng.randint(1, 4)):
            j = rng.randrange(len(frames[i]))
            frames[i][j] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        frames[i] = frames[i][:rng.randrange(len(frames[i]) + 1)]
    elif kind == 2:  # extension
        frames[i] += rng.randbytes(rng.randint(1, 64))
    elif kind == 3:  # a frame dropped or added
        if rng.random() < 0.5:
            del frames[i]
        else:
            frames.insert(i, bytearray(rng.randbytes(rng.randrange(80))))
    elif kind == 4:  # header fields rewritten: counter, salt, key
        magic, public, salt, counter = HEADER.unpack(bytes(frames[0]))
        field = rng.randrange(3)
        counter = rng.choice([0, 1, counter - 1, counter + 1, 2**64 - 1]) if field == 0 else counter
        salt = rng.randbytes(16) if field == 1 else salt
        public = rng.randbytes(32) if field == 2 else public
        frames[0] = bytearray(HEADER.pack(magic, public, salt, max(0, counter)))
    elif kind == 5:  # frames of another message swapped in
        frames[i] = bytearray(rng.randbytes(len(frames[i])))
    elif kind == 6:  # declared huge: a giant frame
        frames[i] = bytearray(2000)
    else:  # the whole thing random
        frames = [bytearray(rng.randbytes(rng.randrange(100))) for _ in range(rng.randint(0, 6))]
    return [bytes(f) for f in frames]


def test_fuzz_every_altered_message_is_refused_and_every_genuine_one_opens(keys):
    """20,000 altered sealed messages, each followed by a genuine one: the altered ones raise SealError only,
    the genuine ones open to exactly their frames (a refusal never spends or corrupts the session)."""
    rng = random.Random(SEED)
    opener = Opener(keys.trajectory_server_side(["pool-0"]), b"trajectory", max_sessions=64)
    sealers = [Sealer(keys.trajectory_client("pool-0"), b"trajectory") for _ in range(4)]
    reasons: dict[str, int] = {}
    for n in range(20_000):
        sealer = rng.choice(sealers)
        plain = frames_of(rng)
        sealed = sealer.seal(plain)
        altered = _mutate(rng, sealed)
        try:
            name, got = opener.open(altered, 3, 1000)
        except SealError as exc:
            reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
            assert opener.open(sealer.seal(plain), 3, 1000) == ("pool-0", plain), n
            continue
        # Only an alteration that changed nothing the cipher covers may open, and then to the same frames.
        assert (name, got) == ("pool-0", plain), n
    assert sum(reasons.values()) > 19_000 and set(reasons) == {"malformed", "forged", "replayed", "unknown_key"}
