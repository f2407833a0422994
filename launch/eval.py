"""Evaluate: `python -m launch.eval --env babyai --split test --model PATH_OR_CHECKPOINT [key=value ...]`.

`--model` takes the default model, a Hugging Face folder, a checkpoint (`.../checkpoints/step_00000030`, whose
`policy/` folder holds the trained weights) or a run's checkpoints folder (its latest complete checkpoint).
`--env all` evaluates every family whose prerequisites are met here (WebArena needs its sites' URLs).
Writes eval_report.json and eval_report.md to `--out` and prints the Markdown.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.env import FAMILIES
from configs.fields import ConfigError
from configs.load import load_config

WEBARENA_SITES = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE")


def model_folder(model: str) -> str:
    """A checkpoint (or a folder of them) -> its saved policy folder; anything else is a model path."""
    from core.checkpoint import CheckpointStore, MARKER

    path = Path(model)
    if (path / MARKER).is_file():
        return str(path / "policy")
    if path.is_dir() and not (path / "config.json").exists():
        latest = CheckpointStore(path).latest_complete()
        if latest is not None:
            return str(latest / "policy")
    return model


def families_for(env: str, own: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The families to run and, for `all`, those skipped with the reason. `own`: the config's env.families."""
    if env != "all":
        names = [e.strip() for e in env.split(",") if e.strip()]
        known = (*FAMILIES, *own)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError("--env", f"unknown env {unknown[0]!r}; expected all or one of {', '.join(known)}")
        return names, {}
    skipped = {"agentgym_http": "needs a running AgentGym env server (env.agentgym_http.url)"}
    if not any(os.environ.get(site) for site in WEBARENA_SITES):
        skipped["webarena"] = f"no WebArena site URL set ({', '.join(WEBARENA_SITES)})"
    return [f for f in FAMILIES if f not in skipped] + list(own), skipped


@dataclass
class EvalRoles:
    model_dir: Path
    generators: list
    policy: Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch.eval", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="babyai", help="a family, a comma list, or all")
    parser.add_argument("--split", default=None, choices=("train", "test"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--samples", type=int, default=None, help="samples per item (k)")
    parser.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    parser.add_argument("--limit", type=int, default=None, help="only the first N items of each split")
    parser.add_argument("--out", default="outputs/eval")
    parser.add_argument("--config", default=None)
    parser.add_argument("--verbose", action="store_true", help="show the roles' own output here, not in <out>/logs/")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    extra = [f"model.path={model_folder(args.model)}"] + (["logging.verbose=true"] if args.verbose else [])
    for key, value in (("eval.split", args.split), ("eval.samples", args.samples),
                       ("eval.temperature", args.temperature), ("eval.limit", args.limit)):
        if value is not None:
            extra.append(f"{key}={value}")
    try:
        own = tuple(load_config(args.config, args.overrides).env.families)
        envs, skipped = families_for(args.env, own)
        cfg = load_config(args.config, [*args.overrides, *extra, f"eval.envs={envs}"])
    except ConfigError as exc:
        print(f"launch.eval: config error: {exc}", file=sys.stderr)
        return 2
    for family, reason in skipped.items():
        print(f"launch.eval: skipping {family}: {reason}", file=sys.stderr)

    from core.models import resolve_model
    from launch.evaluate import evaluate_with
    from launch.generators import start_generators, stop_generators
    from launch.ray_cluster import connect, shutdown
    from actors.policy_client import PolicyClient

    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.namespace, quiet=not cfg.logging.verbose)
    generators = []
    try:
        model_dir = resolve_model(cfg.model.path, cfg.model.cache_dir)
        generators = start_generators(model_dir, cfg.generator, dtype=cfg.model.dtype,
                                      max_model_len=cfg.rollout.max_context_tokens,
                                      log_dir=None if cfg.logging.verbose else str(Path(args.out).resolve() / "logs"))
        roles = EvalRoles(model_dir, generators, PolicyClient(generators))
        evaluate_with(cfg, roles, Path(args.out), model_name=args.model, skipped=skipped)
    finally:
        if generators:
            stop_generators(generators)
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
