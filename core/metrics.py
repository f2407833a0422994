"""Metric names and the rollout summary of a batch of trajectories.

Namespaces: `rollout/` (what the episodes did), `train/` (the learner), `env/<family>/` (per env family),
`perf/` (throughput and idle time of each role), `staleness/` (policy lag of what was trained).

Definitions (printed in docs/training.md too):
- reward: the sum of a trajectory's turn rewards, shaping included (the format reward, when enabled).
- env_reward: the env's own reward only.
- success: 1 if the episode ended with the task solved (BabyAI: goal reached; TextCraft: item crafted;
  SciWorld: score 100; Search: exact match; WebArena: evaluator passed), else 0.
- valid_action_frac: of the agent turns the env judged, the fraction whose reply held an action the env
  accepted. A turn is judged when the env could tell (an AgentGym server that gives no verdict cannot); absent
  when no turn of the batch was judged. judged_turn_frac: the fraction of turns that were judged.
- staleness: learner version at training minus the oldest policy version among a trajectory's sampled tokens.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

from core.trajectory import Termination, Trajectory


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per logged step, appended to a file (the plot and the tests read it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def valid_action_frac(trajectories: Iterable[Trajectory]) -> float | None:
    """Accepted actions over judged turns (turns whose validity the env reported); None when none was judged.
    A record without `judged_turns` (written before verdicts could be unknown) counts every turn as judged."""
    trajs = list(trajectories)
    judged = sum(t.metrics.get("judged_turns", float(t.num_turns)) for t in trajs)
    if judged <= 0:
        return None
    return sum(t.metrics.get("valid_actions", 0.0) for t in trajs) / judged


def rollout_metrics(trajectories: Iterable[Trajectory], version: int | None = None) -> dict[str, float]:
    """Summary of the episodes in one train batch (or any set of finished episodes)."""
    trajs = list(trajectories)
    out: dict[str, float] = {}
    if not trajs:
        return out
    turns = sum(t.num_turns for t in trajs)
    out["rollout/episodes"] = float(len(trajs))
    out["rollout/reward_mean"] = _mean([t.total_reward for t in trajs])
    out["rollout/env_reward_mean"] = _mean([t.metrics.get("env_reward", t.total_reward) for t in trajs])
    out["rollout/success_rate"] = _mean([t.metrics.get("success", 0.0) for t in trajs])
    valid_frac = valid_action_frac(trajs)
    if valid_frac is not None:
        out["rollout/valid_action_frac"] = valid_frac
    out["rollout/judged_turn_frac"] = sum(t.metrics.get("judged_turns", float(t.num_turns)) for t in trajs) \
        / max(1, turns)
    out["rollout/turns_mean"] = turns / len(trajs)
    # replies already given to the same observation in the episode: loops on an action that changed nothing
    out["rollout/repeated_turn_frac"] = sum(t.metrics.get("repeated_turns", 0.0) for t in trajs) / max(1, turns)
    # accepted actions the env says changed nothing (e.g. BabyAI's `check available actions`): the format
    # reward does not pay them unless rollout.format_reward_no_ops
    out["rollout/no_op_turn_frac"] = sum(t.metrics.get("no_op_turns", 0.0) for t in trajs) / max(1, turns)
    # accepted actions that took the world back to a state the episode was already in (a pickup/drop loop):
    # unpaid when rollout.format_reward_revisits is off
    out["rollout/revisit_turn_frac"] = sum(t.metrics.get("revisit_turns", 0.0) for t in trajs) / max(1, turns)
    out["rollout/tokens_mean"] = _mean([t.num_tokens for t in trajs])
    out["rollout/gen_tokens_mean"] = _mean([t.metrics.get("gen_tokens", 0.0) for t in trajs])
    out["rollout/horizon"] = float(max(t.horizon for t in trajs))
    reasons = collections.Counter(t.termination for t in trajs)
    for reason in Termination:
        out[f"rollout/termination/{reason.value}"] = reasons.get(reason, 0) / len(trajs)
    by_env: dict[str, list[Trajectory]] = collections.defaultdict(list)
    for t in trajs:
        by_env[t.env].append(t)
    for env, group in by_env.items():
        out[f"env/{env}/success_rate"] = _mean([t.metrics.get("success", 0.0) for t in group])
        out[f"env/{env}/reward_mean"] = _mean([t.total_reward for t in group])
        out[f"env/{env}/episodes"] = float(len(group))
    if version is not None:
        lags = [version - t.oldest_version() for t in trajs if t.oldest_version() >= 0]
        if lags:
            out["staleness/mean"] = _mean(lags)
            out["staleness/max"] = float(max(lags))
            for lag, count in collections.Counter(lags).items():
                out[f"staleness/hist/{lag}"] = count / len(lags)
    return out
