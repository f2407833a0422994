"""Checks made before any role starts: can every family of the mix run the items its splits will draw here?

Each family may export a `preflight(family_cfg, item_ids) -> [problem, ...]` hook in its `extras` (WebArena:
the browser, the sites' URLs, login states; Search: the retrieval server or corpus; SciWorld: Java). Reading a
family's split is itself checked (a missing dataset file, a filter that leaves nothing). A problem found here
costs the user seconds; found per episode, it costs a run that spins on env errors.
"""
from __future__ import annotations

from typing import Any, Iterable

from environments.item_sampler import family_items
from environments.registry import family_config, get_family


def preflight(env_cfg: Any, splits: Iterable[str]) -> list[str]:
    """Every problem that stops a family of `env_cfg.mix` from running the items of `splits`, naming the family."""
    problems: list[str] = []
    for name in sorted(env_cfg.mix):
        items: list[str] = []
        try:
            for split in dict.fromkeys(splits):
                ids = family_items(name, env_cfg, split)
                if not ids:
                    problems.append(f"env.mix.{name}: its {split} split has no items (check env.{name} filters)")
                items += ids
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"env.mix.{name}: {exc}")
            continue
        if name == "agentgym_http":  # a server the user runs: its client checks it on the first reset
            continue
        check = get_family(name).extras.get("preflight")
        if check is not None:
            found = check(family_config(name, env_cfg), list(dict.fromkeys(items)))
            problems += [f"env.mix.{name}: {p}" for p in found]
    return problems
