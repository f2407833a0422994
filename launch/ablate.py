"""`python -m launch.ablate horizon`: the same model on the same items under three turn schedules, at equal
sampled turns, several seeds each, and a report of how they compare.

Variants (algorithm.horizon):
- `scaling`: ScalingInter-RL, the turn limit growing from `--short` to `--long` in `--stages` stages spread evenly
  over `--steps` learner steps. It runs first; the turns its trained batches held are the budget of the others.
- `fixed_short`: `--short` turns throughout; `fixed_long`: `--long` turns throughout. Each trains until its
  batches have held as many turns as the scaling run of the same seed (`trainer.max_trained_turns`), so every
  variant learns from the same number of sampled turns (a fixed short horizon takes more steps for it, a fixed
  long one fewer), capped at `--max-steps-factor` x `--steps` steps.
Every run evaluates its final policy greedily on the same unseen items of its training levels at the long turn
limit (`eval.item_set=unseen`, `eval.max_turns=--long`); the first run also evaluates the random policy and the
untrained model on them. The report (`--report`, Markdown) holds the setup, the final evaluation per variant and
seed with 95% intervals, the mean and the seed-to-seed range per variant, a plot of success rate and episode
length against trained turns (`<report stem>.png`), and a reading of the ordering against the seed spread.
Each run's own output stays in `--runs` (its train.log, metrics.jsonl, eval report); `--reuse` keeps the runs
already finished there (with the same arguments, an interrupted ablation resumes where it stopped).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from core.metrics import read_jsonl
from launch.ablate_report import write_report

VARIANTS = ("scaling", "fixed_short", "fixed_long")


def stage_schedule(short: int, long: int, stages: int, steps: int) -> tuple[list[int], list[int]]:
    """(turns, boundaries) of a schedule growing from `short` to `long` in at most `stages` stages over `steps`."""
    stages = max(1, min(stages, steps, long - short + 1))
    if stages == 1:
        return [short], []
    turns = [round(short + (long - short) * i / (stages - 1)) for i in range(stages)]
    boundaries = [round(steps * i / stages) for i in range(1, stages)]
    return turns, boundaries


def variant_overrides(variant: str, args: argparse.Namespace, budget: float) -> list[str]:
    if variant == "scaling":
        turns, bounds = stage_schedule(args.short, args.long, args.stages, args.steps)
        return [f"algorithm.horizon.turns={turns}", f"algorithm.horizon.boundaries={bounds}",
                f"trainer.total_steps={args.steps}"]
    turns = args.short if variant == "fixed_short" else args.long
    return [f"algorithm.horizon.turns=[{turns}]", "algorithm.horizon.boundaries=[]",
            f"trainer.total_steps={args.steps * args.max_steps_factor}", f"trainer.max_trained_turns={int(budget)}"]


def trained_turns(run_dir: Path) -> float:
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    totals = [r["rollout/trained_turns_total"] for r in rows if "rollout/trained_turns_total" in r]
    if not totals:
        raise RuntimeError(f"{run_dir}/metrics.jsonl holds no trained turns: the run trained no step")
    return totals[-1]


def train(name: str, overrides: list[str], args: argparse.Namespace, first: bool) -> Path:
    run_dir = Path(args.runs) / name
    if args.reuse and (run_dir / "eval" / "eval_report.json").exists():
        print(f"[{time.strftime('%H:%M:%S')}] {name}: reusing the finished run in {run_dir} "
              f"({trained_turns(run_dir):.0f} trained turns)", flush=True)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "launch.train", "--config", args.config, f"trainer.output_dir={run_dir}",
           "eval.at_end=true", "eval.item_set=unseen", f"eval.limit={args.eval_limit}", f"eval.max_turns={args.long}",
           f"eval.baselines={str(first).lower()}", "checkpoint.every_steps=0", "logging.progress_bar=false",
           *args.overrides, *overrides]
    started = time.monotonic()
    print(f"[{time.strftime('%H:%M:%S')}] {name}: training ({' '.join(overrides)})", flush=True)
    with open(run_dir / "train.log", "ab") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
                              ).returncode
    if code != 0:
        raise RuntimeError(f"{name}: the run exited {code}; its output is in {run_dir / 'train.log'}")
    print(f"[{time.strftime('%H:%M:%S')}] {name}: done in {(time.monotonic() - started) / 60:.1f} min, "
          f"{trained_turns(run_dir):.0f} trained turns", flush=True)
    return run_dir


def horizon(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.ablate horizon", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--short", type=int, default=2, help="the fixed short horizon and the first stage's")
    p.add_argument("--long", type=int, default=6, help="the fixed long horizon, the last stage's and eval's")
    p.add_argument("--stages", type=int, default=3, help="ScalingInter-RL stages from short to long")
    p.add_argument("--steps", type=int, default=24, help="learner steps of the ScalingInter-RL run")
    p.add_argument("--max-steps-factor", type=int, default=4, help="a fixed run's step cap, in --steps")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--eval-limit", type=int, default=0, help="unseen items to evaluate (eval.limit; 0: 30 per level)")
    p.add_argument("--runs", default="outputs/ablate-horizon", help="where each run's folder goes")
    p.add_argument("--report", default="docs/results/horizon.md")
    p.add_argument("--reuse", action="store_true",
                   help="keep every run already finished in --runs (its final evaluation written) instead of "
                        "training it again: an interrupted ablation resumes where it stopped")
    p.add_argument("overrides", nargs="*", help="key=value for every run (e.g. env.babyai.levels=[...])")
    args = p.parse_args(argv)
    if not 1 <= args.short < args.long:
        p.error(f"need 1 <= --short < --long, got {args.short} and {args.long}")
    started = time.monotonic()
    runs: dict[str, dict[int, Path]] = {v: {} for v in VARIANTS}
    first = True
    for seed in args.seeds:
        budget = 0.0
        for variant in VARIANTS:
            name = f"{variant}-s{seed}"
            run_dir = train(name, variant_overrides(variant, args, budget) + [f"trainer.seed={seed}"], args, first)
            first = False
            runs[variant][seed] = run_dir
            if variant == "scaling":
                budget = trained_turns(run_dir)
    command = "python -m launch.ablate horizon " + " ".join(argv)
    write_report(Path(args.report), runs, args, command=command, minutes=(time.monotonic() - started) / 60,
                 today=date.today().isoformat())
    print(f"report: {args.report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "horizon":
        print("usage: python -m launch.ablate horizon [options] [key=value ...]", file=sys.stderr)
        return 2
    return horizon(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
