"""The staleness gate: admission capacity per version, places given back, the freshness filter."""
from __future__ import annotations

import pytest

from core.staleness import StalenessGate


def test_synchronous_mode_admits_one_batch_per_version():
    gate = StalenessGate(max_staleness=0, groups_per_step=4)
    assert gate.capacity(version=0) == 4
    gate.on_started(4)
    assert gate.capacity(0) == 0  # generation waits while the learner trains
    assert gate.capacity(1) == 4


def test_eta_lets_generation_run_ahead_by_eta_batches():
    gate = StalenessGate(max_staleness=2, groups_per_step=3)
    assert gate.capacity(0) == 9
    gate.on_started(9)
    assert gate.capacity(0) == 0 and gate.capacity(1) == 3


def test_discarded_groups_give_their_place_back():
    gate = StalenessGate(max_staleness=0, groups_per_step=2)
    gate.on_started(2)
    gate.on_discarded(1)  # e.g. an env failure: one more group may start at the same version
    assert gate.capacity(0) == 1
    gate.on_dropped_stale()
    assert gate.capacity(0) == 2 and gate.dropped_stale == 1


@pytest.mark.parametrize("eta, oldest, version, fresh", [
    (0, 3, 3, True), (0, 2, 3, False), (1, 2, 3, True), (1, 1, 3, False), (4, -1, 9, True),
])
def test_freshness_filter(eta, oldest, version, fresh):
    assert StalenessGate(eta, 1).is_fresh(oldest, version) is fresh


def test_state_round_trip():
    gate = StalenessGate(1, 2, started=7, discarded=2, dropped_stale=1)
    assert StalenessGate.from_state(gate.state_dict()) == gate


def test_no_more_groups_start_than_the_run_will_train():
    gate = StalenessGate(max_staleness=4, groups_per_step=2)
    assert gate.capacity(0) == 10 and gate.capacity(0, total_steps=3) == 6
    gate.on_started(6)
    assert gate.capacity(2, total_steps=3) == 0  # the last step's groups are running: nothing more to start
    gate.on_discarded(1)  # one of them failed: its place is given back, or the last step could never fill
    assert gate.capacity(2, total_steps=3) == 1
