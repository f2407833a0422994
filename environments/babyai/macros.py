"""BabyAI's text actions: macro actions planned by BFS over (position, direction) in the agent's view and
compiled to minigrid primitives.

What must hold:
- Plans only use what the agent can see: the BFS walks visible cells that are empty, open doors or goals.
  Unseen cells are never assumed free.
- `go to X k` ends next to X and facing it; `pickup X k` (the prompt's "pick up" is accepted too) goes there and
  picks it up; `go through C open door k` walks into the doorway and one step on; `toggle and go through C
  closed|locked door k` faces the door, toggles it, and walks two steps (into and out of the doorway); a locked
  door needs a carried key of its colour. `toggle` acts on the door or box right in front; `drop` puts the
  carried object on the empty cell in front. `go to X k` when already facing X compiles to minigrid's no-op
  `done` primitive, so the step is taken and the mission verified.
- Every action not in the table gets a specific explanation and changes nothing.
"""
from __future__ import annotations

import re
from collections import deque

from environments.babyai.view import PICKABLE, View

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)
CHECK = "check available actions"

_TARGETED = re.compile(r"^(go to|pickup|go through|toggle and go through) (.+ \d+)$")


def canonical(action: str) -> str:
    """Lower-case, single spaces, and the prompt's "pick up" spelled as the action key "pickup"."""
    text = " ".join(action.lower().split())
    return "pickup " + text[len("pick up "):] if text.startswith("pick up ") else text


class MacroTable:
    """The available actions in the current view, each with its primitive plan."""

    def __init__(self, view: View):
        self.view = view
        self._parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {}
        self._facing: dict[tuple[int, int], tuple[int, int, int]] = {}  # cell -> first state facing it
        self._at: dict[tuple[int, int], tuple[int, int, int]] = {}  # cell -> first state standing on it
        self._bfs()
        self.actions: dict[str, list[int]] = {}
        self._build()

    # -- planning ---------------------------------------------------------------------------------------
    def _bfs(self) -> None:
        v = self.view
        start = (v.agent_pos[0], v.agent_pos[1], v.agent_dir)
        self._parent[start] = None
        queue = deque([start])
        while queue:
            state = queue.popleft()
            x, y, d = state
            fx, fy = _dir_vec(d)
            self._facing.setdefault((x + fx, y + fy), state)
            self._at.setdefault((x, y), state)
            for action, nxt in ((FORWARD, (x + fx, y + fy, d)), (LEFT, (x, y, (d - 1) % 4)),
                                (RIGHT, (x, y, (d + 1) % 4))):
                if nxt in self._parent:
                    continue
                if action == FORWARD and (nxt[0], nxt[1]) not in v.passable:
                    continue
                self._parent[nxt] = (state, action)
                queue.append(nxt)

    def _path_to(self, state: tuple[int, int, int] | None) -> list[int] | None:
        if state is None:
            return None
        path = []
        while self._parent[state] is not None:
            state, action = self._parent[state]
            path.append(action)
        return path[::-1]

    def plan_face(self, cell: tuple[int, int]) -> list[int] | None:
        """Primitives that leave the agent next to `cell` and facing it (None: no path in view)."""
        return self._path_to(self._facing.get(cell))

    def plan_arrive(self, cell: tuple[int, int]) -> list[int] | None:
        return self._path_to(self._at.get(cell))

    # -- the table --------------------------------------------------------------------------------------
    def _build(self) -> None:
        v, acts = self.view, self.actions
        acts["turn left"] = [LEFT]
        acts["turn right"] = [RIGHT]
        if v.front_pos in v.passable:
            acts["move forward"] = [FORWARD]
        if v.carrying is None:
            for s in v.objects:
                if s.kind in PICKABLE and (path := self.plan_face(s.pos)) is not None:
                    acts[f"pickup {s.label}"] = path + [PICKUP]
        if v.carrying is not None and v.front_obj is None and v.front_pos in v.visible:
            acts["drop"] = [DROP]
        for s in v.objects:
            if s.kind == "door" and s.obj.is_open and (path := self.plan_arrive(s.pos)) is not None:
                acts[f"go through {s.label}"] = path + [FORWARD]
        for s in v.objects:
            if s.kind == "door" and not s.obj.is_open and self._can_unlock(s) is None:
                if (path := self.plan_face(s.pos)) is not None:
                    acts[f"toggle and go through {s.label}"] = path + [TOGGLE, FORWARD, FORWARD]
        if self._toggle_problem() is None:
            acts["toggle"] = [TOGGLE]
        for s in v.objects:
            if s.kind == "goal" and (path := self.plan_arrive(s.pos)) is not None:
                acts["go to goal"] = path
                break
        for s in v.objects:
            if s.kind != "goal" and (path := self.plan_face(s.pos)) is not None:
                acts[f"go to {s.label}"] = path or [DONE]
        acts[CHECK] = []

    def _can_unlock(self, s) -> str | None:
        """None if the door `s` can be opened now, else why not."""
        if not s.obj.is_locked:
            return None
        carrying = self.view.carrying
        if carrying is None or carrying.type != "key":
            return f"You cannot toggle and go through {s.label}, as you are not carrying a key."
        if carrying.color != s.color:
            return (f"You cannot toggle and go through {s.label}, as the color of the key you are carrying "
                    f"does not match the color of the door.")
        return None

    def _toggle_problem(self) -> str | None:
        front = self.view.front_obj
        if front is None or front.type not in ("door", "box"):
            return "There is nothing in front of you that you can toggle."
        if front.type == "door" and front.is_locked:
            carrying = self.view.carrying
            if carrying is None or carrying.type != "key" or carrying.color != front.color:
                return f"The {front.color} locked door in front of you needs a {front.color} key to open."
        return None

    # -- explanations ------------------------------------------------------------------------------------
    def explain(self, action: str) -> str:
        """Why `action` (canonical form) cannot be taken now."""
        v = self.view
        if action == "move forward":
            return "There is a barrier in front of you, you can't move forward."
        if action == "drop":
            if v.carrying is None:
                return "You cannot drop the object, as you are not carrying anything."
            return "You cannot drop the object, as there is already an object in front of you."
        if action == "toggle":
            return self._toggle_problem() or "You cannot toggle now."
        if action == "go to goal":
            return "You cannot go to the goal, as there is no goal in sight or no path leading to it."
        match = _TARGETED.match(action)
        if match is None:
            return "The action is not recognized. Please check valid actions."
        verb, label = match.groups()
        s = v.by_label.get(label)
        if s is None:
            return f"You cannot see a {label}. Please check valid actions."
        no_path = f"You cannot {verb} {label}, as there is no path leading to it."
        if verb == "pickup":
            if s.kind not in PICKABLE:
                return f"You cannot pick up {label}."
            if v.carrying is not None:
                return f"You cannot pick up {label}, as you are already carrying something. Drop it first."
            return no_path.replace("pickup", "pick up")
        if verb in ("go through", "toggle and go through") and s.kind != "door":
            return f"You cannot {verb} {label}, as it is not a door."
        if verb == "go through" and not s.obj.is_open:
            return f"You cannot go through {label}, as it is closed. You should toggle it first."
        if verb == "toggle and go through":
            if s.obj.is_open:
                return f"The {label} is already open; use go through {label}."
            problem = self._can_unlock(s)
            if problem:
                return problem
        return no_path


def _dir_vec(d: int) -> tuple[int, int]:
    return ((1, 0), (0, 1), (-1, 0), (0, -1))[d]
