"""Env families by name. Built-in family `X` lives in the package `environments.X`, which exports `FAMILY`.

A family of your own lives in any importable module that exports `FAMILY`; naming it in the config
(`env.families={name: module}`) registers it in every process that reads that config: `make_env`, and the item
sampler's `family_items` and `family_of`, register `env.families` before they resolve a name. Its options are
the mapping `env.options.<name>`; a built-in family's are its typed section `env.<name>`.

Modules are imported on first use, so asking for BabyAI never imports the ScienceWorld JVM bridge or
Playwright.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from configs.env import FAMILIES
from core.env import Env

_REGISTERED: dict[str, str] = {}  # families of env.families known in this process: name -> module


@dataclass(frozen=True)
class Family:
    name: str
    make_env: Callable[[Any], Env]  # builds one env from the family's options (`family_config`)
    num_items: int  # size of the item-id space: ids are <name>_0 ... <name>_{num_items - 1}
    split_sizes: dict[str, int] = field(default_factory=dict)  # documented sizes of "train" and "test"
    reference_max_turns: int = 20  # the turn limit the reference's scripts use for this family
    extras: dict[str, Any] = field(default_factory=dict)  # family-specific hooks (e.g. a scripted solver)


def register_families(modules: Mapping[str, str]) -> None:
    """Make the families of `env.families` (name -> module exporting FAMILY) known in this process. Registering
    the same name again from the same module does nothing; from another module, or a built-in name, raises."""
    for name, module in modules.items():
        if name in FAMILIES:
            raise ValueError(f"env.families.{name}: {name!r} is a built-in family")
        known = _REGISTERED.setdefault(name, module)
        if known != module:
            raise ValueError(f"env.families.{name}: already registered from {known}, not {module}")


def known_families() -> list[str]:
    """The built-in families and those registered in this process."""
    return [*FAMILIES, *_REGISTERED]


def get_family(name: str) -> Family:
    if name in FAMILIES:
        module_name = f"environments.{name}"
    elif name in _REGISTERED:
        module_name = _REGISTERED[name]
    else:
        raise KeyError(f"unknown env family {name!r}; known: {', '.join(known_families())} "
                       "(a family of your own is named in env.families)")
    module = importlib.import_module(module_name)
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise TypeError(f"{module_name} does not export FAMILY (an environments.registry.Family)")
    if family.name != name:
        raise ValueError(f"{module_name} exports the family {family.name!r}, registered as {name!r}")
    if name in _REGISTERED and "max_instances_per_actor" in family.extras:
        raise ValueError(f"{module_name}: max_instances_per_actor is for built-in families; env.slots_per_actor "
                         "bounds the envs of a family of your own")
    return family


def family_config(name: str, env_cfg: Any) -> Any:
    """What `make_env` and the hooks of family `name` receive: the section `env.<name>` of a built-in family,
    the mapping `env.options.<name>` (empty when not given) of one from env.families."""
    if name in FAMILIES:
        return getattr(env_cfg, name)
    return dict(getattr(env_cfg, "options", {}).get(name, {}))


def available_families() -> list[str]:
    """Built-in families whose package exists in this checkout."""
    return [n for n in FAMILIES if importlib.util.find_spec(f"environments.{n}") is not None]


def make_env(name: str, env_cfg: Any) -> Env:
    """One env of family `name`, configured from `env_cfg` (an `EnvConfig`)."""
    register_families(getattr(env_cfg, "families", {}))
    return get_family(name).make_env(family_config(name, env_cfg))
