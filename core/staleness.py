"""The staleness bound eta: admission control for generation and a filter for training.

Units are groups (the `group_size` samples of one item are started, trained and dropped together).

Admission (as in AReaL): while the learner's weights are version v, at most (v + eta + 1) * B groups may have
been started, B being the groups of one train batch. Groups that were thrown away (stale, env failures, lost)
give their place back, so a failure never starves the run. With eta = 0 this is the synchronous mode: exactly one
batch is generated per version, and generation waits while the learner trains.
No more groups start than the run's steps will train (net of those thrown away): near its end an async run
stops generating ahead, so the last steps' groups have the generators to themselves.

Filter: at training time a trajectory whose oldest sampled token is more than eta versions behind the learner is
not trained on; its group is dropped and counted. Admission keeps this rare, but an episode that runs through
more than eta + 1 learner steps (a long episode, or one whose generator applied new weights late) is still
caught here: the `staleness/dropped_frac` metric shows how often.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class StalenessGate:
    max_staleness: int  # eta
    groups_per_step: int  # B
    started: int = 0  # groups started so far
    discarded: int = 0  # groups thrown away (their places are given back)
    dropped_stale: int = 0  # groups dropped by the filter (a subset of discarded)

    def __post_init__(self) -> None:
        if self.max_staleness < 0 or self.groups_per_step < 1:
            raise ValueError(f"need eta >= 0 and B >= 1, got eta={self.max_staleness}, B={self.groups_per_step}")

    def capacity(self, version: int, total_steps: int = 0) -> int:
        """How many more groups may start while the learner is at `version`; given the run's `total_steps`,
        never more than its steps will train: a group started for a step after the last would be thrown away,
        and until then it takes the generator's time from the groups the last steps wait for."""
        ahead = version + self.max_staleness + 1
        allowed = (min(ahead, total_steps) if total_steps > 0 else ahead) * self.groups_per_step
        return max(0, allowed - (self.started - self.discarded))

    def on_started(self, n: int = 1) -> None:
        self.started += n

    def on_discarded(self, n: int = 1) -> None:
        self.discarded += n

    def is_fresh(self, oldest_version: int, version: int) -> bool:
        """Whether a sample whose oldest sampled token has `oldest_version` may train at `version`."""
        return oldest_version < 0 or version - oldest_version <= self.max_staleness

    def on_dropped_stale(self) -> None:
        self.dropped_stale += 1
        self.on_discarded()

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "StalenessGate":
        return cls(**state)
