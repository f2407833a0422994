"""A crafting planner for TextCraft: reads the commands and goal from the observation text and plans gets and
crafts (depth first, reusing leftovers). It knows which items are generic tags and which are base items from
the recipe book (the true state); everything else comes from the text. Used to show that the observation, the
commands and the rewards fit together.
"""
from __future__ import annotations

import math
import re

from environments.textcraft.recipes import RecipeBook, item_id, readable

_LINE = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_GOAL = re.compile(r"Goal: craft (.+)\.$", re.M)


class PlanningError(RuntimeError):
    pass


def parse_commands(text: str) -> tuple[dict[str, list[tuple[int, list[tuple[int, str]]]]], str]:
    """Observation text -> ({output: [(count, [(n, ingredient)])]}, goal)."""
    recipes: dict[str, list[tuple[int, list[tuple[int, str]]]]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            inputs = [(int(p.split(" ", 1)[0]), p.split(" ", 1)[1]) for p in m.group(3).split(", ")]
            recipes.setdefault(m.group(2), []).append((int(m.group(1)), inputs))
    goal = _GOAL.search(text)
    if goal is None:
        raise PlanningError("no 'Goal: craft ...' line in the observation")
    return recipes, goal.group(1)


def plan(text: str, book: RecipeBook) -> list[str]:
    """The commands that craft the goal, in order."""
    recipes, goal = parse_commands(text)
    inventory: dict[str, int] = {}
    actions: list[str] = []

    def producible(name: str, stack: frozenset) -> bool:
        if name in stack:
            return False
        if book.is_tag(item_id(name)):
            return any(producible(readable(m), stack) for m in book.members(item_id(name)))
        if name in recipes:
            return any(all(producible(i, stack | {name}) for _, i in ins) for _, ins in recipes[name])
        return book.is_fetchable(item_id(name))

    def concrete(name: str, stack: frozenset) -> str:
        if not book.is_tag(item_id(name)):
            return name
        members = [readable(m) for m in book.members(item_id(name))]
        held = [m for m in members if inventory.get(m, 0) > 0]
        for m in held + members:
            if producible(m, stack):
                return m
        raise PlanningError(f"no member of {name} can be made")

    def acquire(name: str, qty: int, stack: frozenset) -> None:
        missing = qty - inventory.get(name, 0)
        if missing <= 0:
            return
        if name not in recipes:
            if not book.is_fetchable(item_id(name)):
                raise PlanningError(f"{name} is neither shown as craftable nor a base item")
            actions.append(f"get {missing} {name}")
            inventory[name] = inventory.get(name, 0) + missing
            return
        options = [(c, ins) for c, ins in recipes[name] if all(producible(i, stack | {name}) for _, i in ins)]
        if not options:
            raise PlanningError(f"no shown recipe for {name} can be completed")
        count, inputs = options[0]
        times = math.ceil(missing / count)
        chosen = [(n, concrete(i, stack | {name})) for n, i in inputs]
        for _ in range(len(chosen) + 1):  # making one input may use up another (shared sticks, ingots)
            for n, i in chosen:
                acquire(i, n * times, stack | {name})
            if all(inventory.get(i, 0) >= n * times for n, i in chosen):
                break
        for _ in range(times):
            actions.append(f"craft {count} {name} using " + ", ".join(f"{n} {i}" for n, i in chosen))
            for n, i in chosen:
                inventory[i] -= n
            inventory[name] = inventory.get(name, 0) + count

    acquire(goal, 1, frozenset())
    return actions
