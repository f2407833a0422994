"""Scripted solvers through the text interfaces: `python -m launch.bench solvers [--items N] [--turns T]`.

BabyAI: the expert (environments/babyai/expert.py, true grid state, the env's own text actions only) on
babyai_0 ... babyai_{N-1} (N=800 by default: 20 seeds of each of the 40 levels), success rate per level within
T turns (20, the reference's limit). TextCraft: the crafting planner on all 544 goals, by depth, and how many
fit in 30 turns (the reference's limit). The JSON line holds `babyai_single_room_success` (acceptance: >= 0.95)
and `textcraft_solved` (acceptance: >= 200 including all 11 depth-4 goals).
"""
from __future__ import annotations

import argparse
import collections
import time

from tqdm import tqdm

from launch.bench.report import emit, table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.bench solvers", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=800)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args(argv)

    from environments.babyai.env import BabyAIEnv
    from environments.babyai.expert import run_expert
    from environments.babyai.levels import LEVELS, SINGLE_ROOM
    from environments.textcraft.env import TextCraftEnv
    from environments.textcraft.planner import plan

    env = BabyAIEnv(parse_mode="strict")
    wins: dict[str, list[bool]] = collections.defaultdict(list)
    turns: dict[str, list[int]] = collections.defaultdict(list)
    t0 = time.perf_counter()
    for n in tqdm(range(args.items), desc="babyai expert", mininterval=2):
        ok, _, used = run_expert(f"babyai_{n}", args.turns, env)
        wins[LEVELS[n % 40]].append(ok)
        if ok:
            turns[LEVELS[n % 40]].append(used)
    babyai_seconds = time.perf_counter() - t0
    rows = [(level, "yes" if level in SINGLE_ROOM else "", len(wins[level]), sum(wins[level]),
             sum(wins[level]) / max(1, len(wins[level])),
             sum(turns[level]) / len(turns[level]) if turns[level] else float("nan")) for level in LEVELS]
    print(table(("level", "single room", "items", "solved", "success", "mean turns"), rows))
    single = [w for level in SINGLE_ROOM for w in wins[level]]
    every = [w for level in LEVELS for w in wins[level]]

    tc = TextCraftEnv(parse_mode="strict")
    solved, total, within = collections.Counter(), collections.Counter(), 0
    for n in range(len(tc.book.goals)):
        obs = tc.reset(f"textcraft_{n}")
        depth = obs.info["depth"]
        total[depth] += 1
        actions = plan(obs.text, tc.book)
        result = None
        for action in actions:
            result = tc.step(f"Thought:\nnext\n\nAction:\n{action}")
            if not result.valid_action:
                break
        if result is not None and result.success:
            solved[depth] += 1
            within += len(actions) <= 30
    print(table(("textcraft depth", "goals", "solved"), [(d, total[d], solved[d]) for d in sorted(total)]))
    emit({"babyai_items": len(every), "babyai_single_room_success": sum(single) / max(1, len(single)),
          "babyai_all_levels_success": sum(every) / max(1, len(every)), "babyai_seconds": babyai_seconds,
          "textcraft_solved": sum(solved.values()), "textcraft_depth4_solved": solved[4],
          "textcraft_solved_within_30_turns": within})
    return 0
