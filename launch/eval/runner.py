"""Evaluation: run the eval items through env pools with a policy, then write the report (launch/eval/report.py).

The same items (`eval_specs`) are run for each policy in the report: the model, the untrained model (given by
the caller: a training run evaluates its base weights before its first step, launch.eval starts generators for
the base model) and the random policy (actors/random_policy.py: no model, cheap), the last two when
`eval.baselines` is on. The random policy is left out, with a note, for families that list no actions.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from configs.schema import RootConfig
from core.rollout import EpisodeLimits, EpisodeSpec
from core.trajectory import Trajectory
from core.transport import TrajectoryReceiver
from environments.item_sampler import family_items
from environments.registry import get_family
from environments.unseen import unseen_items
from launch.job.episodes import records_of, report_examples, write_eval_episodes
from launch.eval.report import summarize, summary, write_report

log = logging.getLogger("agentgym.eval")

RANDOM_MIN_TOKENS_PER_TURN = 64  # the random policy's replies are never cut by a short per-turn limit


def eval_items(cfg: RootConfig, family: str) -> list[str]:
    """The items evaluated: eval.split's (its first eval.limit) or, for eval.item_set=unseen, ids in no split."""
    if cfg.eval.item_set == "unseen":
        return unseen_items(family, cfg.env, cfg.eval.limit)
    items = family_items(family, cfg.env, cfg.eval.split)
    return items[: cfg.eval.limit] if cfg.eval.limit else items


def items_description(cfg: RootConfig) -> str:
    if cfg.eval.item_set == "unseen":
        return "unseen items (ids in no train or test split, of the run's levels)"
    return f"split `{cfg.eval.split}`" + (f" (at most its first {cfg.eval.limit} items)" if cfg.eval.limit else "")


def eval_specs(cfg: RootConfig, family: str) -> list[EpisodeSpec]:
    items = eval_items(cfg, family)
    horizon = cfg.eval.max_turns or get_family(family).reference_max_turns
    return [EpisodeSpec(trajectory_id=f"eval-{item}.s{k}", item_id=item, group_id=f"eval-{item}", sample_index=k,
                        horizon=horizon) for item in items for k in range(cfg.eval.samples)]


def eval_turns(cfg: RootConfig) -> int:
    """The most turns the evaluation can take: its episodes times their turn limit."""
    return sum(len(specs) * specs[0].horizon for specs in (eval_specs(cfg, f) for f in cfg.eval.envs) if specs)


def end_evaluations(cfg: RootConfig) -> list[tuple[RootConfig, str]]:
    """The evaluations a training run makes at its end, each as (its config, its folder in the run): at
    eval.max_turns into `eval/`, and at eval.long_max_turns (when set) into `eval-<N>-turns/`, on the same items."""
    runs = [(cfg, "eval")]
    if cfg.eval.long_max_turns:
        long = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, max_turns=cfg.eval.long_max_turns))
        runs.append((long, f"eval-{cfg.eval.long_max_turns}-turns"))
    return runs


def eval_limits(cfg: RootConfig, random_policy: bool = False) -> EpisodeLimits:
    tokens = cfg.rollout.max_tokens_per_turn
    return EpisodeLimits(max_tokens_per_turn=max(tokens, RANDOM_MIN_TOKENS_PER_TURN) if random_policy else tokens,
                         max_context_tokens=cfg.rollout.max_context_tokens, temperature=cfg.eval.temperature,
                         top_p=cfg.rollout.top_p if cfg.eval.temperature > 0 else 1.0, format_reward=0.0,
                         instruction_role=cfg.rollout.instruction_role,
                         resample_repeats=0 if random_policy else cfg.eval.resample_repeats,
                         resample_temperature=cfg.eval.resample_temperature)


def measured_on(cfg: RootConfig) -> dict:
    """What an evaluation's rows were measured on: its episodes and its limits, the limits by field name."""
    return {"episodes": {f: [dataclasses.astuple(s) for s in eval_specs(cfg, f)] for f in cfg.eval.envs},
            "limits": dataclasses.asdict(eval_limits(cfg))}


def same_measure(saved: Any, now: dict) -> bool:
    """Whether rows saved with record `saved` were measured as `now` would measure them. A limit the saved record
    lacks counts as its field's default, so a field added later, at a default that keeps the old behaviour, leaves
    the saved rows valid; an older record's limits, a positional list of as many fields as now, are read by name."""
    if not isinstance(saved, dict) or set(saved) != {"episodes", "limits"}:
        return False
    now = json.loads(json.dumps(now))  # as saved: tuples become lists
    limits = saved["limits"]
    if isinstance(limits, list) and len(limits) == len(now["limits"]):
        limits = dict(zip(now["limits"], limits))
    if not isinstance(limits, dict) or not set(limits) <= set(now["limits"]):
        return False
    defaults = {f.name: f.default for f in dataclasses.fields(EpisodeLimits)}
    return saved["episodes"] == now["episodes"] and all(
        limits.get(name, defaults[name]) == value for name, value in now["limits"].items())


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


