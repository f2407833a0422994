"""SciWorld (ScienceWorld 1.2.3, bundled simulator jar, Java >= 1.8): `sciworld_<n>` over 4,639 (task, variation)
pairs; see tasks.py for the mapping and splits, env.py for reward, success and parsing, simulator.py for the JVM.

| module | what it is |
|---|---|
| `tasks` | the item ids: `sciworld_<n>` as the n-th (task, variation) pair, the simulator's table, the splits |
| `env` | the SciWorld env: reward as the change of the normalised score, success at 100, action parsing |
| `simulator` | one ScienceWorld simulator: a JVM of its own with a small heap, driven over py4j, a lean step |
"""
from __future__ import annotations

import random
import shutil
import re

from configs.env import SciWorldConfig
from core.env import Env, run_sync_env
from environments.registry import Family
from environments.sciworld.env import SciWorldEnv
from environments.sciworld.tasks import NUM_ITEMS, item_to_task, split_items

_DOOR = re.compile(r"A door to the ([a-z ]+?) \(")


def make_env(cfg: SciWorldConfig) -> Env:
    """One env, one JVM (started on its first reset), stepped on one worker thread of its own."""
    return run_sync_env(SciWorldEnv(cfg))


def scripted_reply(observation: str, rng: random.Random) -> str:
    """A plausible, always-valid reply: look, check the inventory or task, or walk through a door in view."""
    commands = ["look around", "inventory", "task"]
    commands += [f"go to {room}" for room in _DOOR.findall(observation)]
    command = rng.choice(commands)
    return f"Thought:\nI should explore before acting.\n\nAction:\n{command}"


def preflight(cfg, items: list[str]) -> list[str]:
    """ScienceWorld's simulator is a JVM: Java must be on PATH."""
    if shutil.which("java") is None:
        return ["ScienceWorld runs in a JVM and no `java` is on PATH (Debian: apt-get install -y "
                "openjdk-17-jre-headless; launch/install.sh does this)"]
    return []


FAMILY = Family(
    name="sciworld",
    make_env=make_env,
    num_items=NUM_ITEMS,
    split_sizes={"train": len(split_items("train")), "test": len(split_items("test"))},
    reference_max_turns=30,
    extras={
        "scripted_reply": scripted_reply,
        "contract_items": ["sciworld_0", "sciworld_2936"],  # boil, find-living-thing
        "max_instances_per_actor": lambda cfg: cfg.max_jvms_per_actor,
        "split_items": lambda split: list(split_items(split)),
        "item_label": lambda item_id: item_to_task(item_id)[0].name,  # eval reports: by task
        "preflight": preflight,
    },
)
