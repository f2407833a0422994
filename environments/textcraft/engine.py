"""The TextCraft game state of one episode: an inventory and the three commands, over a read-only book.

Replies follow the reference: "Got 1 lapis lazuli", "Crafted 1 minecraft:blue_dye", "Inventory: [blue dye] (1)",
"Could not find ...", "Could not execute ...". Crafting checks that the inventory holds every given input, then
that the given inputs match one of the output's recipes exactly (a generic ingredient such as "planks" is
satisfied by any member, e.g. "oak planks"); the number made is the recipe's. Crafting the goal gives reward 1
and ends the episode. Failed commands change nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from environments.textcraft.recipes import Ingredient, Recipe, RecipeBook, item_id, readable

_CRAFT = re.compile(r"craft (.*) using (.*)")
_GET = re.compile(r"get ([0-9]+) (.*)")
_COUNT = re.compile(r"([0-9]+) (.*)")


class ActionFailed(Exception):
    pass


@dataclass(frozen=True)
class Outcome:
    reply: str
    ok: bool  # the command was carried out
    reward: float
    done: bool


class Game:
    def __init__(self, book: RecipeBook, goal: str):
        self.book = book
        self.goal = goal
        self.inventory: dict[str, int] = {}

    def act(self, action: str) -> Outcome:
        try:
            if (m := _CRAFT.match(action)) is not None:
                return self._craft(m.group(1), m.group(2))
            if (m := _GET.match(action)) is not None:
                return self._get(int(m.group(1)), m.group(2))
            if action.startswith("inventory"):
                return Outcome(self.show_inventory(), True, 0.0, False)
            raise ActionFailed(f"Could not execute {action}")
        except ActionFailed as exc:
            return Outcome(str(exc), False, 0.0, False)

    def show_inventory(self) -> str:
        if not self.inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + " ".join(f"[{readable(k)}] ({v})" for k, v in self.inventory.items())

    def _ingredient(self, text: str) -> Ingredient:
        name = item_id(text)
        return Ingredient(name, self.book.is_tag(name))

    def _get(self, amount: int, text: str) -> Outcome:
        ing = self._ingredient(text)
        if ing.is_tag or not self.book.is_fetchable(ing.name):
            raise ActionFailed(f"Could not find {text}")
        self.inventory[ing.name] = self.inventory.get(ing.name, 0) + amount
        done = ing.name == self.goal
        return Outcome(f"Got {amount} {text}", True, float(done), done)

    def _craft(self, output_text: str, inputs_text: str) -> Outcome:
        m = _COUNT.match(output_text)
        output = self._ingredient(m.group(2) if m else output_text)
        given: list[tuple[Ingredient, int]] = []
        for part in inputs_text.split(","):
            pm = _COUNT.match(part.strip())
            if pm is None:
                raise ActionFailed(f"Wrong item format: {part.strip()}")
            given.append((self._ingredient(pm.group(2)), int(pm.group(1))))
        for ing, n in given:
            if ing.is_tag or self.inventory.get(ing.name, 0) < n:
                raise ActionFailed(f"Could not find enough items to craft {output.name}")
        recipe = None if output.is_tag else self._match(output.name, given)
        if recipe is None:
            raise ActionFailed(f"Could not find a valid recipe for {readable(output.name)}")
        for ing, n in given:
            self.inventory[ing.name] -= n
            if self.inventory[ing.name] == 0:
                del self.inventory[ing.name]
        self.inventory[recipe.output] = self.inventory.get(recipe.output, 0) + recipe.count
        done = recipe.output == self.goal
        return Outcome(f"Crafted {recipe.count} {recipe.output}", True, float(done), done)

    def _match(self, output: str, given: list[tuple[Ingredient, int]]) -> Recipe | None:
        for recipe in self.book.by_item.get(output, ()):
            left = list(given)
            for want, count in recipe.inputs:
                hit = next((g for g in left if self._satisfies(g[0], want)), None)
                if hit is None or hit[1] != count:
                    break
                left.remove(hit)
            else:
                if not left:
                    return recipe
        return None

    def _satisfies(self, have: Ingredient, want: Ingredient) -> bool:
        if not want.is_tag:
            return have.name == want.name
        return have.name == want.name or self.book.item_tag.get(have.name) == want.name
