"""`python -m launch.ablate horizon|offpolicy [options] [key=value ...]`: ablations that train the same model on
the same items under a few variants, several seeds each, and write a report of how they compare.

- `horizon` (launch/ablate/horizon.py): fixed short, fixed long and ScalingInter-RL turn schedules, at equal
  learner steps (the paper's x-axis) by default, the equal-turns view beside it (`--equal turns` trains them
  to equal sampled turns instead). Report: docs/results/horizon.md.
- `offpolicy` (launch/ablate/offpolicy.py): decoupled PPO with its off-policy correction against the same loss
  without it (`algorithm.policy_loss=coupled`) at a high staleness bound, and eta = 0 as the synchronous
  reference. Report: docs/results/offpolicy.md.

What the runs share: launch/ablate/runs.py.
"""
from __future__ import annotations

import sys

USAGE = "usage: python -m launch.ablate horizon|offpolicy [options] [key=value ...] (--help for each)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("horizon", "offpolicy"):
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "horizon":
        from launch.ablate.horizon import horizon

        return horizon(argv[1:])
    from launch.ablate.offpolicy import offpolicy

    return offpolicy(argv[1:])

