"""What each role asks Ray for, and which GPUs its process may see.

What must hold:
- A role that asks Ray for no GPU sees none: its actor options carry `CUDA_VISIBLE_DEVICES=""` in the runtime
  env (merged with the env vars already there). Ray sets that variable only for actors it gives GPUs to and
  leaves it as the node had it otherwise, so without this a CPU learner rank would find CUDA (DeepSpeed then
  moves its module to cuda:0 while the rank runs gloo on CPU inputs) and a cpu generator on a CUDA install
  would load onto a GPU nobody reserved.
- A role that gets GPUs sees exactly the ones Ray gave it (Ray sets CUDA_VISIBLE_DEVICES to them) and uses the
  first of those as cuda:0. Nothing here sets the variable for such a role; `visibility_problem`, run inside
  an actor, says when its environment disagrees with what Ray assigned (e.g. a cluster started with
  RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES, where every rank would pick the same device).
- The learner's options come from `learner_bundle` and `learner_rank_options`, the env pools' from
  `pool_actor_options`; `launch.job.roles.resource_request` counts the same numbers, so the start-up check and
  what Ray is asked for cannot drift apart.

This module imports neither Ray nor torch at import time: the start-up check runs before either is needed.
"""
from __future__ import annotations

import copy
import os
from typing import Any

from configs.env import EnvConfig
from configs.learner import LearnerConfig
from core.role_log import ROLE_LOG

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MIN_BUNDLE_CPUS = 0.01  # a placement-group bundle may not be empty


def isolate_gpus(options: dict[str, Any]) -> dict[str, Any]:
    """A copy of Ray actor `options` that hides every GPU from an actor asking for none (`num_gpus` 0 or
    absent), keeping the runtime env's other fields and env vars. An actor given GPUs must not set the
    variable itself: Ray's assignment is the one that holds."""
    out = copy.deepcopy(options)
    runtime_env = dict(out.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    if float(out.get("num_gpus") or 0) > 0:
        if VISIBLE_DEVICES in env_vars:
            raise ValueError(f"runtime_env.env_vars.{VISIBLE_DEVICES}: an actor given GPUs sees the ones Ray "
                             f"assigned it; do not set {VISIBLE_DEVICES} for it")
        return out
    env_vars[VISIBLE_DEVICES] = ""
    runtime_env["env_vars"] = env_vars
    out["runtime_env"] = runtime_env
    return out


def with_role_log(options: dict[str, Any], log_dir: str | None, name: str) -> dict[str, Any]:
    """A copy of actor `options` whose process writes its output to `<log_dir>/<name>.log` (core.role_log);
    `log_dir` None or "": unchanged (the output goes to the driver's terminal, as with `--verbose`)."""
    if not log_dir:
        return options
    out = copy.deepcopy(options)
    runtime_env = dict(out.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), ROLE_LOG: os.path.join(log_dir, f"{name}.log")}
    out["runtime_env"] = runtime_env
    return out


def learner_bundle(cfg: LearnerConfig) -> dict[str, float]:
    """The placement-group bundle of one learner rank."""
    bundle = {"CPU": max(cfg.num_cpus_per_rank, MIN_BUNDLE_CPUS)}
    if cfg.num_gpus_per_rank:
        bundle["GPU"] = float(cfg.num_gpus_per_rank)
    return bundle


def learner_rank_options(cfg: LearnerConfig, rank: int, name: str,
                         scheduling_strategy: Any) -> dict[str, Any]:
    """Ray options of learner rank `rank`: its bundle's resources, placed by `scheduling_strategy` (the
    placement group's bundle `rank`)."""
    bundle = learner_bundle(cfg)
    options = {"num_cpus": bundle["CPU"], "num_gpus": bundle.get("GPU", 0.0), "name": f"{name}-{rank}",
               "scheduling_strategy": scheduling_strategy}
    if cfg.cpu_omp_wait_policy and not cfg.num_gpus_per_rank:  # read when the rank's process loads OpenMP
        options["runtime_env"] = {"env_vars": {"OMP_WAIT_POLICY": cfg.cpu_omp_wait_policy}}
    return isolate_gpus(options)


def pool_actor_options(cfg: EnvConfig) -> dict[str, Any]:
    """Ray options of every env-pool actor. Restarts are Ray's (`env.max_actor_restarts`); a call is never
    retried (an episode is not idempotent). SPREAD: env throughput scales with nodes."""
    return isolate_gpus({"num_cpus": cfg.num_cpus_per_actor, "num_gpus": 0,
                         "max_restarts": cfg.max_actor_restarts, "max_task_retries": 0,
                         "scheduling_strategy": "SPREAD"})


def visibility_problem(requested_gpus: float) -> str:
    """Run inside an actor: "" when this process sees exactly the GPUs Ray assigned it (none when it asked for
    none), else what is wrong."""
    import ray

    seen = os.environ.get(VISIBLE_DEVICES)
    if not requested_gpus:
        if seen != "":
            return f"{VISIBLE_DEVICES}={seen!r} in an actor that asked for no GPU (expected '')"
        return ""
    assigned = ",".join(str(i) for i in ray.get_gpu_ids())
    if seen != assigned:
        return (f"{VISIBLE_DEVICES}={seen!r} but Ray assigned GPUs {assigned!r} (is "
                f"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES set on the cluster?)")
    return ""
