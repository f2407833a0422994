"""A scripted BabyAI expert: it plans over the true grid state but acts only through the env's own text actions.

It exists to show that the observation text, the action table and the rewards fit together: if an agent that
knows everything can solve a level by choosing among the listed actions, the text interface is complete for it.

Each turn it finds the pending part of the mission (sequences and conjunctions are followed through the
verifier's own progress flags), then
1. takes a listed action that finishes that part outright (`go to`/`pickup` a target, `toggle and go through`
   or `toggle` a target door, `drop` next to the fixed object), else
2. takes the listed action whose end state is closest to finishing it, by a breadth-first distance computed
   backwards over the true grid (closed doors count as passable, locked ones only with their key), else
3. takes the first primitive of a true shortest path (`turn left`, `turn right`, `move forward`, or `toggle` a
   closed door in the way).
"""
from __future__ import annotations

from collections import deque
from typing import Any

from minigrid.envs.babyai.core.verifier import (
    AfterInstr, AndInstr, BeforeInstr, GoToInstr, OpenInstr, PickupInstr, PutNextInstr,
)

from environments.babyai.env import BabyAIEnv
from environments.babyai.macros import CHECK, DROP, FORWARD, LEFT, PICKUP, RIGHT, TOGGLE

_DIRS = ((1, 0), (0, 1), (-1, 0), (0, -1))


def pending(instr: Any) -> Any:
    """The action instruction still to be done (follows the verifier's progress flags)."""
    if isinstance(instr, BeforeInstr):
        return pending(instr.instr_b if instr.a_done == "success" else instr.instr_a)
    if isinstance(instr, AfterInstr):
        return pending(instr.instr_a if instr.b_done == "success" else instr.instr_b)
    if isinstance(instr, AndInstr):
        return pending(instr.instr_b if instr.a_done == "success" else instr.instr_a)
    return instr




