"""`python -m launch.ablate horizon`: the same model on the same items under three turn schedules, several
seeds each, and a report of how they compare (the shared machinery: launch/ablate/runs.py).

Variants (algorithm.horizon):
- `scaling`: ScalingInter-RL, the turn limit growing from `--short` to `--long` in `--stages` stages spread evenly
  over `--steps` learner steps.
- `fixed_short`: `--short` turns throughout; `fixed_long`: `--long` turns throughout.
`--equal steps` (the default, the paper's x-axis): every variant trains `--steps` learner steps, so a longer
horizon trains on more turns per step. `--equal turns`: the scaling run goes first and each fixed run trains
until its batches have held as many turns as the scaling run of the same seed (`trainer.max_trained_turns`),
capped at `--max-steps-factor` x `--steps` steps. Either way the report shows both views side by side (curves
against learner steps and against trained turns) and says which one the runs were made equal in.
Every run evaluates its final policy greedily on the same unseen items of its training levels at the long turn
limit (`eval.item_set=unseen`, `eval.max_turns=--long`). The report (`--report`, Markdown) holds the setup, the
final evaluation per variant and seed with 95% intervals, the mean and the seed-to-seed range per variant, the
curves (`<report stem>.png`), and a reading of the ordering against the seed spread.
"""
from __future__ import annotations

import argparse
import time
from datetime import date
from pathlib import Path

from launch.ablate.horizon_report import write_report
from launch.ablate.runs import common_arguments, seed_overrides, train, trained_turns

VARIANTS = ("scaling", "fixed_short", "fixed_long")
# Levels where an agent must use its turns (`python -m environments.babyai.probe GoToRedBallGrey Open GoToSeqS5R2
# --seeds 90`, 2026-12-07): a random player solves 0.43 / 0.14 / 0.16 of unseen items within 6 turns (0.19 /
# 0.01 / 0.07 within 2), and the expert needs a median of 2 / 3 / 4 turns (75th percentile 2 / 5 / 6). The
# default's other two levels are solved by one or two macro actions: random reaches 0.67 and 0.76 within 6 turns.
LEVELS = ("GoToRedBallGrey", "Open", "GoToSeqS5R2")


def stage_schedule(short: int, long: int, stages: int, steps: int) -> tuple[list[int], list[int]]:
    """(turns, boundaries) of a schedule growing from `short` to `long` in at most `stages` stages over `steps`."""
    stages = max(1, min(stages, steps, long - short + 1))
    if stages == 1:
        return [short], []
    turns = [round(short + (long - short) * i / (stages - 1)) for i in range(stages)]
    boundaries = [round(steps * i / stages) for i in range(1, stages)]
    return turns, boundaries


def variant_overrides(variant: str, args: argparse.Namespace, budget: float) -> list[str]:
    """The variant's keys; `budget`: the scaling run's trained turns (used with --equal turns only)."""
    if variant == "scaling":
        turns, bounds = stage_schedule(args.short, args.long, args.stages, args.steps)
        return [f"algorithm.horizon.turns={turns}", f"algorithm.horizon.boundaries={bounds}",
                f"trainer.total_steps={args.steps}"]
    turns = args.short if variant == "fixed_short" else args.long
    fixed = [f"algorithm.horizon.turns=[{turns}]", "algorithm.horizon.boundaries=[]"]
    if args.equal == "steps":
        return fixed + [f"trainer.total_steps={args.steps}"]
    return fixed + [f"trainer.total_steps={args.steps * args.max_steps_factor}",
                    f"trainer.max_trained_turns={int(budget)}"]


def horizon(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.ablate horizon", description=__doc__.splitlines()[0])
    p.add_argument("--short", type=int, default=2, help="the fixed short horizon and the first stage's")
    p.add_argument("--long", type=int, default=6, help="the fixed long horizon, the last stage's and eval's")
    p.add_argument("--stages", type=int, default=3, help="ScalingInter-RL stages from short to long")
    p.add_argument("--steps", type=int, default=24, help="learner steps of every run (--equal turns: of the "
                                                         "ScalingInter-RL run)")
    p.add_argument("--equal", choices=("steps", "turns"), default="steps",
                   help="what the variants are made equal in: learner steps (the paper's x-axis) or sampled turns")
    p.add_argument("--max-steps-factor", type=int, default=4, help="--equal turns: a fixed run's step cap, in --steps")
    p.add_argument("--levels", default=",".join(LEVELS),
                   help="env.babyai.levels of every run, comma-separated ('': the config's own). The default's are "
                        "levels where more turns are needed (see LEVELS)")
    common_arguments(p, runs="outputs/ablate-horizon", report="docs/results/horizon.md", seeds=[0, 1, 2])
    args = p.parse_args(argv)
    if not 1 <= args.short < args.long:
        p.error(f"need 1 <= --short < --long, got {args.short} and {args.long}")
    if args.levels:  # before the caller's overrides, which may set them again
        args.overrides = [f"env.babyai.levels=[{args.levels}]", *args.overrides]
    started = time.monotonic()
    runs: dict[str, dict[int, Path]] = {v: {} for v in VARIANTS}
    first = True
    for seed in args.seeds:
        budget = 0.0
        for variant in VARIANTS:
            overrides = variant_overrides(variant, args, budget) + seed_overrides(seed)
            run_dir = train(f"{variant}-s{seed}", overrides, args, first, eval_turns=args.long)
            first = False
            runs[variant][seed] = run_dir
            if variant == "scaling":
                budget = trained_turns(run_dir)
    command = "python -m launch.ablate horizon " + " ".join(argv)
    write_report(Path(args.report), runs, args, command=command, minutes=(time.monotonic() - started) / 60,
                 today=date.today().isoformat())
    print(f"report: {args.report}")
    return 0
