"""Evaluation: run a split through generators and env pools, then write the report (JSON and Markdown).

Metrics, per env family (also defined in docs/training.md):
- success_rate: the fraction of episodes that solved their task (BabyAI goal reached, TextCraft item crafted,
  SciWorld score 100, Search exact match, WebArena evaluator passed).
- score: the env's own reward summed over the episode, clipped to [0, 1] (BabyAI: 1 - 0.9 * steps/max_steps
  on success; SciWorld: max(final score, 0) / 100; the others: 0 or 1). No format reward is ever added here.
- raw_score: the env's native figure where it has one (SciWorld's final score, -100 to 100), else the score.
- turns: agent turns taken. Terminations: why episodes ended (done, horizon, context_limit, env failures).
With k samples per item, every sample counts as one episode; pass@k is the fraction of items with a success.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from configs.schema import RootConfig
from core.metrics import valid_action_frac
from core.rollout import EpisodeLimits, EpisodeSpec
from core.trajectory import Trajectory
from core.transport import TrajectoryReceiver
from environments.item_sampler import family_items
from environments.registry import get_family

log = logging.getLogger("agentgym.eval")


def eval_specs(cfg: RootConfig, family: str) -> list[EpisodeSpec]:
    items = family_items(family, cfg.env, cfg.eval.split)
    if cfg.eval.limit:
        items = items[: cfg.eval.limit]
    horizon = cfg.eval.max_turns or get_family(family).reference_max_turns
    return [EpisodeSpec(trajectory_id=f"eval-{item}.s{k}", item_id=item, group_id=f"eval-{item}", sample_index=k,
                        horizon=horizon) for item in items for k in range(cfg.eval.samples)]


def eval_turns(cfg: RootConfig) -> int:
    """The most turns the evaluation can take: its episodes times their turn limit."""
    return sum(len(specs) * specs[0].horizon for specs in (eval_specs(cfg, f) for f in cfg.eval.envs) if specs)


def eval_limits(cfg: RootConfig) -> EpisodeLimits:
    return EpisodeLimits(max_tokens_per_turn=cfg.rollout.max_tokens_per_turn,
                         max_context_tokens=cfg.rollout.max_context_tokens, temperature=cfg.eval.temperature,
                         top_p=cfg.rollout.top_p if cfg.eval.temperature > 0 else 1.0, format_reward=0.0,
                         instruction_role=cfg.rollout.instruction_role)


async def run_specs(pools: Any, receiver: TrajectoryReceiver, specs: list[EpisodeSpec],
                    progress: bool = True) -> tuple[list[Trajectory], list[Any]]:
    """Run every spec on the pools; returns the trajectories received and the summaries of lost episodes."""
    from tqdm import tqdm

    bar = tqdm(total=len(specs), desc="eval", unit="episode", disable=not progress)
    wanted = {s.trajectory_id for s in specs}
    got: dict[str, Trajectory] = {}
    lost = []

    async def one(spec: EpisodeSpec) -> None:
        summary = await pools.run(spec)
        if summary.termination == "lost" or not summary.sent:
            lost.append(summary)
        bar.update(1)

    tasks = [asyncio.ensure_future(one(s)) for s in specs]
    deadline = None
    while len(got) + len(lost) < len(specs):
        traj = await asyncio.to_thread(receiver.recv, 200)
        if traj is not None and traj.trajectory_id in wanted:
            got[traj.trajectory_id] = traj
        if all(t.done() for t in tasks):  # every trajectory was sent before its summary came back
            deadline = deadline or time.monotonic() + 10
            if time.monotonic() > deadline:
                log.error("%d trajectories never arrived", len(specs) - len(got) - len(lost))
                break
    await asyncio.gather(*tasks)
    bar.close()
    return [got[s.trajectory_id] for s in specs if s.trajectory_id in got], lost


def _label(family: str, item_id: str) -> str:
    hook = get_family(family).extras.get("item_label")
    return hook(item_id) if hook else family


def summarize(family: str, trajs: list[Trajectory], lost: int = 0) -> dict:
    def row(group: list[Trajectory]) -> dict:
        n = len(group)
        score = [min(1.0, max(0.0, t.metrics.get("env_reward", 0.0))) for t in group]
        raw = [t.metrics.get("score", s) for t, s in zip(group, score)]
        items = collections.defaultdict(list)
        for t in group:
            items[t.item_id].append(t.metrics.get("success", 0.0))
        return {"episodes": n, "success_rate": sum(t.metrics.get("success", 0.0) for t in group) / n,
                "score": sum(score) / n, "raw_score": sum(raw) / n, "turns": sum(t.num_turns for t in group) / n,
                "valid_action_frac": valid_action_frac(group),  # over judged turns; None: none judged
                "pass_at_k": sum(max(v) for v in items.values()) / len(items),
                "terminations": dict(collections.Counter(t.termination.value for t in group))}

    by_label = collections.defaultdict(list)
    for t in trajs:
        by_label[_label(family, t.item_id)].append(t)
    return {"family": family, "lost_episodes": lost, **(row(trajs) if trajs else {"episodes": 0}),
            "breakdown": {k: row(v) for k, v in sorted(by_label.items())}}


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def summary(report: dict) -> str:
    """A few lines for the terminal: success rate and score per family."""
    lines = [f"evaluation ({report['split']} split, {report['samples']} sample(s) per item, temperature "
             f"{report['temperature']}, {report['minutes']:.1f} min):"]
    for fam in report["envs"]:
        if fam["episodes"]:
            lines.append(f"  {fam['family']}: {fam['episodes']} episodes, success rate {fam['success_rate']:.3f}, "
                         f"score {fam['score']:.3f}, valid actions {_fraction(fam['valid_action_frac'])}, "
                         f"lost {fam['lost_episodes']}")
    return "\n".join(lines)


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "eval_report.json"
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True))
    lines = [f"# Evaluation: {report['model']}", "",
             f"split `{report['split']}`, {report['samples']} sample(s) per item, temperature "
             f"{report['temperature']}, {report['minutes']:.1f} min", "",
             "| env | episodes | success rate | score [0,1] | raw score | turns | valid actions | pass@k | lost |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fam in report["envs"]:
        if fam["episodes"]:
            lines.append(f"| {fam['family']} | {fam['episodes']} | {fam['success_rate']:.3f} | {fam['score']:.3f} | "
                         f"{fam['raw_score']:.2f} | {fam['turns']:.1f} | {_fraction(fam['valid_action_frac'])} | "
                         f"{fam['pass_at_k']:.3f} | {fam['lost_episodes']} |")
    for fam in report["envs"]:
        lines += ["", f"## {fam['family']}: by level or task", "",
                  "| group | episodes | success rate | score | turns | terminations |", "|---|---|---|---|---|---|"]
        for label, r in fam["breakdown"].items():
            lines.append(f"| {label} | {r['episodes']} | {r['success_rate']:.3f} | {r['score']:.3f} | "
                         f"{r['turns']:.1f} | {', '.join(f'{k} {v}' for k, v in sorted(r['terminations'].items()))} |")
    for family, reason in report.get("skipped", {}).items():
        lines.append(f"\nSkipped {family}: {reason}.")
    lines += ["", "Metric definitions: see docs/training.md, section Metrics."]
    md_path = out_dir / "eval_report.md"
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def evaluate_with(cfg: RootConfig, roles: Any, out_dir: Path, model_name: str = "",
                  skipped: dict[str, str] | None = None) -> dict:
    """Evaluate `cfg.eval.envs` with the running generators, on fresh env pools with eval limits."""
    from launch.pools import PoolSupervisor

    started = time.monotonic()
    receiver = TrajectoryReceiver(cfg.transport.host, 0, cfg.transport.hwm)
    envs = [e for e in cfg.eval.envs]
    env_cfg = dataclasses.replace(cfg.env, mix={e: 1.0 for e in envs})
    pools = PoolSupervisor(env_cfg, roles.policy, str(roles.model_dir), eval_limits(cfg), receiver.endpoint,
                           name="eval-pool", log_dir=None if cfg.logging.verbose else str(out_dir.resolve() / "logs"))
    try:
        pools.wait_ready()
        results = []
        for family in envs:
            trajs, lost = asyncio.run(run_specs(pools, receiver, eval_specs(cfg, family),
                                                progress=cfg.logging.progress_bar))
            results.append(summarize(family, trajs, lost=len(lost)))
    finally:
        pools.shutdown()
        receiver.close()
    report = {"model": model_name or str(roles.model_dir), "split": cfg.eval.split, "samples": cfg.eval.samples,
              "temperature": cfg.eval.temperature, "minutes": (time.monotonic() - started) / 60, "envs": results,
              "skipped": skipped or {}}
    json_path, md_path = write_report(report, out_dir)
    print(summary(report) + f"\nfull report (by level or task): {md_path}")
    log.info("eval report: %s, %s", json_path, md_path)
    return report