class Expert:
    def __init__(self, env: BabyAIEnv):
        self.env = env
        self._keys: set[str] = set()  # colours of locked doors treated as openable
        self._ghosts = False  # treat movable objects as passable (to find what blocks the way)

    # -- the true grid ------------------------------------------------------------------------------------
    def _passable(self, x: int, y: int) -> bool:
        g = self.env.game
        if not (0 <= x < g.grid.width and 0 <= y < g.grid.height):
            return False
        if (x, y) == tuple(g.agent_pos):
            return True
        obj = g.grid.get(x, y)
        if obj is None or obj.type in ("goal", "floor"):
            return True
        if obj.type == "door":
            return not obj.is_locked or obj.color in self._keys
        return self._ghosts and obj.type in ("key", "ball", "box")

    def _distances(self, goals: set[tuple[int, int, int]]) -> dict[tuple[int, int, int], int]:
        """Primitive steps from every state to the nearest goal state (backwards BFS)."""
        dist = {s: 0 for s in goals}
        queue = deque(goals)
        while queue:
            x, y, d = queue.popleft()
            here = dist[(x, y, d)] + 1
            fx, fy = _DIRS[d]
            preds = [(x, y, (d + 1) % 4), (x, y, (d - 1) % 4)]
            if self._passable(x, y) and self._passable(x - fx, y - fy):
                preds.append((x - fx, y - fy, d))
            for p in preds:
                if p not in dist:
                    dist[p] = here
                    queue.append(p)
        return dist

    def _facing(self, cells: list[tuple[int, int]]) -> set[tuple[int, int, int]]:
        states = set()
        for tx, ty in cells:
            for d, (fx, fy) in enumerate(_DIRS):
                if self._passable(tx - fx, ty - fy):
                    states.add((tx - fx, ty - fy, d))
        return states

    # -- what to do ---------------------------------------------------------------------------------------
    def _goal(self) -> tuple[str, list[Any], set[tuple[int, int, int]]]:
        """(kind, target objects, goal states) for the pending instruction."""
        g = self.env.game
        instr = pending(g.instrs)
        if isinstance(instr, PutNextInstr):
            movers = [o for o in instr.desc_move.obj_set if o.can_pickup()]
            if g.carrying is not None and any(g.carrying is o for o in movers):
                spots = set()
                for fx_, fy_ in instr.desc_fixed.obj_poss:
                    for dx, dy in _DIRS:
                        cell = (fx_ + dx, fy_ + dy)
                        if g.grid.get(*cell) is None and cell != tuple(g.agent_pos):
                            spots.add(cell)
                return "drop", [], self._facing(sorted(spots))
            return "pickup", movers, self._facing(self._cells_of(movers))
        if isinstance(instr, PickupInstr):
            objs = [o for o in instr.desc.obj_set if o.can_pickup()]  # "a grey object" matches walls too
            return "pickup", objs, self._facing(self._cells_of(objs))
        if isinstance(instr, OpenInstr):
            doors = [o for o in instr.desc.obj_set if o.type == "door"]
            return "open", doors, self._facing(self._cells_of(doors))
        if isinstance(instr, GoToInstr):
            cells = [tuple(p) for p in instr.desc.obj_poss]
            objs = [o for o in instr.desc.obj_set]
            return "goto", objs, self._facing(cells)
        raise ValueError(f"expert: unsupported instruction {type(instr).__name__}")

    def _cells_of(self, objs: list[Any]) -> list[tuple[int, int]]:
        """Where these objects lie on the grid now (by identity; carried ones are nowhere)."""
        grid = self.env.game.grid
        wanted = {id(o) for o in objs}
        return [(i % grid.width, i // grid.width) for i, o in enumerate(grid.grid) if id(o) in wanted]

    def _here(self) -> tuple[int, int, int]:
        g = self.env.game
        return int(g.agent_pos[0]), int(g.agent_pos[1]), int(g.agent_dir)

    def _find(self, kind: str) -> list[tuple[Any, tuple[int, int]]]:
        """Objects of a type on the grid with their positions (cur_pos is stale for a box's revealed key)."""
        grid = self.env.game.grid
        return [(o, (i % grid.width, i // grid.width)) for i, o in enumerate(grid.grid)
                if o is not None and o.type == kind]

    def _resolve(self, depth: int = 0, goal=None):
        """The subgoal to work on now: the mission's, or a key / box / blocker that stands in its way."""
        kind, targets, goals = goal or self._goal()
        g = self.env.game
        carried_key = g.carrying.color if g.carrying is not None and g.carrying.type == "key" else None
        self._keys = {carried_key} if carried_key else set()
        dist = self._distances(goals)
        if depth >= 4:
            return kind, targets, goals, dist
        need, blocker = None, None
        if kind == "open" and targets and all(t.is_locked for t in targets) and \
                not any(t.color == carried_key for t in targets):
            need = targets[0].color
        elif self._here() not in dist:
            need, blocker = self._impediment(goals, carried_key)
        elif carried_key and kind in ("pickup", "openbox") and not self._reachable_without_key(goals):
            need, blocker = self._impediment(goals, carried_key)  # open its door before freeing the hands
        if need is not None:
            keys = [(k, pos) for k, pos in self._find("key") if k.color == need]
            if keys:
                sub = ("pickup", [k for k, _ in keys], self._facing([pos for _, pos in keys]))
            else:
                boxes = [(b, pos) for b, pos in self._find("box") if b.contains is not None
                         and b.contains.type == "key" and b.contains.color == need]
                sub = ("openbox", [b for b, _ in boxes], self._facing([pos for _, pos in boxes]))
            return self._resolve(depth + 1, sub)
        if blocker is not None:
            obj, pos = blocker
            sub_kind = "open" if obj.type == "door" else "pickup"
            return self._resolve(depth + 1, (sub_kind, [obj], self._facing([pos])))
        return kind, targets, goals, dist

    def _reachable_without_key(self, goals) -> bool:
        keys, self._keys = self._keys, set()
        try:
            return self._here() in self._distances(goals)
        finally:
            self._keys = keys

    def _impediment(self, goals, carried_key: str | None):
        """Along a shortest path that ignores locks and movable objects, the first thing in the way:
        (colour of a key needed, None) or (None, (object to move or locked door to open, position)) or
        (None, None)."""
        self._ghosts = True
        self._keys = {d.color for d, _ in self._find("door")}
        try:
            dist = self._distances(goals)
        finally:
            self._ghosts = False
            self._keys = {carried_key} if carried_key else set()
        state = self._here()
        if state not in dist:
            return None, None
        grid = self.env.game.grid
        while dist[state] > 0:
            x, y, d = state
            fx, fy = _DIRS[d]
            nxt = [(x + fx, y + fy, d), (x, y, (d - 1) % 4), (x, y, (d + 1) % 4)]
            state = min((s for s in nxt if s in dist), key=lambda s: dist[s])
            obj = grid.get(state[0], state[1])
            if obj is None:
                continue
            if obj.type == "door" and obj.is_locked:
                if obj.color != carried_key:
                    return obj.color, None
                return None, (obj, (state[0], state[1]))  # unlock it now, while the key is in hand
            if obj.type in ("key", "ball", "box"):
                return None, (obj, (state[0], state[1]))
        return None, None

    def _finishing(self, kind: str, targets: list[Any]) -> str | None:
        env = self.env
        table, view = env.table.actions, env.view
        is_target = lambda obj: any(obj is t for t in targets)  # noqa: E731
        if kind == "pickup" and env.game.carrying is not None:
            return None  # hands full: choose() clears them
        for label, seen in view.by_label.items():
            if not is_target(seen.obj):
                continue
            if kind == "goto" and f"go to {label}" in table:
                return f"go to {label}"
            if kind == "pickup" and f"pickup {label}" in table:
                return f"pickup {label}"
            if kind == "open" and f"toggle and go through {label}" in table:
                return f"toggle and go through {label}"
        front = view.front_obj
        if kind in ("open", "openbox") and "toggle" in table and is_target(front) and \
                not getattr(front, "is_open", False):
            return "toggle"
        return None

    def _end_state(self, plan: list[int]) -> tuple[int, int, int]:
        g = self.env.game
        x, y, d = int(g.agent_pos[0]), int(g.agent_pos[1]), int(g.agent_dir)
        for p in plan:
            if p == LEFT:
                d = (d - 1) % 4
            elif p == RIGHT:
                d = (d + 1) % 4
            elif p == FORWARD:
                x, y = x + _DIRS[d][0], y + _DIRS[d][1]
        return x, y, d

    def choose(self) -> str:
        """The next text action."""
        env = self.env
        g, table = env.game, env.table.actions
        kind, targets, goals, dist = self._resolve()
        here = self._here()
        if kind in ("pickup", "openbox") and g.carrying is not None:
            return self._clear_hands(dist, here)
        if kind == "drop" and "drop" in table and here in goals:
            return "drop"
        finishing = self._finishing(kind, targets)
        if finishing is not None:
            return finishing
        return self._toward(dist, here)

    def _toward(self, dist: dict, here: tuple[int, int, int]) -> str:
        """The listed movement whose end state is nearest to the goal states of `dist`."""
        now = dist.get(here)
        best, best_key = None, None
        for action, plan in self.env.table.actions.items():
            if action == CHECK or not plan or any(p in (PICKUP, DROP) for p in plan):
                continue
            d_end = dist.get(self._end_state(plan))
            if d_end is None:
                continue
            key = (d_end, len(plan))
            if best_key is None or key < best_key:
                best, best_key = action, key
        if best is not None and (now is None or best_key[0] < now):
            return best
        return self._first_primitive(dist, here)

    def _clear_hands(self, dist: dict, here: tuple[int, int, int]) -> str:
        """Drop what is carried on a free cell off the way ahead and away from doors (walking there first)."""
        g = self.env.game
        path = set()
        starts = [(x_, y_, d_) for x_, y_, d_ in dist if (x_, y_) == here[:2]]
        if starts:  # the cells of one shortest path to the goal from this cell (whatever the heading: stable)
            state = min(starts, key=lambda s_: (dist[s_], s_[2]))
            while dist[state] > 0:
                x, y, d = state
                fx, fy = _DIRS[d]
                nxt = [(x + fx, y + fy, d), (x, y, (d - 1) % 4), (x, y, (d + 1) % 4)]
                state = min((s for s in nxt if s in dist), key=lambda s: dist[s])
                path.add(state[:2])
        doors = {pos for _, pos in self._find("door")}
        spots = []
        for i, obj in enumerate(g.grid.grid):
            cell = (i % g.grid.width, i // g.grid.width)
            if obj is None and cell not in path and cell != here[:2] and \
                    not any((cell[0] + dx, cell[1] + dy) in doors for dx, dy in _DIRS):
                spots.append(cell)
        drop_states = self._facing(spots)
        if here in drop_states and "drop" in self.env.table.actions:
            return "drop"
        return self._toward(self._distances(drop_states), here)

    def _first_primitive(self, dist: dict, here: tuple[int, int, int]) -> str:
        x, y, d = here
        fx, fy = _DIRS[d]
        front = self.env.game.grid.get(x + fx, y + fy)
        table = self.env.table.actions
        options = [("turn left", (x, y, (d - 1) % 4)), ("turn right", (x, y, (d + 1) % 4))]
        if "move forward" in table:
            options.insert(0, ("move forward", (x + fx, y + fy, d)))
        elif front is not None and front.type == "door" and not front.is_open and "toggle" in table:
            options.insert(0, ("toggle", (x + fx, y + fy, d)))
        scored = [(dist.get(s, 1 << 30), i, a) for i, (a, s) in enumerate(options)]
        return min(scored)[2]

    def reply(self) -> str:
        action = self.choose()
        return f"Thought:\nI know where everything is.\n\nAction:\n{action}"


def run_expert(item_id: str, max_turns: int = 20, env: BabyAIEnv | None = None) -> tuple[bool, float, int]:
    """Play one item with the expert: (success, total reward, turns used)."""
    env = env or BabyAIEnv(parse_mode="strict")
    env.reset(item_id)
    expert = Expert(env)
    total = 0.0
    for turn in range(1, max_turns + 1):
        result = env.step(expert.reply())
        if not result.valid_action:
            raise AssertionError(f"{item_id}: the expert chose an invalid action: {result.observation[:200]}")
        total += result.reward
        if result.done:
            return result.success, total, turn
    return False, total, max_turns
