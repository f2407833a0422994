"""`python -m environments.babyai.probe [LEVEL ...] [--seeds 60] [--limits 2,4,6,10,20]`: how many turns a level
needs, before anything is trained on it.

For each level, on `--seeds` unseen items (seeds past the 900-id split space, the way `eval.item_set=unseen` draws
them): the success of a uniformly random choice among the listed actions within each turn limit (one episode per
item, played to the largest limit; success within L turns counts at L, so the row never falls as L grows), and
the turns the scripted expert (environments/babyai/expert.py) takes to solve it, as percentiles (`expert unsolved`: items it did not solve within `--expert-turns`, or where it
chose an action the env refused: it was made for the single-room levels). A level where random at the long limit stays low and the expert
needs more turns than the short limit is one where an agent must use its turns: the horizon ablation's levels
(launch/ablate/horizon.py) were chosen with it.
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass

from core.stats import percentile
from environments.babyai import NUM_ITEMS, listed_actions
from environments.babyai.env import BabyAIEnv
from environments.babyai.expert import run_expert
from environments.babyai.levels import LEVELS

FIRST_UNSEEN_SEED = -(-NUM_ITEMS // len(LEVELS))  # the first seed with no id in the reference's split space


@dataclass
class LevelProbe:
    level: str
    items: int
    random_within: dict[int, float]  # turn limit -> share of items random solved within it
    expert_turns: list[int]  # turns the expert took, per item it solved
    expert_failed: int  # items it did not solve within its cap


def unseen_ids(level: str, seeds: int) -> list[str]:
    index = LEVELS.index(level)
    return [f"babyai_{(FIRST_UNSEEN_SEED + s) * len(LEVELS) + index}" for s in range(seeds)]


def random_turns(env: BabyAIEnv, item: str, limit: int, seed: int) -> int | None:
    """The turn at which a random player solved `item` (None: not within `limit`)."""
    text = env.reset(item).text
    rng = random.Random(f"probe/{seed}/{item}")
    for turn in range(1, limit + 1):
        result = env.step("Action:\n" + rng.choice(listed_actions(text)))
        text = result.observation
        if result.done:
            return turn if result.success else None
    return None


def probe_level(env: BabyAIEnv, level: str, seeds: int, limits: list[int], expert_cap: int,
                seed: int = 0) -> LevelProbe:
    items = unseen_ids(level, seeds)
    solved_at = [random_turns(env, item, max(limits), seed) for item in items]
    within = {limit: sum(t is not None and t <= limit for t in solved_at) / len(items) for limit in limits}
    turns, failed = [], 0
    for item in items:
        try:
            ok, _, used = run_expert(item, expert_cap, env)
        except AssertionError:  # the expert (made for the single-room levels) chose an action the env refused
            ok, used = False, 0
        if ok:
            turns.append(used)
        else:
            failed += 1
    return LevelProbe(level, len(items), within, sorted(turns), failed)


def quantile(values: list[int], q: float) -> str:
    return str(int(percentile(values, q))) if values else "-"


def row(p: LevelProbe) -> str:
    randoms = " | ".join(f"{p.random_within[limit]:.2f}" for limit in p.random_within)
    t = p.expert_turns
    return (f"| {p.level} | {p.items} | {randoms} | {quantile(t, 0.25)} / {quantile(t, 0.5)} / "
            f"{quantile(t, 0.75)} / {t[-1] if t else '-'} | {p.expert_failed} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.babyai.probe", description=__doc__.splitlines()[0])
    parser.add_argument("levels", nargs="*", default=list(LEVELS), help="BabyAI level names (default: all 40)")
    parser.add_argument("--seeds", type=int, default=60, help="unseen items per level")
    parser.add_argument("--limits", default="2,4,6,10,20", help="turn limits of the random player, comma-separated")
    parser.add_argument("--expert-turns", type=int, default=40, help="the expert's turn cap")
    parser.add_argument("--seed", type=int, default=0, help="varies the random player's choices")
    args = parser.parse_args(argv)
    unknown = [lv for lv in args.levels if lv not in LEVELS]
    if unknown:
        parser.error(f"unknown BabyAI level(s): {', '.join(unknown)} (the 40: environments/babyai/levels.py)")
    try:
        limits = sorted({int(x) for x in args.limits.split(",")})
    except ValueError:
        parser.error(f"--limits must be comma-separated integers, got {args.limits!r}")
    if args.seeds < 1 or limits[0] < 1:
        parser.error("--seeds and every --limits entry must be >= 1")
    env = BabyAIEnv(parse_mode="strict")
    print(f"random player (uniform over the listed actions) and scripted expert on {args.seeds} unseen items a "
          f"level", flush=True)
    print("| level | items | " + " | ".join(f"random within {limit}" for limit in limits)
          + " | expert turns p25 / p50 / p75 / max | expert unsolved |")
    print("|---|---|" + "---|" * len(limits) + "---|---|", flush=True)
    try:
        for level in args.levels:
            print(row(probe_level(env, level, args.seeds, limits, args.expert_turns, args.seed)), flush=True)
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
