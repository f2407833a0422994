"""Write generated train/test splits: `python -m launch.splits [--out DIR] [--env NAME ...]`.

The files follow AgentGym-RL-Data-ID's layout (`train/<env>_train.json`, `eval/<env>_test.json`), so a run
reads them like the dataset's own (point env.data_dir at --out). Without --out they go to the cache that runs
fall back to when env.data_dir is empty.
"""
from __future__ import annotations

import argparse
import sys

from configs.env import FAMILIES
from environments.registry import available_families, get_family
from environments.splits import default_cache_dir, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch.splits", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help=f"output folder (default: {default_cache_dir()})")
    parser.add_argument("--env", action="append", choices=FAMILIES,
                        help="family to write (repeatable; default: every family with a fixed item space)")
    args = parser.parse_args(argv)
    root = args.out or str(default_cache_dir())
    names = args.env or [n for n in available_families() if get_family(n).num_items > 0]
    for name in names:
        family = get_family(name)
        try:
            paths = write(family, root)
        except ValueError as exc:
            print(f"launch.splits: {exc}", file=sys.stderr)
            return 2
        sizes = ", ".join(f"{k} {v}" for k, v in sorted(family.split_sizes.items()))
        print(f"{name}: generated deterministic splits ({sizes} of {family.num_items} items): "
              + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
