"""One TextCraft task: the goal of `textcraft_<n>` and the crafting commands shown for it.

What must hold:
- `textcraft_<n>` has goal `book.goals[n % 544]`; ids past 543 repeat the same tasks.
- The commands are the goal's whole recipe tree plus up to `distractors` recipes that use one of the tree's
  ingredients, shuffled. Every random choice comes from `random.Random(n % 544)` over sorted lists, so the
  text is byte-identical in any process (the reference used sets of strings, whose order follows
  PYTHONHASHSEED).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from core.env import split_item_id
from environments.textcraft.recipes import RecipeBook, readable

FAMILY_NAME = "textcraft"


@dataclass(frozen=True)
class Task:
    index: int  # goal index, 0..543
    goal: str  # item id
    commands: tuple[str, ...]  # the crafting commands, in the order shown

    @property
    def text(self) -> str:
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(self.commands), readable(self.goal))


def goal_index(item_id: str, book: RecipeBook) -> int:
    family, n = split_item_id(item_id)
    if family != FAMILY_NAME:
        raise ValueError(f"item id {item_id!r} is not a TextCraft id (textcraft_<n>)")
    return n % len(book.goals)


def make_task(book: RecipeBook, index: int, distractors: int = 10) -> Task:
    goal = book.goals[index]
    rng = random.Random(index)
    tree = book.tree(goal)
    shown = {r.text for r in tree}
    candidates: set[str] = set()
    for r in tree:
        for ingredient, _ in r.inputs:
            uses = book.uses.get(ingredient.name, ())
            candidates.update(u.text for u in rng.sample(uses, min(len(uses), 10)))
    pool = sorted(candidates - shown)
    lines = sorted(shown) + rng.sample(pool, min(len(pool), distractors))
    rng.shuffle(lines)
    return Task(index, goal, tuple(lines))
