"""Batches in completion order (the default) or in the order groups started (`trainer.batch_order=submission`):
the coordinator's batch choice with groups that complete out of order, a discarded group, and a stale one; and
groups that start while a step trains."""
from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest

from actors.coordinator import Coordinator
from actors.group_buffer import GroupBuffer, GroupInfo
from core.horizon import HorizonSchedule
from core.sampler import ItemSampler
from core.staleness import StalenessGate
from launch.bench.samples import make_trajectory


def group(n: int) -> GroupInfo:
    return GroupInfo(f"g{n:07d}-babyai_{n}", f"babyai_{n}", horizon=5, started_step=0, started_version=0, draw=n)


def complete(buf: GroupBuffer, info: GroupInfo, version: int = 0) -> None:
    for i in range(buf.group_size):
        traj = make_trajectory(num_tokens=40, num_turns=2, trajectory_id=info.trajectory_id(i), version=version)
        traj = dataclasses.replace(traj, group_id=info.group_id, item_id=info.item_id, sample_index=i,
                                   horizon=info.horizon)
        buf.add(traj)


def coordinator(order: str, eta: int = 4) -> Coordinator:
    return Coordinator(
        pools=None, learners=None, receiver=None, sampler=ItemSampler({"babyai": ["babyai_1"]}, {"babyai": 1.0}),
        gate=StalenessGate(eta, 2), schedule=HorizonSchedule((5,)), group_size=2, total_steps=3, max_in_flight=8,
        on_step=lambda *a: None, should_checkpoint=lambda s: False, save=lambda s: None, batch_order=order)


@pytest.mark.parametrize("order", ["completion", "submission"])
def test_groups_completing_out_of_order(order):
    coord = coordinator(order)
    groups = [group(n) for n in range(5)]
    for g in groups:
        coord.buffer.start(g)
    for n in (3, 2):  # the later groups finish first (the earlier ones hold long episodes)
        complete(coord.buffer, groups[n])
    first = coord._fresh_batch()
    if order == "completion":
        assert [g.group_id for g in first] == [groups[3].group_id, groups[2].group_id]
        return
    assert first is None  # groups 0 and 1 started first and are still running
    complete(coord.buffer, groups[1])
    assert coord._fresh_batch() is None
    complete(coord.buffer, groups[0])
    assert [g.group_id for g in coord._fresh_batch()] == [groups[0].group_id, groups[1].group_id]
    assert [g.group_id for g in coord._fresh_batch()] == [groups[2].group_id, groups[3].group_id]
    assert coord._fresh_batch() is None and list(coord.buffer.started) == [groups[4].group_id]


def test_a_discarded_group_leaves_the_start_order():
    buf = GroupBuffer(group_size=2, ordered=True)
    groups = [group(n) for n in range(3)]
    for g in groups:
        buf.start(g)
    complete(buf, groups[2])
    assert buf.take_in_order(1) == []
    assert buf.discard(groups[0].group_id, "lost") and buf.take_in_order(1) == []
    complete(buf, groups[1])
    assert [g.group_id for g in buf.take_in_order(2)] == [groups[1].group_id, groups[2].group_id]
    assert not buf.started and not buf.ready


def test_a_stale_group_is_dropped_and_the_fresh_one_keeps_its_place():
    coord = coordinator("submission", eta=0)
    groups = [group(n) for n in range(3)]
    for g in groups:
        coord.buffer.start(g)
    coord.state.version = 1
    complete(coord.buffer, groups[0], version=0)  # sampled a version behind: stale at eta 0
    complete(coord.buffer, groups[1], version=1)
    assert coord._fresh_batch() is None  # the batch lost group 0; group 1 waits for group 2, in order
    assert coord.buffer.discarded["stale"] == 1 and list(coord.buffer.started) == [g.group_id for g in groups[1:]]
    complete(coord.buffer, groups[2], version=1)
    assert [g.group_id for g in coord._fresh_batch()] == [groups[1].group_id, groups[2].group_id]


