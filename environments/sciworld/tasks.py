"""SciWorld item ids: `sciworld_<n>` is the n-th (task, variation) pair.

The pairs are enumerated task by task in the simulator's own task order (its tasks.json), variation 0 first,
skipping the tasks the reference leaves out (5-1, 5-2 grow plant/fruit; 9-1..9-3 inclined planes; 10-1, 10-2
Mendelian genetics): 4,639 pairs. `sciworld_0` is boil variation 0, `sciworld_4638` identify-life-stages-2
variation 9.

The table below is the simulator's own data (task name, number of variations, and how many of the leading
variations it assigns to its train and dev sets; the rest are its test set), written down so that the id space
is known without starting a JVM. tests/test_sciworld.py checks it against the simulator.

Splits: `train` is every train-set variation of every kept task (2,312 items); `test` is 200 items drawn from the
simulator's test-set variations, round-robin over the 23 task types so that each type is represented.
"""
from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

from core.env import split_item_id

# (simulator task id, task name, variations, train variations, dev variations), in the simulator's order.
TASK_TABLE: tuple[tuple[str, str, int, int, int], ...] = (
    ("1-1", "boil", 30, 14, 7),
    ("1-2", "melt", 30, 14, 7),
    ("1-3", "freeze", 30, 14, 7),
    ("1-4", "change-the-state-of-matter-of", 30, 14, 7),
    ("2-1", "use-thermometer", 540, 270, 135),
    ("2-2", "measure-melting-point-known-substance", 436, 218, 109),
    ("2-3", "measure-melting-point-unknown-substance", 300, 150, 75),
    ("3-1", "power-component", 20, 10, 5),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy", 20, 10, 5),
    ("3-3", "test-conductivity", 900, 450, 225),
    ("3-4", "test-conductivity-of-unknown-substances", 600, 300, 150),
    ("4-1", "find-living-thing", 300, 150, 75),
    ("4-2", "find-non-living-thing", 300, 150, 75),
    ("4-3", "find-plant", 300, 150, 75),
    ("4-4", "find-animal", 300, 150, 75),
    ("5-1", "grow-plant", 126, 62, 31),
    ("5-2", "grow-fruit", 126, 62, 31),
    ("6-1", "chemistry-mix", 32, 16, 8),
    ("6-2", "chemistry-mix-paint-secondary-color", 36, 18, 9),
    ("6-3", "chemistry-mix-paint-tertiary-color", 36, 18, 9),
    ("7-1", "lifespan-longest-lived", 125, 62, 31),
    ("7-2", "lifespan-shortest-lived", 125, 62, 31),
    ("7-3", "lifespan-longest-lived-then-shortest-lived", 125, 62, 31),
    ("8-1", "identify-life-stages-1", 14, 6, 3),
    ("8-2", "identify-life-stages-2", 10, 4, 2),
    ("9-1", "inclined-plane-determine-angle", 168, 84, 42),
    ("9-2", "inclined-plane-friction-named-surfaces", 1386, 692, 346),
    ("9-3", "inclined-plane-friction-unnamed-surfaces", 162, 80, 40),
    ("10-1", "mendelian-genetics-known-plant", 120, 60, 30),
    ("10-2", "mendelian-genetics-unknown-plant", 480, 240, 120),
)
SKIPPED_TASKS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
TEST_SIZE = 200


@dataclass(frozen=True)
class SciWorldTask:
    task_id: str  # the simulator's id, e.g. "1-1"
    name: str  # the simulator's task name, e.g. "boil"
    variations: int
    train: int  # variations [0, train) are the simulator's train set
    dev: int  # [train, train + dev) its dev set; the rest its test set


KEPT_TASKS: tuple[SciWorldTask, ...] = tuple(SciWorldTask(*row) for row in TASK_TABLE if row[0] not in SKIPPED_TASKS)
_STARTS: tuple[int, ...] = tuple(itertools.accumulate([0] + [t.variations for t in KEPT_TASKS]))
NUM_ITEMS = _STARTS[-1]


def item_to_task(item_id: str) -> tuple[SciWorldTask, int]:
    """`sciworld_<n>` -> (task, variation). Raises ValueError naming the bad id."""
    family, n = split_item_id(item_id)
    if family != "sciworld":
        raise ValueError(f"item id {item_id!r} is not a sciworld item")
    if not 0 <= n < NUM_ITEMS:
        raise ValueError(f"item id {item_id!r} is out of range: sciworld ids run from 0 to {NUM_ITEMS - 1}")
    k = bisect.bisect_right(_STARTS, n) - 1
    return KEPT_TASKS[k], n - _STARTS[k]


def task_to_item(task_name: str, variation: int) -> str:
    for task, start in zip(KEPT_TASKS, _STARTS):
        if task.name == task_name:
            if not 0 <= variation < task.variations:
                raise ValueError(f"{task_name} has variations 0..{task.variations - 1}, not {variation}")
            return f"sciworld_{start + variation}"
    raise ValueError(f"unknown or skipped sciworld task {task_name!r}")


@functools.cache
def split_items(split: str) -> tuple[str, ...]:
    """Item ids of `train` or `test` (see the module docstring)."""
    if split == "train":
        return tuple(f"sciworld_{start + v}" for task, start in zip(KEPT_TASKS, _STARTS) for v in range(task.train))
    if split == "test":
        queues = [[start + v for v in range(task.train + task.dev, task.variations)]
                  for task, start in zip(KEPT_TASKS, _STARTS)]
        picked: list[int] = []
        depth = 0
        while len(picked) < TEST_SIZE:
            for queue in queues:
                if depth < len(queue) and len(picked) < TEST_SIZE:
                    picked.append(queue[depth])
            depth += 1
        return tuple(f"sciworld_{n}" for n in sorted(picked))
    raise ValueError(f"unknown split {split!r}: expected train or test")