def evaluate_rows(cfg: RootConfig, policy: Any, tokenizer_dir: str, out_dir: Path, families: list[str],
                  limits: EpisodeLimits, name: str = "eval-pool", row: str = "model") -> list[dict]:
    """Each family's figures for `policy` on the eval items, run on fresh env pools. Its episodes go to
    `<out_dir>/episodes.jsonl` as the report's row `row` (launch/job/episodes.py), and each family's figures carry
    one success and one failure per level (`examples`) for the report."""
    from launch.job.pools import PoolSupervisor

    receiver = TrajectoryReceiver(cfg.transport.host, 0, cfg.transport.hwm, same_node=cfg.transport.same_node)
    env_cfg = dataclasses.replace(cfg.env, mix={e: 1.0 for e in families})
    pools = PoolSupervisor(env_cfg, policy, tokenizer_dir, limits, receiver.endpoints, name=name,
                           log_dir=None if cfg.logging.verbose else str(out_dir.resolve() / "logs"))
    try:
        pools.wait_ready()

        async def every_family() -> list[dict]:  # one event loop for all: the supervisor's calls live on it
            results = []
            for family in families:
                specs = eval_specs(cfg, family)
                trajs, lost = await run_specs(pools, receiver, specs, progress=cfg.logging.progress_bar)
                results.append(summarize(family, trajs, lost=len(lost)))
                if specs:
                    records = records_of(trajs, tokenizer_dir, row)
                    write_eval_episodes(out_dir, records, row, family, specs[0].horizon)
                    results[-1]["examples"] = report_examples(records)
            return results

        results = asyncio.run(every_family())
    finally:
        pools.shutdown()
        receiver.close()
    return results


def random_rows(cfg: RootConfig, tokenizer_dir: str, out_dir: Path) -> tuple[list[dict], list[str]]:
    """The random policy's figures for the families that list their actions, and a note for those that do not."""
    from actors.random_policy import HOOK, RandomPolicy

    families = [f for f in cfg.eval.envs if HOOK in get_family(f).extras]
    notes = [f"no random row for {f}: its observations list no actions" for f in cfg.eval.envs if f not in families]
    if not families:
        return [], notes
    policy = RandomPolicy(tokenizer_dir, cfg.env, seed=cfg.trainer.seed)
    return evaluate_rows(cfg, policy, tokenizer_dir, out_dir, families, eval_limits(cfg, random_policy=True),
                         name="eval-random-pool", row="random"), notes


RANDOM_DESCRIPTION = "a uniform choice among the actions the env lists, seeded by item, sample and turn"


def finish_report(cfg: RootConfig, rows: dict[str, list[dict]], policies: dict[str, str], out_dir: Path,
                  started: float, skipped: dict[str, str] | None = None, notes: list[str] | None = None) -> dict:
    """Assemble, write and print the report of `rows` (row name -> each family's figures)."""
    report = {"model": policies.get("model") or "random policy", "split": cfg.eval.split,
              "item_set": cfg.eval.item_set, "items": items_description(cfg), "samples": cfg.eval.samples,
              "temperature": cfg.eval.temperature, "resample_repeats": cfg.eval.resample_repeats,
              "resample_temperature": cfg.eval.resample_temperature,
              "minutes": (time.monotonic() - started) / 60, "rows": rows,
              "policies": policies, "notes": list(notes or []), "skipped": skipped or {}}
    json_path, md_path = write_report(report, out_dir)
    print(summary(report) + f"\nfull report (by level or task): {md_path}")
    log.info("eval report: %s, %s", json_path, md_path)
    return report


def evaluate_with(cfg: RootConfig, roles: Any, out_dir: Path, model_name: str = "",
                  skipped: dict[str, str] | None = None, untrained: list[dict] | None = None,
                  untrained_name: str = "", notes: list[str] | None = None) -> dict:
    """Evaluate `cfg.eval.envs` with the running generators, then (eval.baselines) the random policy; `untrained`:
    the base model's figures on the same items, measured by the caller (None: no row, say why in `notes`)."""
    started = time.monotonic()
    notes = list(notes or [])
    policies = {"model": model_name or str(roles.model_dir)}
    rows = {"model": evaluate_rows(cfg, roles.policy, str(roles.model_dir), out_dir, list(cfg.eval.envs),
                                   eval_limits(cfg))}
    if untrained is not None:
        rows["untrained"], policies["untrained"] = untrained, untrained_name or "the base model"
    if cfg.eval.baselines:
        rows["random"], random_notes = random_rows(cfg, str(roles.model_dir), out_dir)
        policies["random"] = RANDOM_DESCRIPTION
        notes += random_notes
    return finish_report(cfg, rows, policies, out_dir, started, skipped, notes)
