"""BabyAI as a text environment over minigrid.

What must hold:
- `reset("babyai_<n>")` loads level `n % 40` with seed `n // 40` (see levels.py); the first observation is
  `Your goal: <mission>`, the view's sentences, and `Available actions: [...]` (a JSON list). The mission is
  shown verbatim (the reference rewrote "then"/"after you" into "and", which loses the order the task needs).
- `step(reply)` parses one action from the reply (environments.parsing, mode from config) and runs its
  primitive plan in minigrid, stopping early at a primitive that changes nothing or ends the episode.
- Reward is minigrid's own: `1 - 0.9 * step_count / max_steps` on success (step_count counts primitives), else
  0. `done` when minigrid terminates (success or failure) or truncates (max_steps).
- A missing, unknown or infeasible action gets an explanatory observation, reward 0, no state change and no
  minigrid step. `check available actions` lists the actions without a step.
- Every observation ends with the listing, then the turn cue when one is set (env.babyai.turn_cue).
- One minigrid env per level is created lazily and reused across episodes of this instance.
"""
from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import gymnasium

import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
from core.env import Observation, StepResult, SyncEnv
from environments.babyai.levels import FAMILY_NAME, gym_id, level_and_seed
from environments.babyai.macros import CHECK, DONE, MacroTable, canonical
from environments.babyai.prompt import INSTRUCTIONS
from environments.babyai.view import View
from environments.parsing import last_named, parse_reply


class BabyAIEnv(SyncEnv):
    family = FAMILY_NAME
    inline = True  # pure Python over in-memory state, about a millisecond a step (core.env.SyncEnv.inline)

    def __init__(self, parse_mode: str = "lenient", prompt: str = "react", turn_cue: str = ""):
        if prompt not in INSTRUCTIONS:
            raise ValueError(f"babyai: unknown prompt {prompt!r}; expected one of {sorted(INSTRUCTIONS)}")
        self.parse_mode = parse_mode
        self.instruction = INSTRUCTIONS[prompt]
        self.turn_cue = turn_cue.strip()
        self._games: dict[str, Any] = {}
        self.game: Any = None
        self.level = ""
        self.mission = ""
        self.done = True
        self._visited: set[tuple] = set()
        self.view: View | None = None
        self.table: MacroTable | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _game(self, level: str) -> Any:
        if level not in self._games:
            self._games[level] = gymnasium.make(gym_id(level), disable_env_checker=True).unwrapped
        return self._games[level]

    def reset(self, item_id: str) -> Observation:
        level, seed = level_and_seed(item_id)
        self.game = self._game(level)
        with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints each rejected level layout it retries
            self.game.reset(seed=seed)
        self.level, self.mission, self.done = level, self.game.mission, False
        self._visited = {self._state()}  # every state this episode has been in (`StepResult.revisited`)
        self._look()
        text = f"Your goal: {self.mission}\n{self.view.describe()}\n{self.listing()}"
        return Observation(text=text, instruction=self.instruction,
                           info={"level": level, "seed": seed, "max_steps": int(self.game.max_steps)})

    def close(self) -> None:
        for game in self._games.values():
            game.close()
        self._games.clear()
        self.game = None

    # -- observation -------------------------------------------------------------------------------------
    def _look(self) -> None:
        self.view = View(self.game)
        self.table = MacroTable(self.view)

    def listing(self) -> str:
        """The available actions, which end every observation, and the turn cue after them when one is set."""
        text = "Available actions: " + json.dumps(list(self.table.actions))
        return f"{text}\n{self.turn_cue}" if self.turn_cue else text

    def lenient_candidates(self) -> dict[str, str]:
        """Every way of naming an available action -> its key (the prompt's "pick up" spelling included)."""
        names = {a: a for a in self.table.actions}
        for a in self.table.actions:
            if a.startswith("pickup "):
                names["pick up " + a[len("pickup "):]] = a
        return names

    # -- acting ------------------------------------------------------------------------------------------
    def step(self, reply: str) -> StepResult:
        if self.game is None or self.table is None:
            raise RuntimeError("babyai: step() before reset()")
        if self.done:
            raise RuntimeError("babyai: step() after the episode ended; reset() first")
        names = self.lenient_candidates()
        parsed = parse_reply(reply, self.parse_mode, accepts=lambda a: canonical(a) in self.table.actions,
                             lenient_find=lambda r: names.get(last_named(r, names)))
        if not parsed.found:
            return StepResult(f"{parsed.error}\n{self.listing()}", 0.0, False, False, parsed.rule)
        action = canonical(parsed.action)
        if action not in self.table.actions:
            return StepResult(f"{self.table.explain(action)}\n{self.listing()}", 0.0, False, False, parsed.rule,
                              info={"action": action})
        if action == CHECK:
            text = "You can take the following actions: " + ", ".join(self.table.actions)
            return StepResult(f"{text}\n{self.listing()}", 0.0, False, True, parsed.rule, changed=False,
                              info={"action": action})
        return self._execute(action, parsed.rule)

    def _signature(self) -> tuple:
        g = self.game
        front = g.grid.get(*g.front_pos) if self._in_grid(g.front_pos) else None
        return (tuple(int(v) for v in g.agent_pos), int(g.agent_dir), id(g.carrying), id(front),
                getattr(front, "is_open", None), getattr(front, "is_locked", None))

    def _state(self) -> tuple:
        """The world as actions can change it: the agent's place and direction, what it carries, and the grid
        (objects, doors and their states; two objects of one type and colour are interchangeable)."""
        g = self.game
        carrying = (g.carrying.type, g.carrying.color) if g.carrying is not None else None
        place = tuple(int(v) for v in g.agent_pos)
        return place, int(g.agent_dir), carrying, g.grid.encode().tobytes()

    def _in_grid(self, pos) -> bool:
        return 0 <= pos[0] < self.game.grid.width and 0 <= pos[1] < self.game.grid.height

    def _execute(self, action: str, rule: str) -> StepResult:
        reward, terminated, truncated, taken = 0.0, False, False, 0
        start = self._signature()
        for primitive in self.table.actions[action]:
            before = self._signature()
            _, r, terminated, truncated, _ = self.game.step(primitive)
            reward += float(r)
            taken += 1
            if terminated or truncated:
                break
            if primitive != DONE and self._signature() == before:
                break  # the plan no longer fits the world: stop rather than stumble on
        self._look()
        success = bool(terminated and reward > 0)
        self.done = bool(terminated or truncated)
        status = ""
        if success:
            status = "\nThe task is completed."
        elif terminated:
            status = "\nThe task has failed."
        elif truncated:
            status = "\nYou have run out of steps for this task."
        text = f"{self.view.describe()}{status}\n{self.listing()}"
        changed = self.done or reward > 0 or self._signature() != start
        state = self._state()
        revisited = changed and not self.done and state in self._visited
        self._visited.add(state)
        return StepResult(text, reward, self.done, True, rule, success=success, changed=changed,
                          revisited=revisited,
                          info={"action": action, "primitives": taken, "step_count": int(self.game.step_count)})
