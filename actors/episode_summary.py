"""The small record an env pool returns for each episode (the full Trajectory travels over ZMQ instead)."""
from __future__ import annotations

from dataclasses import dataclass

from core.trajectory import Termination, Trajectory


@dataclass(frozen=True)
class EpisodeSummary:
    trajectory_id: str
    item_id: str
    family: str
    termination: str  # a core.trajectory.Termination value; "lost" when the actor running it died
    reward: float  # sum of the turn rewards (0 for lost episodes, which never produced a trajectory)
    success: bool
    turns: int
    actor: str = ""  # the pool that ran it
    sent: bool = True  # the trajectory went out on the channel
    error: str = ""  # for lost episodes: what the supervisor saw

    @classmethod
    def of(cls, traj: Trajectory, actor: str, sent: bool) -> "EpisodeSummary":
        return cls(traj.trajectory_id, traj.item_id, traj.env, traj.termination.value, traj.total_reward,
                   bool(traj.metrics.get("success", 0.0)), traj.num_turns, actor, sent)

    @classmethod
    def lost(cls, trajectory_id: str, item_id: str, family: str, actor: str, error: str) -> "EpisodeSummary":
        return cls(trajectory_id, item_id, family, Termination.LOST.value, 0.0, False, 0, actor, False, error)
