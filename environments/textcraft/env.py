"""TextCraft as a text environment over our own engine (environments/textcraft/engine.py).

What must hold:
- `reset("textcraft_<n>")` shows the task of task.py; the instruction carries the action grammar and format.
- `step(reply)` extracts one command (strict: the reference's `Action:` line rule, case kept as the reference
  did; lenient: see lenient.py) and plays it. Reward 1 and done when the goal is crafted; else 0.
- Missing, malformed or failing commands get the game's explanation, reward 0 and no state change.
- The recipe book is shared read-only by every env in the process (loading it takes about 0.3 s).
"""
from __future__ import annotations

from core.env import Observation, StepResult, SyncEnv
from environments.parsing import parse_reply
from environments.textcraft.engine import Game
from environments.textcraft.lenient import matcher_for
from environments.textcraft.prompt import INSTRUCTION
from environments.textcraft.recipes import RecipeBook, default_book, readable
from environments.textcraft.task import FAMILY_NAME, goal_index, make_task

_COMMANDS = ("get ", "craft ", "inventory")


class TextCraftEnv(SyncEnv):
    family = FAMILY_NAME
    inline = True  # pure Python over in-memory state, about a millisecond a step (core.env.SyncEnv.inline)

    def __init__(self, parse_mode: str = "lenient", distractors: int = 10, book: RecipeBook | None = None):
        self.parse_mode = parse_mode
        self.distractors = distractors
        self.book = book or default_book()
        self.game: Game | None = None
        self.done = True

    def reset(self, item_id: str) -> Observation:
        index = goal_index(item_id, self.book)
        task = make_task(self.book, index, self.distractors)
        self.game = Game(self.book, task.goal)
        self.done = False
        return Observation(text=task.text, instruction=INSTRUCTION,
                           info={"goal": readable(task.goal), "depth": self.book.depth(task.goal)})

    def step(self, reply: str) -> StepResult:
        if self.game is None:
            raise RuntimeError("textcraft: step() before reset()")
        if self.done:
            raise RuntimeError("textcraft: step() after the episode ended; reset() first")
        matcher = matcher_for(self.book)
        parsed = parse_reply(reply, self.parse_mode, accepts=lambda a: a.startswith(_COMMANDS),
                             lenient_find=matcher.find, example="get 1 lapis lazuli")
        if not parsed.found:
            return StepResult(parsed.error, 0.0, False, False, parsed.rule)
        outcome = self.game.act(parsed.action)
        self.done = outcome.done
        return StepResult(outcome.reply, outcome.reward, outcome.done, outcome.ok, parsed.rule,
                          success=outcome.done and outcome.reward > 0, info={"action": parsed.action})
