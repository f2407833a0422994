"""Only admitted work is trained (the group buffer's id checks), and the coordinator's watchdog ends a run whose
trajectory receiver thread died, instead of waiting forever."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from actors.coordinator import Coordinator
from actors.group_buffer import GroupBuffer, GroupInfo
from core.horizon import HorizonSchedule
from core.sampler import ItemSampler
from core.staleness import StalenessGate
from launch.bench.samples import make_trajectory


def sample(info: GroupInfo, i: int, **changes):
    traj = make_trajectory(num_tokens=60, num_turns=3, trajectory_id=info.trajectory_id(i))
    traj = dataclasses.replace(traj, group_id=info.group_id, item_id=info.item_id, sample_index=i,
                               horizon=info.horizon)
    return dataclasses.replace(traj, **changes)


@pytest.fixture
def buffer_and_group():
    buf = GroupBuffer(group_size=2)
    info = GroupInfo("g0000001-babyai_7", "babyai_7", horizon=10, started_step=0, started_version=0, draw=0)
    buf.start(info)
    return buf, info


def test_a_forged_duplicate_never_completes_a_group(buffer_and_group):
    buf, info = buffer_and_group
    forged = sample(info, 0)
    forged.turn_rewards[:] = 1e5
    assert buf.add(forged) == "pending"
    for _ in range(3):  # the same sample again: refused, the group still waits for sample 1
        assert buf.add(forged) == "rejected"
    assert buf.rejected["duplicate"] == 3 and not buf.ready
    assert buf.add(sample(info, 1)) == "complete"
    assert [t.sample_index for t in buf.ready[0].samples] == [0, 1]


@pytest.mark.parametrize("changes, reason", [
    ({"sample_index": 5}, "unknown_id"),  # beyond the group size
    ({"trajectory_id": "g0000001-babyai_7.a0.s0-extra"}, "unknown_id"),  # the prefix matches, the id does not
    ({"item_id": "babyai_8"}, "mismatch"),
    ({"horizon": 30}, "mismatch"),  # a longer horizon than the group was admitted with
])
def test_samples_the_coordinator_did_not_issue_are_refused(buffer_and_group, changes, reason):
    buf, info = buffer_and_group
    assert buf.add(sample(info, 0, **changes)) == "rejected"
    assert buf.rejected[reason] == 1 and info.samples == []


def test_unknown_groups_are_orphans(buffer_and_group):
    buf, info = buffer_and_group
    other = GroupInfo("g9999999-babyai_7", "babyai_7", 10, 0, 0, 0)
    assert buf.add(sample(other, 0)) == "orphan" and buf.orphans == 1


class _Pools:
    """Stands in for the env pools: episodes never finish (the test is about the coordinator's own threads)."""

    async def run(self, spec):
        await asyncio.sleep(3600)


class _Quiet:
    """A receiver on which nothing arrives: these tests are about admission and the watchdog, which never read
    a trajectory, so a ZMQ socket would only add a port to the test."""

    def recv(self, timeout_ms):
        time.sleep(timeout_ms / 1000)


class _BrokenReceiver:
    """A receiver whose recv raises what no decoder should: the pump thread dies of it."""

    def recv(self, timeout_ms):
        time.sleep(0.05)
        raise TypeError("'<' not supported between instances of 'bytes' and 'str'")

    @property
    def stats(self):
        raise AssertionError("not reached")


def _coordinator(receiver, gate=None, total_steps=1, max_in_flight=1, **kwargs) -> Coordinator:
    """A coordinator over `_Pools` on one BabyAI item, groups of 2, a 4-turn horizon; no learner is reached."""
    return Coordinator(
        pools=_Pools(), learners=None, receiver=receiver,
        sampler=ItemSampler({"babyai": ["babyai_1"]}, {"babyai": 1.0}), gate=gate or StalenessGate(1, 1),
        schedule=HorizonSchedule((4,)), group_size=2, total_steps=total_steps, max_in_flight=max_in_flight,
        on_step=lambda *a: None, should_checkpoint=lambda s: False, save=lambda s: None, **kwargs)


def test_a_dead_receiver_thread_fails_the_run_within_seconds():
    coordinator = _coordinator(_BrokenReceiver())
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="receiver thread died.*TypeError"):
        asyncio.run(asyncio.wait_for(coordinator.run(), timeout=30))
    assert time.monotonic() - started < 5


def test_a_role_reporting_a_broken_channel_fails_the_run():
    coordinator = _coordinator(_Quiet(), health=lambda: "generator-0: the weights thread died: OverflowError",
                               health_every_s=0.5)
    with pytest.raises(RuntimeError, match="generator-0: the weights thread died"):
        asyncio.run(asyncio.wait_for(coordinator.run(), timeout=30))


def test_an_async_run_starts_no_group_that_no_step_will_train():
    """eta 4 and room for 16 groups in flight, but 2 steps of 2 groups: only 4 groups start (episodes never
    finish here, so nothing is discarded and no place is given back)."""
    started = []
    coordinator = _coordinator(_Quiet(), StalenessGate(4, 2), total_steps=2, max_in_flight=16,
                               on_group_started=started.append)

    async def run_briefly():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(coordinator.run(), timeout=1.5)

    asyncio.run(run_briefly())
    assert len(started) == 4 and coordinator.gate.started == 4
