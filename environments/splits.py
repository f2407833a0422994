"""Train/test item splits: AgentGym-RL-Data-ID's files when the user has them, generated ones otherwise.

What must hold:
- Files of the dataset load as-is: `<data_dir>/train/<env>_train.json` and `<data_dir>/eval/<env>_test.json`,
  each a JSON list of `{"item_id": "<env>_<n>"}` (extra keys are ignored, a malformed file fails naming it).
- Without them, splits of the documented sizes (`Family.split_sizes`) are generated from the family's id space
  by a seeded shuffle (test first, then train, disjoint, each sorted by number), written in the same layout
  under a cache folder, and a warning says that this happened and where. The same family always gets the same
  split on any machine.
- `python -m launch.splits` writes them explicitly.
"""
from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path

from core.env import split_item_id
from environments.registry import Family, get_family

log = logging.getLogger("agentgym.splits")

SPLITS = ("train", "test")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentgym-rl" / "splits"


def split_path(root: str | os.PathLike, family: str, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    folder, suffix = ("train", "train") if split == "train" else ("eval", "test")
    return Path(root) / folder / f"{family}_{suffix}.json"


def read_split_file(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{\"item_id\": ...}}, got {type(data).__name__}")
    ids = []
    for k, entry in enumerate(data):
        item = entry.get("item_id") if isinstance(entry, dict) else None
        if not isinstance(item, str):
            raise ValueError(f"{path}: entry {k} has no string item_id: {entry!r:.80}")
        split_item_id(item)  # raises naming a malformed id
        ids.append(item)
    return ids


def generate(family: Family) -> dict[str, list[str]]:
    """Deterministic splits of the documented sizes for `family` (its own `split_items` hook, when it has one:
    SciWorld splits by variation as the simulator does, Search by its generated QA set, WebArena by task)."""
    own = family.extras.get("split_items")
    if own is not None:
        return {"test": list(own("test")), "train": list(own("train"))}
    sizes = family.split_sizes
    test, train = sizes.get("test", 0), sizes.get("train", 0)
    if family.num_items <= 0:
        raise ValueError(f"{family.name}: its item space is defined by a server, so its splits cannot be "
                         f"generated; give env.data_dir with the dataset files")
    if test + train > family.num_items:
        raise ValueError(f"{family.name}: split sizes {sizes} exceed its {family.num_items} items")
    order = list(range(family.num_items))
    random.Random(f"agentgym-rl/splits/{family.name}").shuffle(order)
    return {"test": [f"{family.name}_{n}" for n in sorted(order[:test])],
            "train": [f"{family.name}_{n}" for n in sorted(order[test:test + train])]}


def write(family: Family, root: str | os.PathLike) -> list[Path]:
    """Write the generated splits of `family` under `root` in the dataset's layout; returns the paths."""
    written = []
    for split, ids in generate(family).items():
        path = split_path(root, family.name, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # concurrent writers
        tmp.write_text("[\n" + ",\n".join(json.dumps({"item_id": i}) for i in ids) + "\n]\n")
        tmp.replace(path)
        written.append(path)
    return written


def load_split(family: str, split: str, data_dir: str | os.PathLike = "",
               cache_dir: str | os.PathLike | None = None) -> list[str]:
    """Item ids of `split` for `family`: from `data_dir` when its file exists, else generated into the cache."""
    if data_dir:
        path = split_path(data_dir, family, split)
        if path.is_file():
            return read_split_file(path)
        log.warning("%s not found; using generated splits instead", path)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = split_path(root, family, split)
    if not path.is_file():
        written = write(get_family(family), root)
        log.warning("AgentGym-RL-Data-ID splits for %s not given: generated deterministic splits of the "
                    "documented sizes at %s", family, ", ".join(map(str, written)))
    return read_split_file(path)
