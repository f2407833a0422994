"""Assembling the samples of each item into complete groups, in the order they complete.

What must hold:
- A group is trained only whole: all `group_size` samples arrived, each ended by the episode itself (done,
  horizon or context limit). A sample that ended in an env failure, was aborted, or was lost with its actor
  discards the whole group, counted by reason; the group's later samples are then ignored as orphans.
- A trajectory of a group this buffer never started (one from before a restart, or of a discarded group) is
  counted as an orphan and never trained on.
- Batches are taken in completion order (`take`), or in the order the groups started (`take_in_order`: the
  next n started groups, once all of them are complete; a discarded group leaves that order).
- Only admitted work is trained: a trajectory is filed only under the exact id the coordinator issued for it
  (`<group>.a<attempt>.s<sample>`, sample < group_size), once, with its group's item and horizon and no more
  turns than that horizon. Anything else is refused and counted in `rejected` by reason (duplicate, mismatch).
"""
from __future__ import annotations

import collections
import itertools
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
    def __init__(self, group_size: int, ordered: bool = False):
        self.group_size = group_size
        # the groups started and not yet taken or discarded, in start order (kept only for take_in_order)
        self.started: dict[str, None] | None = {} if ordered else None
        self.open: dict[str, GroupInfo] = {}
        self.ready: collections.deque[GroupInfo] = collections.deque()
        self.discarded: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.orphans = 0

    def start(self, info: GroupInfo) -> None:
        if info.group_id in self.open:
            raise ValueError(f"group {info.group_id} started twice")
        self.open[info.group_id] = info
        if self.started is not None:
            self.started[info.group_id] = None

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
        if self.started is not None:
            self.started.pop(group_id, None)
        self.discarded[reason] += 1
        return True

    def take(self, n: int) -> list[GroupInfo]:
        """Up to n complete groups, the first to complete first."""
        taken = [self.ready.popleft() for _ in range(min(n, len(self.ready)))]
        if self.started is not None:
            for info in taken:
                self.started.pop(info.group_id, None)
        return taken

    def take_in_order(self, n: int) -> list[GroupInfo]:
        """The next n groups in the order they started, once every one of them is complete; else []."""
        if self.started is None:
            raise RuntimeError("take_in_order needs a buffer made with ordered=True")
        if len(self.ready) < n:
            return []
        head = list(itertools.islice(self.started, n))
        complete = {info.group_id: info for info in self.ready}
        if len(head) < n or not all(g in complete for g in head):
            return []
        taken = set(head)
        self.ready = collections.deque(info for info in self.ready if info.group_id not in taken)
        for group_id in head:
            del self.started[group_id]
        return [complete[g] for g in head]

    def put_back(self, groups: list[GroupInfo]) -> None:
        """Return taken groups to the front of the ready queue (and of the start order), in their order."""
        self.ready.extendleft(reversed(groups))
        if self.started is not None:
            self.started = {**{g.group_id: None for g in groups}, **self.started}

    @property
    def in_flight(self) -> int:
        """Groups started and not yet complete or discarded."""
        return len(self.open)
