"""Checks a freshly built venv before launch/install.sh marks it complete.

    python launch/verify_install.py [--cuda] MODULE...

Imports every MODULE (in order) and, with `--cuda`, requires `torch.cuda.is_available()`. Every failure is
printed, one line each naming the module or the check, and the exit code is 1 if there was any; a partly
broken venv is thus never marked complete. Run as a file, so that it needs nothing from the checkout.
"""
from __future__ import annotations

import argparse
import importlib
import sys


def failures(modules: list[str], cuda: bool) -> list[str]:
    """One line per failed import or check; empty when the venv is good."""
    found = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # any import-time error means the package is unusable: report it, go on
            found.append(f"import {name}: {type(e).__name__}: {e}")
    if cuda:
        try:
            import torch
        except Exception as e:
            found.append(f"torch.cuda.is_available(): torch does not import ({type(e).__name__}: {e})")
        else:
            if not torch.cuda.is_available():
                found.append(f"torch.cuda.is_available() is False (torch {torch.__version__}, built for "
                             f"CUDA {torch.version.cuda}): no usable GPU or driver for this build")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="require torch.cuda.is_available()")
    parser.add_argument("modules", nargs="*", help="modules that must import")
    args = parser.parse_args(argv)
    found = failures(args.modules, args.cuda)
    for line in found:
        print(f"verify_install: FAILED {line}", file=sys.stderr)
    if not found:
        checks = ", ".join(args.modules + (["torch.cuda.is_available()"] if args.cuda else []))
        print(f"verify_install: ok ({checks})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
