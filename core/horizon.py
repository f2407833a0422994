"""ScalingInter-RL: the number of turns an episode may take, as a pure function of the learner step.

    schedule = HorizonSchedule(turns=(10, 20, 30), boundaries=(100, 200))
    schedule.horizon_at(0) == 10; schedule.horizon_at(100) == 20; schedule.horizon_at(10_000) == 30

Stage i holds for steps in [boundaries[i-1], boundaries[i]). Because it depends on the step alone, a resumed run
is in exactly the right stage at its first step (the reference recomputes it one step late after a resume).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class HorizonSchedule:
    turns: tuple[int, ...]
    boundaries: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.turns or any(t < 1 for t in self.turns):
            raise ValueError(f"turns must be a non-empty list of ints >= 1, got {self.turns}")
        if len(self.boundaries) != len(self.turns) - 1:
            raise ValueError(f"{len(self.turns)} stages need {len(self.turns) - 1} boundaries, got {self.boundaries}")
        if any(b <= a for a, b in zip(self.boundaries, self.boundaries[1:])) or any(b < 1 for b in self.boundaries):
            raise ValueError(f"boundaries must be strictly increasing steps >= 1, got {self.boundaries}")

    def stage_at(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return bisect.bisect_right(self.boundaries, step)

    def horizon_at(self, step: int) -> int:
        return self.turns[self.stage_at(step)]

    @property
    def max_horizon(self) -> int:
        return max(self.turns)

    @classmethod
    def from_rounds_ctrl(cls, kind: str, rounds, steps_scaling_inter: int) -> "HorizonSchedule":
        """The reference's keys: `fixed` with one int, or `scaling_inter_stepwise` with a list."""
        as_list = [int(r) for r in rounds] if isinstance(rounds, (list, tuple)) else [int(rounds)]
        if kind == "fixed":
            if len(as_list) != 1:
                raise ValueError(f"rounds_ctrl.type=fixed takes one int, got {rounds}")
            return cls(turns=(as_list[0],))
        if kind == "scaling_inter_stepwise":
            return cls(turns=tuple(as_list),
                       boundaries=tuple(steps_scaling_inter * (i + 1) for i in range(len(as_list) - 1)))
        raise ValueError(f"unknown rounds_ctrl.type {kind!r}")

    @classmethod
    def from_config(cls, algorithm) -> "HorizonSchedule":
        """From an `AlgorithmConfig`: the native `horizon` form when set, else `rounds_ctrl`."""
        if algorithm.horizon.turns:
            return cls(turns=tuple(algorithm.horizon.turns), boundaries=tuple(algorithm.horizon.boundaries))
        rc = algorithm.rounds_ctrl
        return cls.from_rounds_ctrl(rc.type, rc.rounds, rc.steps_scaling_inter)
