"""Env families by name. Family `X` lives in the package `environments.X`, which exports `FAMILY`.

Modules are imported on first use, so asking for BabyAI never imports the ScienceWorld JVM bridge or
Playwright.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from configs.env import FAMILIES
from core.env import Env


@dataclass(frozen=True)
class Family:
    name: str
    make_env: Callable[[Any], Env]  # builds one env from the family's config section (env.<name>)
    num_items: int  # size of the item-id space: ids are <name>_0 ... <name>_{num_items - 1}
    split_sizes: dict[str, int] = field(default_factory=dict)  # documented sizes of "train" and "test"
    reference_max_turns: int = 20  # the turn limit the reference's scripts use for this family
    extras: dict[str, Any] = field(default_factory=dict)  # family-specific hooks (e.g. a scripted solver)


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise KeyError(f"unknown env family {name!r}; known: {', '.join(FAMILIES)}")
    module = importlib.import_module(f"environments.{name}")
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise TypeError(f"environments.{name} does not export FAMILY")
    return family


def available_families() -> list[str]:
    """Families whose package exists in this checkout."""
    return [n for n in FAMILIES if importlib.util.find_spec(f"environments.{n}") is not None]


def make_env(name: str, env_cfg: Any) -> Env:
    """One env of family `name`, configured by `env_cfg.<name>` (an `EnvConfig`)."""
    return get_family(name).make_env(getattr(env_cfg, name))
