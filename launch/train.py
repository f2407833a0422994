"""Train: `python -m launch.train [--config configs/X.yaml] [key=value ...]`.

Starts a local Ray on loopback (or joins RAY_ADDRESS / ray.address) and runs the asynchronous training job.
Runs unchanged under `ray job submit --working-dir . -- python -m launch.train ...`.
"""
from __future__ import annotations

import sys

from launch.job.cli import parse


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse(argv, "launch.train", __doc__.splitlines()[0])
    from environments.preflight import preflight
    from launch.job.stack_check import stack_problems

    problems = stack_problems(cfg)  # attention kernel, compile mode, dtype against what is installed here
    problems += preflight(cfg.env, [cfg.env.train_split] + ([cfg.eval.split] if cfg.eval.at_end else []))
    if problems:
        print("launch.train: this config cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    from launch.job.run import run_training  # heavy imports (torch, Ray, vLLM) only after the config is valid

    return run_training(cfg)


if __name__ == "__main__":
    sys.exit(main())
