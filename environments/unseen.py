"""Evaluation items that no split contains: unseen seeds of the task kinds a run trains on.

A family offers them through its `unseen_items(family_cfg, taken, count) -> list[str]` hook (registry extras):
`count` ids (0: the family's own default) none of which is in `taken`, the ids of its train and test splits as
this run reads them (the dataset's files when env.data_dir has them, else the generated ones). The result is a
pure function of the config and the splits, so every run and every machine evaluates the same items.
BabyAI has one (seeds past its 900-id split space, of env.babyai.levels); families whose id space wraps onto
the same tasks (TextCraft) or whose tasks are all in their splits have none, and asking for it names them.
"""
from __future__ import annotations

from typing import Any

from environments.registry import family_config, get_family, register_families
from environments.splits import SPLITS, load_split

HOOK = "unseen_items"


def unseen_items(name: str, env_cfg: Any, count: int = 0, cache_dir: str | None = None) -> list[str]:
    register_families(getattr(env_cfg, "families", {}))
    hook = get_family(name).extras.get(HOOK)
    if hook is None:
        raise ValueError(f"eval.item_set=unseen: {name} has no items outside its train and test splits; "
                         "evaluate it on eval.item_set=split")
    taken = {i for split in SPLITS for i in load_split(name, split, env_cfg.data_dir, cache_dir)}
    return list(hook(family_config(name, env_cfg), taken, count))
