"""Serve one of our env families over AgentGym's env-server protocol:
`python -m launch.env_server --env babyai --port 36001 [--host 127.0.0.1] [--max-envs N] [--config X.yaml]
[key=value ...]`.

AgentGym's clients (and env.agentgym_http) can then use it like the reference's servers. It binds to loopback
unless --host says otherwise; the env options come from the `env` section of the config.
"""
from __future__ import annotations

import argparse
import logging
import sys

from configs.env import FAMILIES
from configs.fields import ConfigError
from configs.load import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch.env_server", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, choices=[f for f in FAMILIES if f != "agentgym_http"])
    parser.add_argument("--port", type=int, default=36001)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--config", default=None, help="YAML recipe for the env options")
    parser.add_argument("--max-envs", type=int, default=None,
                        help="envs held at once; /create past it answers 429 (default: sized to this machine's "
                             "memory, about 512 MiB per SciWorld env and 64 MiB per other env)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.babyai.parse_mode=strict")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"launch.env_server: config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from aiohttp import web

    from environments.agentgym_http import make_server

    if args.max_envs is not None and args.max_envs < 1:
        print("launch.env_server: --max-envs must be >= 1", file=sys.stderr)
        return 2
    server = make_server(args.env, cfg.env, max_envs=args.max_envs)
    print(f"serving {args.env} on http://{args.host}:{args.port} (at most {server.max_envs} envs)", flush=True)
    web.run_app(server.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
