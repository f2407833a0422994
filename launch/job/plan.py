"""The placement plan: one plain value, computed from the config before anything starts, that says for every role
where it will run and with what; `launch.train --print-placement` prints it, and every role is started from it.

What must hold:
- Each entry is what its actor is started with: its Ray options (CPUs, GPUs, restarts, scheduling), the env vars
  its process gets (GPU isolation, its role log, thread counts), and where Ray may put it (`node`). The learner
  ranks are the bundles of one placement group, whose strategy is the plan's `learner_strategy`.
- `asks()` is what the run asks Ray for: `launch.job.roles.resource_request` and the start-up check count the
  plan, so what is checked, what is printed and what is started cannot drift apart.
- Computing it needs no Ray cluster and no torch (the options come from launch.job.placement and
  launch.job.generators.actor_options): `--print-placement` answers at once, before anything starts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from configs.schema import RootConfig
from launch.job.placement import learner_bundle, pool_actor_options, with_role_log

ROLES = ("learner", "generator", "env_pool")


@dataclass(frozen=True)
class RolePlan:
    """One actor: its role, its name, its Ray options (with its role log), and where it may run."""

    role: str
    name: str
    options: dict[str, Any] = field(repr=False)
    node: str

    @property
    def cpus(self) -> float:
        return float(self.options.get("num_cpus") or 0)

    @property
    def gpus(self) -> float:
        return float(self.options.get("num_gpus") or 0)

    @property
    def env(self) -> dict[str, str]:
        return dict((self.options.get("runtime_env") or {}).get("env_vars") or {})


@dataclass(frozen=True)
class PlacementPlan:
    learner_bundles: list[dict[str, float]]
    learner_strategy: str  # STRICT_PACK: the ranks on one node; PACK (transport.allow_insecure): they may spread
    roles: list[RolePlan]

    def of(self, role: str) -> list[RolePlan]:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        return [r for r in self.roles if r.role == role]

    def asks(self) -> dict[str, float]:
        """What the run asks Ray for: {"CPU": ..., "GPU": ...}."""
        return {"CPU": sum(r.cpus for r in self.roles), "GPU": sum(r.gpus for r in self.roles)}

    def render(self) -> str:
        """The plan as a table a person reads (`launch.train --print-placement`)."""
        rows = [("role", "name", "CPUs", "GPUs", "where", "env")]
        for r in self.roles:
            env = " ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in sorted(r.env.items()))
            rows.append((r.role, r.name, f"{r.cpus:g}", f"{r.gpus:g}", r.node, env))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5] for row in rows]
        asks = self.asks()
        lines.append(f"in all: {asks['CPU']:g} CPUs, {asks['GPU']:g} GPUs; learner ranks: one placement group of "
                     f"{len(self.learner_bundles)} bundle{'s' if len(self.learner_bundles) != 1 else ''}, "
                     f"{self.learner_strategy}")
        return "\n".join(line.rstrip() for line in lines)


def placement_plan(cfg: RootConfig, log_dir: str | None = None) -> PlacementPlan:
    """The plan of a run with config `cfg` (`log_dir`: where each role's output goes, None: the terminal)."""
    from launch.job.generators import replica_launches
    from launch.job.placement import learner_rank_options
    from launch.job.pools import pool_names

    n = cfg.learner.num_ranks
    strategy = "PACK" if cfg.transport.allow_insecure else "STRICT_PACK"
    where = "any node with the other ranks' room" if strategy == "PACK" else "one node, with the other ranks"
    roles = [RolePlan("learner", f"learner-{rank}",
                      with_role_log(learner_rank_options(cfg.learner, rank, "learner", None), log_dir,
                                    f"learner-{rank}"),
                      f"placement group bundle {rank} ({where})") for rank in range(n)]
    for r in replica_launches(cfg.generator):
        roles.append(RolePlan("generator", r.name, with_role_log(r.options, log_dir, r.name), "any node (SPREAD)"))
    pool = pool_actor_options(cfg.env)
    for name in pool_names(cfg.env.num_actors):
        roles.append(RolePlan("env_pool", name, with_role_log(copy.deepcopy(pool), log_dir, name), "any node (SPREAD)"))
    return PlacementPlan([learner_bundle(cfg.learner) for _ in range(n)], strategy, roles)
