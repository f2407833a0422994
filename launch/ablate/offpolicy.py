"""`python -m launch.ablate offpolicy`: does the off-policy correction help when generation runs far ahead?
The same model on the same items under three variants, several seeds each (shared machinery: launch/ablate/runs.py).

Variants:
- `decoupled`: trainer.max_staleness = `--eta`, the decoupled PPO loss with its correction (the default loss:
  ratio around the proximal policy, truncated behaviour-to-proximal importance weight).
- `coupled`: the same staleness bound, the correction off (`algorithm.policy_loss=coupled`: the behaviour
  logprobs as the proximal ones, the standard PPO ratio, no importance weight).
- `sync`: eta = 0, the synchronous reference (the decoupled loss, whose weight is then 1 up to numerics).
Every run trains `--steps` learner steps. Generation can run ahead only as far as episodes are in flight: the
coordinator keeps at most 2 x env slots / group size groups in flight, so `env.slots_per_actor` is raised for
every variant to let `--eta` versions of batches be in flight (`--slots`, 0: that least number); the report
shows the staleness the trained tokens actually had. With `--eval-every N` (default 4) a checkpoint every N steps
is evaluated on the unseen items after each run: the report plots success on unseen items against learner steps
and against wall-clock (the steps' own seconds), with the untrained model at step 0.
"""
from __future__ import annotations

import argparse
import math
import time
from datetime import date
from pathlib import Path

from configs.load import load_config
from launch.ablate.offpolicy_report import write_report
from launch.ablate.runs import common_arguments, seed_overrides, train

VARIANTS = ("decoupled", "coupled", "sync")


def slots_for(args: argparse.Namespace) -> int:
    """env.slots_per_actor letting `--eta` steps of groups be in flight (at least the config's own)."""
    cfg = load_config(args.config, args.overrides)
    if args.slots:
        return args.slots
    groups = (args.eta + 1) * cfg.trainer.groups_per_step  # this step's batch and eta ahead
    needed = math.ceil(groups * cfg.rollout.group_size / 2 / cfg.env.num_actors)
    return max(cfg.env.slots_per_actor, needed)


def variant_overrides(variant: str, args: argparse.Namespace, slots: int) -> list[str]:
    eta = 0 if variant == "sync" else args.eta
    loss = "coupled" if variant == "coupled" else "decoupled"
    return [f"trainer.max_staleness={eta}", f"algorithm.policy_loss={loss}", f"trainer.total_steps={args.steps}",
            f"env.slots_per_actor={slots}"]


def offpolicy(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.ablate offpolicy", description=__doc__.splitlines()[0])
    p.add_argument("--eta", type=int, default=8, help="the staleness bound of the decoupled and coupled runs")
    p.add_argument("--steps", type=int, default=24, help="learner steps of every run")
    p.add_argument("--eval-turns", type=int, default=0,
                   help="turn limit of the evaluations (0: the last stage of the config's horizon schedule)")
    p.add_argument("--slots", type=int, default=0, help="env.slots_per_actor of every run (0: enough for --eta)")
    common_arguments(p, runs="outputs/ablate-offpolicy", report="docs/results/offpolicy.md", seeds=[0, 1, 2])
    p.set_defaults(eval_every=4)
    args = p.parse_args(argv)
    if args.eta < 1:
        p.error(f"--eta must be >= 1 (eta = 0 is the sync variant), got {args.eta}")
    if not args.eval_turns:
        from core.horizon import HorizonSchedule

        schedule = HorizonSchedule.from_config(load_config(args.config, args.overrides).algorithm)
        args.eval_turns = schedule.horizon_at(args.steps - 1)
    slots = slots_for(args)
    started = time.monotonic()
    runs: dict[str, dict[int, Path]] = {v: {} for v in VARIANTS}
    first = True
    for seed in args.seeds:
        for variant in VARIANTS:
            overrides = variant_overrides(variant, args, slots) + seed_overrides(seed)
            runs[variant][seed] = train(f"{variant}-s{seed}", overrides, args, first, eval_turns=args.eval_turns)
            first = False
    command = "python -m launch.ablate offpolicy " + " ".join(argv)
    write_report(Path(args.report), runs, args, command=command, minutes=(time.monotonic() - started) / 60,
                 today=date.today().isoformat(), slots=slots)
    print(f"report: {args.report}")
    return 0
