"""Evaluate: `python -m launch.eval --env babyai --split test --model PATH_OR_CHECKPOINT [key=value ...]`.

`--model` takes the default model, a Hugging Face folder, a checkpoint (`.../checkpoints/step_00000030`, whose
`policy/` folder holds the trained weights) or a run's checkpoints folder (its latest complete checkpoint).
`--env all` evaluates every family whose prerequisites are met here (WebArena needs its sites' URLs).
`--policy random` evaluates the random baseline alone (no model: a uniform choice among the actions the env
lists); families whose observations list no actions are refused. With `--policy model` (the default) the report
also has, on the same items, the untrained model (`--baseline-model`, by default the base model of the training
run the checkpoint comes from; without either the row is left out with a note) and the random policy, unless
eval.baselines=false. `--items unseen` evaluates unseen seeds of the training levels (eval.item_set); `--split`
alone evaluates that split's items even where the config asks for unseen ones (the default's end-of-run does).
Writes eval_report.json and eval_report.md to `--out` and prints a short summary; every episode's transcript
(each turn's observation, reply, parsed action and reward, and how it ended) goes to `--out`/episodes.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
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


def run_base_model(model: str) -> str:
    """The base model of the training run a checkpoint (or its checkpoints folder) comes from, when the run
    recorded it (`<run>/model.json`); empty otherwise."""
    path = Path(model).resolve()
    for run_dir in (path.parent.parent, path.parent):  # <run>/checkpoints/step_N, or <run>/checkpoints
        record = run_dir / "model.json"
        if (run_dir / "checkpoints").is_dir() and record.is_file():
            return json.loads(record.read_text()).get("base", "")
    return ""


@dataclass
class EvalRoles:
    model_dir: Path
    generators: list
    policy: Any


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch.eval", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="babyai", help="a family, a comma list, or all")
    parser.add_argument("--split", default=None, choices=("train", "test"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--policy", default="model", choices=("model", "random"),
                        help="random: the random baseline alone, no model")
    parser.add_argument("--baseline-model", default=None,
                        help="the untrained model's row (default: the base of the checkpoint's training run)")
    parser.add_argument("--items", default=None, choices=("split", "unseen"), help="eval.item_set")
    parser.add_argument("--samples", type=int, default=None, help="samples per item (k)")
    parser.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    parser.add_argument("--limit", type=int, default=None, help="only the first N items of each split")
    parser.add_argument("--out", default="outputs/eval")
    parser.add_argument("--config", default=None)
    parser.add_argument("--verbose", action="store_true", help="show the roles' own output here, not in <out>/logs/")
    parser.add_argument("overrides", nargs="*")
    return parser


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The eval.* keys the flags given set; `--split` alone also sets eval.item_set=split (the split's items,
    even where the config evaluates unseen ones)."""
    items = args.items or ("split" if args.split else None)
    return [f"{key}={value}" for key, value in (
        ("eval.split", args.split), ("eval.samples", args.samples), ("eval.temperature", args.temperature),
        ("eval.limit", args.limit), ("eval.item_set", items)) if value is not None]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    extra = [f"model.path={model_folder(args.model)}"] + (["logging.verbose=true"] if args.verbose else [])
    extra += flag_overrides(args)
    try:
        own = tuple(load_config(args.config, args.overrides).env.families)
        envs, skipped = families_for(args.env, own)
        cfg = load_config(args.config, [*args.overrides, *extra, f"eval.envs={envs}"])
    except ConfigError as exc:
        print(f"launch.eval: config error: {exc}", file=sys.stderr)
        return 2
    if args.policy == "random":
        from actors.random_policy import random_refusal

        if args.env == "all":  # every family that can: the others are skipped, saying why
            for family in [f for f in envs if random_refusal([f])]:
                envs.remove(family)
                skipped[family] = "its observations list no actions for the random policy"
            cfg = load_config(args.config, [*args.overrides, *extra, f"eval.envs={envs}"])
        refusal = random_refusal(envs)
        if refusal:
            print(f"launch.eval: --policy random: {refusal}", file=sys.stderr)
            return 2
    for family, reason in skipped.items():
        print(f"launch.eval: skipping {family}: {reason}", file=sys.stderr)

    from launch.job.ray_cluster import connect, shutdown

    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.namespace, quiet=not cfg.logging.verbose,
            allow_insecure=cfg.transport.allow_insecure)
    try:
        if args.policy == "random":
            evaluate_random(cfg, Path(args.out), skipped)
        else:
            base = args.baseline_model if args.baseline_model is not None else run_base_model(args.model)
            evaluate_model(cfg, args, Path(args.out), skipped, base)
    finally:
        shutdown()
    return 0


