"""Assembling the samples of each item into complete groups, in the order they complete.

What must hold:
- A group is trained only whole: all `group_size` samples arrived, each ended by the episode itself (done,
  horizon or context limit). A sample that ended in an env failure, was aborted, or was lost with its actor
  discards the whole group, counted by reason; the group's later samples are then ignored as orphans.
- A trajectory of a group this buffer never started (one from before a restart, or of a discarded group) is
  counted as an orphan and never trained on.
- Only admitted work is trained: a trajectory is filed only under the exact id the coordinator issued for it
  (`<group>.a<attempt>.s<sample>`, sample < group_size), once, with its group's item and horizon and no more
  turns than that horizon. Anything else is refused and counted in `rejected` by reason (duplicate, mismatch).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from core.trajectory import Termination, Trajectory

TRAINABLE = {Termination.DONE, Termination.HORIZON, Termination.CONTEXT}


@dataclass
class GroupInfo:
    group_id: str
    item_id: str
    horizon: int
    started_step: int
    started_version: int
    draw: int  # the sampler draw this item came from (-1 for eval or a regenerated group)
    attempt: int = 0
    samples: list[Trajectory] = field(default_factory=list)
    received: set[int] = field(default_factory=set)  # sample indices filed so far

    def trajectory_id(self, sample_index: int) -> str:
        """The id the coordinator issues for one sample of this group."""
        return f"{self.group_id}.a{self.attempt}.s{sample_index}"


class GroupBuffer:
    def __init__(self, group_size: int):
        self.group_size = group_size
        self.open: dict[str, GroupInfo] = {}
        self.ready: collections.deque[GroupInfo] = collections.deque()
        self.discarded: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.orphans = 0

    def start(self, info: GroupInfo) -> None:
        if info.group_id in self.open:
            raise ValueError(f"group {info.group_id} started twice")
        self.open[info.group_id] = info

    def add(self, traj: Trajectory) -> str:
        """File a trajectory; returns "complete", "pending", "discarded", "orphan" or "rejected"."""
        info = self.open.get(traj.group_id)
        if info is None or not traj.trajectory_id.startswith(f"{info.group_id}.a{info.attempt}."):
            self.orphans += 1
            return "orphan"
        problem = self._mismatch(info, traj)
        if problem:
            self.rejected[problem] += 1
            return "rejected"
        if traj.termination not in TRAINABLE:
            self.discard(traj.group_id, traj.termination.value)
            return "discarded"
        info.samples.append(traj)
        info.received.add(traj.sample_index)
        if len(info.samples) < self.group_size:
            return "pending"
        del self.open[traj.group_id]
        self.ready.append(info)
        return "complete"

    def _mismatch(self, info: GroupInfo, traj: Trajectory) -> str:
        """Why `traj` is not a sample this buffer issued for `info` ("" when it is)."""
        if not 0 <= traj.sample_index < self.group_size or traj.trajectory_id != info.trajectory_id(traj.sample_index):
            return "unknown_id"
        if traj.sample_index in info.received:
            return "duplicate"
        if traj.item_id != info.item_id or traj.horizon != info.horizon or traj.num_turns > info.horizon:
            return "mismatch"
        return ""

    def discard(self, group_id: str, reason: str) -> bool:
        """Drop an open group (e.g. a sample was lost); False if it was not open."""
        if self.open.pop(group_id, None) is None:
            return False
        self.discarded[reason] += 1
        return True

    def take(self, n: int) -> list[GroupInfo]:
        return [self.ready.popleft() for _ in range(min(n, len(self.ready)))]

    @property
    def in_flight(self) -> int:
        """Groups started and not yet complete or discarded."""
        return len(self.open)
