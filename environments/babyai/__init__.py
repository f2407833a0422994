"""BabyAI (minigrid's BabyAI levels) as a text environment: `FAMILY` for the registry.

| module | what it is |
|---|---|
| `env` | the BabyAI env over minigrid: reset by item, one macro action per step, minigrid's own reward |
| `levels` | the reference's 40 levels and the item-id mapping: `babyai_<n>` is level n % 40, seed n // 40 |
| `view` | the agent's 7x7 egocentric view turned into named, numbered objects and sentences |
| `macros` | the text actions: macro actions planned by BFS over what the agent sees, compiled to primitives |
| `prompt` | the task instructions shown to the agent |
| `scripted` | a plausible valid reply read off the observation text alone, for contract tests and benches |
| `expert` | a scripted expert that plans over the true grid but acts only through the listed text actions |
| `probe` | `python -m environments.babyai.probe`: a random player's success within each turn limit and the expert's turns, per level |
"""
from __future__ import annotations

from typing import Any

from core.env import Env, run_sync_env
from environments.babyai.env import BabyAIEnv
from environments.babyai.levels import LEVELS, level_of
from environments.babyai.macros import CHECK
from environments.babyai.scripted import available_actions, scripted_reply
from environments.registry import Family


NUM_ITEMS = 900


def make_env(cfg: Any) -> Env:
    """One BabyAI env from `env.babyai` (a configs.env.BabyAIConfig)."""
    return run_sync_env(BabyAIEnv(parse_mode=cfg.parse_mode, prompt=cfg.prompt, turn_cue=cfg.turn_cue))


def select_items(cfg: Any, item_ids: list[str]) -> list[str]:
    """Keep the items of the levels named in `cfg.levels` (all of them when it is empty)."""
    if not cfg.levels:
        return list(item_ids)
    wanted = set(_levels(cfg))
    return [i for i in item_ids if level_of(i) in wanted]


UNSEEN_PER_LEVEL = 30  # eval.item_set=unseen with eval.limit 0: this many seeds of each level
GENERATED_FIRST_SEED = 1000  # env.babyai.generated_train_seeds start here; unseen evaluation seeds stay below


def _levels(cfg: Any) -> list[str]:
    levels = list(cfg.levels) or list(LEVELS)
    unknown = sorted(set(levels) - set(LEVELS))
    if unknown:
        raise ValueError(f"env.babyai.levels: unknown level(s) {', '.join(unknown)}")
    return levels


def generated_train_items(cfg: Any) -> list[str]:
    """`cfg.generated_train_seeds` seeds of each level of `cfg.levels` (all when empty) from seed 1000 upward, seed
    by seed through the levels: training items outside every split and every unseen evaluation item."""
    levels = _levels(cfg)
    return [f"babyai_{seed * len(LEVELS) + LEVELS.index(level)}"
            for seed in range(GENERATED_FIRST_SEED, GENERATED_FIRST_SEED + cfg.generated_train_seeds)
            for level in levels]


def unseen_items(cfg: Any, taken: set[str], count: int) -> list[str]:
    """`count` ids (0: 30 per level) of the levels of `cfg.levels` (all when empty) that are not in `taken`, seeds
    upward from the first past the 900-id split space (seed 23), seed by seed through the levels in their
    configured order, so any prefix is balanced across levels."""
    levels = _levels(cfg)
    count = count or UNSEEN_PER_LEVEL * len(levels)
    ids: list[str] = []
    seed = -(-NUM_ITEMS // len(LEVELS))
    while len(ids) < count:
        if seed >= GENERATED_FIRST_SEED:
            raise ValueError(f"eval.limit={count}: more unseen BabyAI items than the seeds below "
                             f"{GENERATED_FIRST_SEED} hold (the seeds from there on are "
                             "env.babyai.generated_train_seeds' training items)")
        for level in levels:
            item = f"babyai_{seed * len(LEVELS) + LEVELS.index(level)}"
            if item not in taken and len(ids) < count:
                ids.append(item)
        seed += 1
    return ids


def listed_actions(conversation: str) -> list[str]:
    """The actions of the latest `Available actions: [...]` listing, without `check available actions` (it only
    lists them again: a baseline choosing it would spend a turn and change nothing)."""
    return [a for a in available_actions(conversation) if a != CHECK]


FAMILY = Family(
    name="babyai",
    make_env=make_env,
    # 900 ids: the reference's splits (test 90, train about 810) are drawn from babyai_0 ... babyai_899.
    num_items=NUM_ITEMS,
    split_sizes={"train": 810, "test": 90},
    reference_max_turns=20,
    extras={
        "scripted_reply": scripted_reply,
        "contract_items": ["babyai_0", "babyai_11", "babyai_21", "babyai_39"],
        "select_items": select_items,
        "item_label": level_of,  # eval reports break results down by level
        "available_actions": listed_actions,  # the random baseline chooses among them
        "unseen_items": unseen_items,  # eval.item_set=unseen
        "generated_train_items": generated_train_items,  # env.babyai.generated_train_seeds
    },
)
