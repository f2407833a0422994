"""Which episode lengths a timed window of the async bench trained: the tail it actually measured.

The long-tail workload deals each item's turns from a stratified deck (environments/examples/workload.py):
every block of 16 groups a run starts holds exactly the tail's shares. A window of steps that does not cover
whole blocks (or a run whose batches were not taken in start order) can still hold more or fewer of the longest
episodes than the tail's weights give, and async gains most on those, so the bench prints what its runs
trained. This reads it from a finished run's lineage: `trained.jsonl` (the groups each step trained) and
`groups.jsonl` (each group's item).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from core.metrics import read_jsonl
from environments.examples.workload import TAIL, turns_for


def window_turns(run_dir: Path, first: int, last: int, turns: int = 1, seed: int = 0) -> dict[int, int]:
    """Groups trained by steps first..last (inclusive) of the run in `run_dir`, counted by their turns; every
    length of the tail is a key, those with no group included."""
    items = {g["group_id"]: g["item_id"] for g in read_jsonl(run_dir / "groups.jsonl")}
    counts: Counter[int] = Counter()
    for row in read_jsonl(run_dir / "trained.jsonl"):
        if first <= row["step"] <= last:
            for group in row["groups"]:
                if group not in items:
                    raise ValueError(f"{run_dir}: step {row['step']} trained {group}, which groups.jsonl lacks")
                counts[turns_for(items[group], turns, True, seed)] += 1
    return {multiple * turns: counts.get(multiple * turns, 0) for multiple, _ in TAIL}


def expected_turns(groups: int, turns: int = 1) -> dict[int, float]:
    """What the tail's weights give `groups` groups, on average, by turns."""
    total = sum(weight for _, weight in TAIL)
    return {multiple * turns: groups * weight / total for multiple, weight in TAIL}


def describe(found: dict[int, int], first: int, last: int, turns: int = 1) -> str:
    """One line: the window's groups by turns, beside what the tail's weights give as many groups."""
    expected = expected_turns(sum(found.values()), turns)
    lengths = ", ".join(str(t) for t in found)
    return (f"the timed steps {first}-{last} trained {sum(found.values())} groups of {lengths} turns: "
            + ", ".join(str(n) for n in found.values())
            + " (the tail's weights give " + ", ".join(f"{n:.3g}" for n in expected.values()) + ")")
