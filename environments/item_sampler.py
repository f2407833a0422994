"""Drawing training items by the configured env mix: a family by weight (`env.mix`), then an item of its split.

Each family's items come from environments.splits (the dataset files or generated splits), narrowed by the
family's `select_items(family_cfg, ids)` hook when it has one (e.g. BabyAI's `env.babyai.levels`); the train
split also takes the items of a `generated_train_items(family_cfg)` hook (BabyAI's `generated_train_seeds`). The
agentgym_http family takes the split of the task its server hosts and names the items `agentgym_http_<n>`.
Families of your own (`env.families`) are registered here before their names are resolved.
Draws come from core.sampler.ItemSampler: seeded epochs per family and a state that resumes exactly; a family
whose extras set `in_order` (a deck, e.g. the workload family's long tail) is dealt in its split's order.
"""
from __future__ import annotations

from typing import Any

from core.env import split_item_id
from core.sampler import ItemSampler
from environments.registry import family_config, get_family, known_families, register_families
from environments.splits import load_split, split_path


def family_items(name: str, env_cfg: Any, split: str, cache_dir: str | None = None) -> list[str]:
    if name == "agentgym_http":
        task = env_cfg.agentgym_http.task
        if not task:
            raise ValueError("env.agentgym_http.task: name the task the server hosts (its dataset name)")
        ids = load_split(task, split, env_cfg.data_dir, cache_dir)
        return [f"agentgym_http_{split_item_id(i)[1]}" for i in ids]
    register_families(getattr(env_cfg, "families", {}))
    family = get_family(name)
    # a family whose config names its own data (Search's qa_dir) splits it itself, unless data_dir has the file
    own = family.extras.get("config_split_items")
    ids = own(family_config(name, env_cfg), split) if own is not None else None
    if ids is None or (env_cfg.data_dir and split_path(env_cfg.data_dir, name, split).is_file()):
        ids = load_split(name, split, env_cfg.data_dir, cache_dir)
    select = family.extras.get("select_items")
    ids = select(family_config(name, env_cfg), ids) if select else ids
    generated = family.extras.get("generated_train_items")  # e.g. env.babyai.generated_train_seeds
    if split == "train" and generated is not None:
        have = set(ids)
        ids = list(ids) + [i for i in generated(family_config(name, env_cfg)) if i not in have]
    return ids


def mix_sampler(env_cfg: Any, split: str = "train", seed: int = 0, cache_dir: str | None = None) -> ItemSampler:
    """The resumable sampler (core.sampler) over every family of `env.mix`, with its split's items."""
    items = {f: family_items(f, env_cfg, split, cache_dir) for f in sorted(env_cfg.mix)}
    for f, ids in items.items():
        if not ids:
            raise ValueError(f"env.mix.{f}: its {split} split has no items (check env.{f} filters)")
    in_order = {f for f in items if get_family(f).extras.get("in_order")}  # e.g. the workload family's deck
    return ItemSampler(items, dict(env_cfg.mix), seed=seed, in_order=in_order)


def family_of(item_id: str, env_cfg: Any) -> str:
    """The family that runs `item_id` (`<prefix>_<n>`), by these rules in order:

    1. prefix `agentgym_http`: the AgentGym HTTP client (its server's data_idx n);
    2. prefix equal to `env.agentgym_http.task`, the task its server hosts (`webshop_3`; `babyai_3` for a
       BabyAI server): the HTTP client, unless a built-in family of that name is in `env.mix`, which then
       keeps its own ids (the HTTP family's items are then `agentgym_http_<n>`, as its sampler names them);
    3. prefix naming a built-in family, or one of env.families: that family;
    4. anything else: ValueError.
    """
    prefix, _ = split_item_id(item_id)
    register_families(getattr(env_cfg, "families", {}))
    if prefix == "agentgym_http":
        return prefix
    if prefix == env_cfg.agentgym_http.task and prefix not in env_cfg.mix:
        return "agentgym_http"
    if prefix in known_families():
        return prefix
    raise ValueError(f"item id {item_id!r}: no env family {prefix!r} (known: {', '.join(known_families())}; "
                     f"env.agentgym_http.task: {env_cfg.agentgym_http.task!r})")
