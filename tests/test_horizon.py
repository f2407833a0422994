"""The ScalingInter-RL horizon schedule: a pure function of the learner step."""
from __future__ import annotations

import pytest

from core.horizon import HorizonSchedule


def test_stages_switch_exactly_at_the_boundaries():
    s = HorizonSchedule(turns=(10, 20, 30), boundaries=(100, 200))
    assert [s.horizon_at(x) for x in (0, 1, 99, 100, 101, 199, 200, 5000)] == [10, 10, 10, 20, 20, 20, 30, 30]
    assert [s.stage_at(x) for x in (0, 99, 100, 200)] == [0, 0, 1, 2]
    assert s.max_horizon == 30


def test_reference_stepwise_form_matches_native_form():
    ref = HorizonSchedule.from_rounds_ctrl("scaling_inter_stepwise", [6, 13, 20], 50)
    assert ref == HorizonSchedule(turns=(6, 13, 20), boundaries=(50, 100))
    assert HorizonSchedule.from_rounds_ctrl("fixed", 7, 50).horizon_at(10**6) == 7


@pytest.mark.parametrize("turns, boundaries", [((), ()), ((10, 0), (5,)), ((10, 20), ()), ((10, 20, 30), (9, 9)),
                                               ((10, 20), (0,))])
def test_invalid_schedules_are_rejected(turns, boundaries):
    with pytest.raises(ValueError):
        HorizonSchedule(turns=turns, boundaries=boundaries)


def test_negative_step_is_rejected():
    with pytest.raises(ValueError):
        HorizonSchedule(turns=(5,)).horizon_at(-1)