def evaluate_random(cfg: Any, out: Path, skipped: dict[str, str]) -> None:
    import time

    from core.models import resolve_model
    from launch.eval.runner import RANDOM_DESCRIPTION, finish_report, random_rows

    started = time.monotonic()
    tokenizer_dir = resolve_model(cfg.model.path, cfg.model.cache_dir)  # renders the chat; nothing is sampled
    rows, notes = random_rows(cfg, str(tokenizer_dir), out)
    finish_report(cfg, {"random": rows}, {"random": RANDOM_DESCRIPTION}, out, started, skipped, notes)


def _with_generators(cfg: Any, model: str, out: Path, work) -> Any:
    """Start generators serving `model`, call `work(roles)`, stop them."""
    from actors.policy_client import PolicyClient
    from core.models import resolve_model
    from launch.job.generators import ray_name, replica_names, start_generators, stop_generators

    generators, tag = [], f"eval-{uuid.uuid4().hex[:8]}"  # named replicas travel to the env pools by name
    try:
        model_dir = resolve_model(model, cfg.model.cache_dir)
        generators = start_generators(model_dir, cfg.generator, dtype=cfg.model.dtype,
                                      max_model_len=cfg.rollout.max_context_tokens, actor_tag=tag,
                                      log_dir=None if cfg.logging.verbose else str(out.resolve() / "logs"))
        names = [ray_name(n, tag) for n in replica_names(len(generators))]
        return work(EvalRoles(model_dir, generators, PolicyClient(generators, names=names)))
    finally:
        if generators:
            stop_generators(generators)


def evaluate_model(cfg: Any, args: argparse.Namespace, out: Path, skipped: dict[str, str], base: str) -> None:
    """The untrained model's rows first, then the model's and the random policy's. One engine serves both
    where the two folders hold the same architecture: it starts on the base weights, then loads the trained
    ones in place (an engine start is the larger part of a small evaluation); else each gets its own."""
    import ray

    from core.models import resolve_model, same_architecture
    from launch.eval.runner import eval_limits, evaluate_rows, evaluate_with

    notes: list[str] = []
    if not cfg.eval.baselines:
        base = ""
    elif not base:
        notes.append("no untrained row: the base model is not known (give --baseline-model PATH)")
    elif Path(model_folder(base)).resolve() == Path(cfg.model.path).resolve() or base == cfg.model.path:
        notes.append("no untrained row: the model evaluated is the base model itself")
        base = ""

    def trained(roles: EvalRoles, untrained: Any = None) -> None:
        evaluate_with(cfg, roles, out, model_name=args.model, skipped=skipped, untrained=untrained,
                      untrained_name=base, notes=notes)

    def untrained_rows(roles: EvalRoles) -> Any:
        return evaluate_rows(cfg, roles.policy, str(roles.model_dir), out, list(cfg.eval.envs), eval_limits(cfg),
                             row="untrained")

    if not base:
        _with_generators(cfg, cfg.model.path, out, trained)
        return
    base_dir, model_dir = model_folder(base), resolve_model(cfg.model.path, cfg.model.cache_dir)
    if not same_architecture(resolve_model(base_dir, cfg.model.cache_dir), model_dir):
        untrained = _with_generators(cfg, base_dir, out, untrained_rows)
        _with_generators(cfg, cfg.model.path, out, lambda roles: trained(roles, untrained))
        return

    def both(roles: EvalRoles) -> None:
        untrained = untrained_rows(roles)
        ray.get([g.load_folder.remote(str(model_dir), 1) for g in roles.generators])
        trained(EvalRoles(Path(model_dir), roles.generators, roles.policy), untrained)

    _with_generators(cfg, base_dir, out, both)

