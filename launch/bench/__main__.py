"""`python -m launch.bench <name>` runs launch/bench/<name>.py's `main(argv)`."""
from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


HELPER_MODULES = {"report", "samples"}


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_")
                  and m.name not in HELPER_MODULES)


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] not in names:
        print(f"usage: python -m launch.bench {{{','.join(names)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(f"launch.bench.{argv[0]}")
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