def test_take_in_order_needs_an_ordered_buffer_and_the_coordinator_a_known_order():
    with pytest.raises(RuntimeError, match="ordered=True"):
        GroupBuffer(group_size=2).take_in_order(1)
    with pytest.raises(ValueError, match="batch_order"):
        coordinator("random")


def test_a_checkpoint_keeps_the_start_order_of_pending_groups():
    coord = coordinator("submission")
    groups = [group(n) for n in range(4)]
    for g in groups:
        coord.buffer.start(g)
    complete(coord.buffer, groups[2])  # complete (ready) before the groups started ahead of it
    pending = [p["group_id"] for p in coord.snapshot().pending]
    assert pending == [g.group_id for g in groups]


class _HeldPools:
    """Records the episodes it is asked to run and never ends them (the coordinator's admission is under test)."""

    def __init__(self):
        self.specs = []

    async def run(self, spec):
        self.specs.append(spec)
        await asyncio.Event().wait()


def test_episodes_carry_their_groups_start_order_as_priority_and_regenerated_groups_go_first():
    coord = coordinator("submission")
    coord.pools = _HeldPools()
    coord._regenerate = [{"group_id": "g0000000-babyai_1", "item_id": "babyai_1", "draw": 0}]
    coord.sampler.drawn = coord.state.next_group = 5  # a resumed run: five groups were drawn before it

    async def admit():
        for _ in range(3):
            coord._start_group()
        await asyncio.sleep(0)  # the episodes' tasks start
        for task in list(coord._episodes):
            task.cancel()
        await asyncio.gather(*coord._episodes, return_exceptions=True)

    asyncio.run(admit())
    by_group = {}
    for spec in coord.pools.specs:
        by_group.setdefault(spec.group_id, set()).add(spec.priority)
    assert [sorted(p) for p in by_group.values()] == [[0], [5], [6]]  # one priority per group, in start order


def _training_coordinator(stop: bool = False, during: bool = True) -> tuple[Coordinator, list[int]]:
    """Step 2 of an eta = 1 run is about to train, with batches 1 and 2 started (4 groups of B = 2) and
    version 1 taken by the generators: the gate allows batch 3 now. The learner's step is a 1 s stand-in that
    records how many groups had started by its end; the pools hold every episode (admission is under test)."""
    coord = coordinator("submission", eta=1)
    coord.total_steps, coord.pools, coord.admit_during_step = 5, _HeldPools(), during
    coord.schedule = HorizonSchedule((2, 4), (2,))  # 2 turns for steps 1 and 2, then 4
    coord.weights = types.SimpleNamespace(served=1)
    coord.gate.started, coord.state.step, coord.stop_requested = 4, 1, stop
    seen = []

    async def train(batch, wait_s):
        await asyncio.sleep(1.0)
        seen.append(coord.gate.started)
        coord.state.step += 1

    coord._train = train
    return coord, seen


def _train_step(coord: Coordinator) -> None:
    async def step():
        await coord._run_step([], 0.0)
        for task in list(coord._episodes):
            task.cancel()
        await asyncio.gather(*coord._episodes, return_exceptions=True)

    asyncio.run(step())


def test_groups_the_gate_allows_start_while_a_step_trains():
    """Batch 3 starts during step 2, not after it (before, the generators sampled nothing through such a step:
    every other step of the 100-step soak), with the horizon the schedule gives after step 2."""
    coord, seen = _training_coordinator()
    started = []
    coord.on_group_started = started.append
    _train_step(coord)
    assert seen == [6] and [g.started_step for g in started] == [2, 2]
    assert {s.horizon for s in coord.pools.specs} == {4}


def test_no_group_starts_during_a_step_once_the_run_is_asked_to_stop():
    coord, seen = _training_coordinator(stop=True)
    _train_step(coord)
    assert seen == [4] and coord.pools.specs == []


def test_with_admit_during_step_off_groups_start_only_between_steps():
    """trainer.admit_during_step=false (the 2-core default): the step trains with the generators idle; the
    groups the gate allows start at the loop's next turn."""
    coord, seen = _training_coordinator(during=False)
    _train_step(coord)
    assert seen == [4] and coord.pools.specs == []
