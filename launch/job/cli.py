"""Command-line handling shared by the entry points: --config, --print-config, --print-placement, --explain and
overrides.

Config problems exit with code 2 and one line naming the key, before torch, Ray or vLLM is imported. Settings
that load but are almost surely not meant (configs.load.config_warnings) are logged as warnings, naming the key.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from configs.fields import ConfigError
from configs.load import config_warnings, explain, load_config, to_yaml
from configs.schema import RootConfig

log = logging.getLogger("agentgym.config")


def parse(argv: Sequence[str] | None, prog: str, description: str) -> tuple[RootConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", default=None, help="YAML recipe (default: configs/default.yaml)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--explain", action="store_true", help="list every config key with its meaning and exit")
    parser.add_argument("--print-placement", action="store_true",
                        help="print where every role will run (CPUs, GPUs, env, node) and exit")
    parser.add_argument("--verbose", action="store_true",
                        help="show every role's own output (vLLM, Ray, DeepSpeed) here instead of <output_dir>/logs/")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.num_actors=4")
    args = parser.parse_args(argv)
    if args.verbose:
        args.overrides = [*args.overrides, "logging.verbose=true"]
    if args.explain:
        for key, default, doc in explain():
            print(f"{key} = {default}\n    {doc}")
        raise SystemExit(0)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for key, why in config_warnings(cfg):
        log.warning("%s: config warning: %s: %s", prog, key, why)
    if args.print_config:
        print(to_yaml(cfg), end="")
        raise SystemExit(0)
    if args.print_placement:
        from launch.job.plan import placement_plan
        from launch.job.roles import role_log_dir

        print(placement_plan(cfg, role_log_dir(cfg)).render())
        raise SystemExit(0)
    return cfg, args
