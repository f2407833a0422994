"""What the agent sees: the 7x7 egocentric view of a minigrid env turned into named objects and sentences.

What must hold:
- Only cells minigrid itself shows the agent count (its visibility mask: walls and closed doors occlude).
- Objects are named by colour and type, doors with their state ("blue closed door"), and numbered per name
  by distance from the agent (Manhattan, then fewer steps ahead, then further left): "red ball 1" is the
  nearest red ball. The same label is used in the description and in every action that refers to it.
- Offsets are egocentric: steps in front of the agent and steps to its left or right.
- The text depends only on the env state (no hash or dict-order effects), so it is byte-identical across
  processes for the same item.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minigrid.core.constants import DIR_TO_VEC

DESCRIBED = ("key", "ball", "box", "door", "goal", "lava")
PICKABLE = ("key", "ball", "box")


@dataclass(frozen=True)
class Seen:
    """One visible object."""

    name: str  # "red ball", "blue closed door"
    label: str  # name plus its number, "red ball 1"
    kind: str  # minigrid type: key, ball, box, door, goal, lava
    color: str
    pos: tuple[int, int]  # absolute grid position
    ahead: int  # steps in front of the agent
    right: int  # steps to the agent's right (negative: left)
    obj: Any  # the minigrid WorldObj itself


def door_state(obj: Any) -> str:
    return "open" if obj.is_open else ("locked" if obj.is_locked else "closed")


def object_name(obj: Any) -> str:
    if obj.type == "door":
        return f"{obj.color} {door_state(obj)} door"
    return f"{obj.color} {obj.type}"


def is_passable(obj: Any) -> bool:
    """Cells the agent may walk onto safely (lava can be entered but ends the episode)."""
    if obj is None:
        return True
    if obj.type == "door":
        return bool(obj.is_open)
    return obj.type in ("goal", "floor")


class View:
    """The agent's current view of `env` (an unwrapped MiniGridEnv)."""

    def __init__(self, env: Any):
        self.env = env
        self.agent_pos = (int(env.agent_pos[0]), int(env.agent_pos[1]))
        self.agent_dir = int(env.agent_dir)
        fx, fy = (int(v) for v in DIR_TO_VEC[self.agent_dir])
        self.fvec = (fx, fy)
        self.rvec = (-fy, fx)
        self.carrying = env.carrying
        grid, vis = env.gen_obs_grid()
        size = env.agent_view_size
        half = size // 2
        width, height = env.grid.width, env.grid.height
        self.visible: dict[tuple[int, int], Any] = {}  # absolute cell -> object (None: empty)
        found: list[tuple[tuple[int, int, int], Any, tuple[int, int], int, int]] = []
        for j in range(size):
            for i in range(size):
                if not vis[i, j]:
                    continue
                ahead, right = size - 1 - j, i - half
                if ahead == 0 and right == 0:
                    continue  # the agent's own cell (shows what it carries)
                x = self.agent_pos[0] + fx * ahead + self.rvec[0] * right
                y = self.agent_pos[1] + fy * ahead + self.rvec[1] * right
                if not (0 <= x < width and 0 <= y < height):
                    continue
                obj = env.grid.get(x, y)  # the real object, not the view's copy
                self.visible[(x, y)] = obj
                if obj is not None and obj.type in DESCRIBED:
                    found.append(((abs(ahead) + abs(right), ahead, right), obj, (x, y), ahead, right))
        found.sort(key=lambda item: item[0])
        counts: dict[str, int] = {}
        self.objects: list[Seen] = []
        for _, obj, pos, ahead, right in found:
            name = object_name(obj)
            counts[name] = counts.get(name, 0) + 1
            self.objects.append(Seen(name, f"{name} {counts[name]}", obj.type, obj.color, pos, ahead, right, obj))
        self.by_label = {s.label: s for s in self.objects}
        self.passable = {p for p, o in self.visible.items() if is_passable(o)}
        self.passable.add(self.agent_pos)
        self.front_pos = (self.agent_pos[0] + fx, self.agent_pos[1] + fy)
        self.front_obj = env.grid.get(*self.front_pos) if 0 <= self.front_pos[0] < width and \
            0 <= self.front_pos[1] < height else None
        self.wall_ahead = self._wall_ahead(size)

    def _wall_ahead(self, size: int) -> int | None:
        for k in range(1, size):
            cell = (self.agent_pos[0] + self.fvec[0] * k, self.agent_pos[1] + self.fvec[1] * k)
            if cell not in self.visible:
                return None
            obj = self.visible[cell]
            if obj is not None and obj.type == "wall":
                return k
            if not is_passable(obj):
                return None  # an object or closed door blocks the line first; it is described as an object
        return None

    def describe(self) -> str:
        """The sentences of one observation (without goal and action list)."""
        parts = []
        for s in self.objects:
            if s.right == 0:
                where = f"right in front of you {s.ahead} steps away"
            else:
                side = "right" if s.right > 0 else "left"
                where = f"{s.ahead} steps in front of you and {abs(s.right)} steps to your {side}"
            parts.append(f"There is a {s.label} {where}.")
        if not parts:
            parts.append("You cannot see any objects within sight.")
        if self.wall_ahead is not None:
            parts.append(f"You are facing a wall {self.wall_ahead} steps away.")
        if self.carrying is not None:
            parts.append(f"You are carrying a {self.carrying.color} {self.carrying.type}.")
        else:
            parts.append("You are not carrying anything.")
        return " ".join(parts)
