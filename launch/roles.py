"""Starting and stopping the roles of a run: learner ranks, generator replicas, env-pool actors.

Order matters: the learner binds the weights channel first, the generators subscribe to it, and the env pools
get a policy client over the generators. Each role reserves the Ray resources its config section names, so
scaling is a matter of counts (`learner.num_ranks`, `generator.num_replicas`, `env.num_actors`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.schema import RootConfig
from core.rollout import EpisodeLimits

log = logging.getLogger("agentgym.roles")


def advertised(endpoint: str, node_address: str = "") -> str:
    """An endpoint others can connect to: a wildcard bind is advertised under the binding node's address
    (`node_address`, or this process's node)."""
    if "://0.0.0.0:" not in endpoint:
        return endpoint
    import ray

    return endpoint.replace("0.0.0.0", node_address or ray.util.get_node_ip_address())


def check_resources(cfg: RootConfig, have: dict[str, float] | None = None) -> None:
    """Refuse, naming the config keys, a run whose roles ask for more CPUs or GPUs than the cluster has (`have`:
    Ray's cluster resources when None), since Ray would otherwise wait forever to place them."""
    if have is None:
        import ray

        have = ray.cluster_resources()
    asks = {
        "CPU": [("learner.num_ranks * learner.num_cpus_per_rank", cfg.learner.num_ranks * cfg.learner.num_cpus_per_rank),
                ("generator.num_replicas * generator.num_cpus", cfg.generator.num_replicas * cfg.generator.num_cpus),
                ("env.num_actors * env.num_cpus_per_actor", cfg.env.num_actors * cfg.env.num_cpus_per_actor)],
        "GPU": [("learner.num_ranks * learner.num_gpus_per_rank", cfg.learner.num_ranks * cfg.learner.num_gpus_per_rank),
                ("generator.num_replicas * generator.num_gpus", cfg.generator.num_replicas * cfg.generator.num_gpus)],
    }
    for resource, parts in asks.items():
        total = sum(v for _, v in parts)
        if total > have.get(resource, 0) + 1e-9:
            detail = ", ".join(f"{k} = {v:g}" for k, v in parts if v)
            raise SystemExit(f"launch.train: config error: the roles ask for {total:g} {resource} ({detail}) but the "
                             f"Ray cluster has {have.get(resource, 0):g}; lower those counts or add nodes")


@dataclass
class Roles:
    cfg: RootConfig
    model_dir: Path
    learners: Any
    generators: list
    policy: Any
    pools: Any

    @classmethod
    def start(cls, cfg: RootConfig, trajectory_endpoint: str, limits: EpisodeLimits,
              resume_learner: Path | None = None) -> "Roles":
        from core.models import resolve_model
        from launch.generators import start_generators
        from launch.learners import LearnerGroup
        from launch.pools import PoolSupervisor
        from actors.policy_client import PolicyClient

        check_resources(cfg)
        model_dir = resolve_model(cfg.model.path, cfg.model.cache_dir)
        learners = LearnerGroup(model_dir, cfg.model.dtype, cfg.learner, cfg.algorithm,
                                sampling_temperature=cfg.rollout.temperature, weights_host=cfg.transport.host,
                                weights_port=cfg.transport.weights_port,
                                weights_chunk_bytes=cfg.transport.weights_chunk_mb << 20)
        generators, pools = [], None
        try:
            if resume_learner is not None:
                learners.load_checkpoint(str(resume_learner))
            generators = start_generators(model_dir, cfg.generator, dtype=cfg.model.dtype,
                                          max_model_len=cfg.rollout.max_context_tokens,
                                          weights_endpoint=advertised(learners.weights_endpoint,
                                                                     learners.rank0_address))
            learners.wait_for_subscribers(len(generators), timeout_s=120)
            policy = PolicyClient(generators)
            pools = PoolSupervisor(cfg.env, policy, str(model_dir), limits, trajectory_endpoint)
            pools.wait_ready()
        except BaseException:
            cls._stop_parts(learners, generators, pools)
            raise
        return cls(cfg, model_dir, learners, generators, policy, pools)

    def placement(self) -> dict[str, list[str]]:
        """Role -> the node address of each of its actors (written to the run folder as placement.json)."""
        import ray

        def where(actor):
            return actor.__ray_call__.remote(lambda self: ray.util.get_node_ip_address())

        roles = {"EnvPool": self.pools.actors, "Generator": self.generators, "Learner": self.learners.actors}
        return {role: ray.get([where(a) for a in actors], timeout=60) for role, actors in roles.items()}

    def stats(self) -> dict[str, float]:
        """Env-pool and generator counters (namespaced), for the step's metrics."""
        import ray

        out: dict[str, float] = {}
        for key, value in self.pools.stats().items():
            out[key if "/" in key else f"env/{key}"] = float(value)
        for i, handle in enumerate(self.generators):
            try:
                stats = ray.get(handle.get_stats.remote(), timeout=10)
            except Exception as exc:
                log.warning("generator %d stats unavailable: %r", i, exc)
                continue
            for key, value in stats.items():
                if isinstance(value, (int, float)):
                    out[f"perf/generator{i}/{key}"] = float(value)
        return out

    def save_policy(self, folder: Path) -> None:
        """The current policy as a Hugging Face folder (what `launch.eval --model` and generators load)."""
        from core.models import save_policy_folder

        save_policy_folder(self.learners.gather_weights(), self.model_dir, folder)

    def wandb_sink(self, out: Path, run_id: str):
        if self.cfg.logging.wandb_mode == "disabled":
            return None
        from launch.run import config_record
        from launch.wandb_sink import WandbSink

        return WandbSink(self.cfg.logging.wandb_mode, self.cfg.logging.project, self.cfg.logging.run_name, out,
                         config_record(self.cfg), run_id=run_id or None)

    def stop(self) -> None:
        self._stop_parts(self.learners, self.generators, self.pools)

    @staticmethod
    def _stop_parts(learners, generators, pools) -> None:
        from launch.generators import stop_generators

        for what, stop in (("env pools", lambda: pools and pools.shutdown()),
                           ("generators", lambda: generators and stop_generators(generators)),
                           ("learners", lambda: learners and learners.shutdown())):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                log.warning("stopping %s failed: %r", what, exc)
