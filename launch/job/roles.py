"""Starting and stopping the roles of a run: learner ranks, generator replicas, env-pool actors.

Order matters: the learner binds the weights channel first, the generators subscribe to it, and the env pools
get a policy client over the generators. Each role reserves the Ray resources its config section names, so
scaling is a matter of counts (`learner.num_ranks`, `generator.num_replicas`, `env.num_actors`).
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.run import is_loopback
from configs.schema import RootConfig
from core.curve import RunKeys
from core.rollout import EpisodeLimits
from launch.job.generator_watch import GeneratorWatch

log = logging.getLogger("agentgym.roles")


def advertised(endpoint: str, node_address: str = "") -> str:
    """An endpoint others can connect to: a wildcard bind is advertised under the binding node's address
    (`node_address`, or this process's node)."""
    if "://0.0.0.0:" not in endpoint:
        return endpoint
    import ray

    return endpoint.replace("0.0.0.0", node_address or ray.util.get_node_ip_address())


def resource_asks(cfg: RootConfig, plan: Any = None) -> dict[str, list[tuple[str, float]]]:
    """Per Ray resource ("CPU", "GPU"): (the config keys behind it, amount) for each role, summed over the run's
    placement plan (launch.job.plan; computed from `cfg` when not given), which the roles are started from."""
    from launch.job.plan import placement_plan

    plan = plan if plan is not None else placement_plan(cfg)
    learners, replicas, pools = (plan.of(role) for role in ("learner", "generator", "env_pool"))
    gen_gpus = ("generator.num_replicas * max(generator.num_gpus, generator.tensor_parallel_size)"
                if cfg.generator.device == "cuda" else "generator.num_replicas * generator.num_gpus")
    return {
        "CPU": [("learner.num_ranks * learner.num_cpus_per_rank", sum(r.cpus for r in learners)),
                ("generator.num_replicas * generator.num_cpus", sum(r.cpus for r in replicas)),
                ("env.num_actors * env.num_cpus_per_actor", sum(r.cpus for r in pools))],
        "GPU": [("learner.num_ranks * learner.num_gpus_per_rank", sum(r.gpus for r in learners)),
                (gen_gpus, sum(r.gpus for r in replicas)),
                ("env.num_actors (no GPU)", sum(r.gpus for r in pools))],
    }


def resource_request(cfg: RootConfig, plan: Any = None) -> dict[str, float]:
    """What the whole run asks Ray for, in Ray's resource names: {"CPU": ..., "GPU": ...}. A run fits a node
    (say {"CPU": 96, "GPU": 8}) when every value is at most the node's."""
    return _totals(resource_asks(cfg, plan))


def _totals(asks: dict[str, list[tuple[str, float]]]) -> dict[str, float]:
    return {resource: float(sum(v for _, v in parts)) for resource, parts in asks.items()}


def check_resources(cfg: RootConfig, have: dict[str, float] | None = None,
                    nodes: list[dict[str, float]] | None = None, plan: Any = None) -> None:
    """Refuse, naming the config keys, a run whose roles ask for more CPUs or GPUs than the cluster has (`have`:
    Ray's cluster resources when None), since Ray would otherwise wait forever to place them; and, unless
    transport.allow_insecure, one whose learner ranks fit on no single node (`nodes`: each live node's
    resources; when None, Ray's, or `have` as one node when given): ranks on several nodes rendezvous through a
    store that is not authenticated. `plan`: the run's placement plan, when the caller has it."""
    if nodes is None and have is not None:
        nodes = [have]
    if have is None:
        import ray

        have = ray.cluster_resources()
    asks = resource_asks(cfg, plan)
    for resource, total in _totals(asks).items():
        if total > have.get(resource, 0) + 1e-9:
            detail = ", ".join(f"{k} = {v:g}" for k, v in asks[resource] if v)
            raise SystemExit(f"launch.train: config error: the roles ask for {total:g} {resource} ({detail}) but the "
                             f"Ray cluster has {have.get(resource, 0):g}; lower those counts or add nodes")
    problem = learners_span_nodes(cfg, nodes)
    if problem:
        raise SystemExit(f"launch.train: config error: {problem}")


def learners_span_nodes(cfg: RootConfig, nodes: list[dict[str, float]] | None = None) -> str:
    """Why the learner ranks may not be placed as the config asks ("" when they may): without
    transport.allow_insecure they must all fit on one node (launch.job.learners places them with STRICT_PACK),
    because ranks on several nodes meet at rank 0's rendezvous store (torch's TCPStore) and run gloo or NCCL
    between the nodes, none of it authenticated: whoever reaches that node could read, overwrite and delete the
    store's keys and join the process group."""
    n = cfg.learner.num_ranks
    if n <= 1 or cfg.transport.allow_insecure:
        return ""
    if nodes is None:
        import ray

        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    from launch.job.placement import learner_bundle

    need = {resource: n * amount for resource, amount in learner_bundle(cfg.learner).items()}
    if any(all(node.get(r, 0) + 1e-9 >= v for r, v in need.items()) for node in nodes):
        return ""
    asked = ", ".join(f"{v:g} {r}" for r, v in need.items())
    return (f"the learner ranks (learner.num_ranks = {n}, each learner.num_cpus_per_rank = "
            f"{cfg.learner.num_cpus_per_rank:g} and learner.num_gpus_per_rank = {cfg.learner.num_gpus_per_rank:g}; "
            f"{asked} in all) fit on no single node of this Ray cluster, and ranks on several nodes rendezvous "
            "through a store that is not authenticated (anyone reaching rank 0's node can read, overwrite and "
            "delete its keys) and run gloo or NCCL between the nodes unauthenticated; lower learner.num_ranks or "
            "the per-rank resources to fit one node, or set transport.allow_insecure=true on a trusted cluster "
            "network")


def role_log_dir(cfg: RootConfig) -> str | None:
    """Where each role's output goes (`<output_dir>/logs/`), or None when `logging.verbose` sends it to the
    terminal."""
    if cfg.logging.verbose:
        return None
    return str(Path(cfg.trainer.output_dir).resolve() / "logs")


def transport_keys(cfg: RootConfig) -> RunKeys | None:
    """The run's CURVE keys when its channels need them (transport.auth, see configs.run), made in memory."""
    if not cfg.transport.uses_curve():
        if not is_loopback(cfg.transport.host):
            log.warning("transport.auth=off on %s: anyone who reaches the ports can push trajectories and read "
                        "the model (transport.allow_insecure=true)", cfg.transport.host)
        return None
    from launch.job.generators import replica_names
    from launch.job.pools import pool_names

    return RunKeys.generate(replica_names(cfg.generator.num_replicas) + pool_names(cfg.env.num_actors),
                            cipher=cfg.transport.cipher)


@dataclass
class Roles:
    cfg: RootConfig
    model_dir: Path
    learners: Any
    generators: list
    policy: Any
    pools: Any
    watch: Any = None  # launch.job.generator_watch.GeneratorWatch

    @classmethod
    def start(cls, cfg: RootConfig, model_dir: Path, trajectory_endpoint: str, limits: EpisodeLimits,
              resume_learner: Path | None = None, keys: RunKeys | None = None) -> "Roles":
        """Start every role. `keys`: the run's CURVE keys (core.curve), None when the channels go without.

        Roles load in parallel where they can: on CPU the generator replicas and the env pools are created first
        and load their engines and tokenizers while the learners start; on GPUs the replicas wait for the
        learners (vLLM sizes its KV cache from the memory free when it starts, which a learner starting beside it
        would change), and the env pools load while the replicas do."""
        from launch.job.generators import (connect_generators, launch_generators, ray_name, replica_names,
                                       workers_per_replica)
        from launch.job.learners import LearnerGroup
        from launch.job.pools import PoolSupervisor, pool_names
        from actors.policy_client import PolicyClient

        from launch.job.plan import placement_plan

        log_dir = role_log_dir(cfg)
        plan = placement_plan(cfg, log_dir)  # every role below is started from it
        check_resources(cfg, plan=plan)
        tag = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this start's replicas, by name (PolicyClient)
        t = cfg.transport
        replicas = replica_names(cfg.generator.num_replicas)
        learners, generators, pools = None, [], None

        def launch_rest() -> tuple[Any, Any]:
            launched = launch_generators(model_dir, cfg.generator, dtype=cfg.model.dtype,
                                         max_model_len=cfg.rollout.max_context_tokens, actor_tag=tag,
                                         options={r.name: r.options for r in plan.of("generator")})
            generators.extend(launched)
            policy = PolicyClient(launched, recovery_wait_s=cfg.generator.recovery_wait_s,
                                  names=[ray_name(n, tag) for n in replicas])
            curves = {n: keys.trajectory_client(n) for n in pool_names(cfg.env.num_actors)} if keys else None
            return policy, PoolSupervisor(cfg.env, policy, str(model_dir), limits, trajectory_endpoint,
                                          trajectory_curve=curves,
                                          actor_options={r.name: r.options for r in plan.of("env_pool")})

        try:
            if cfg.generator.device == "cpu":
                policy, pools = launch_rest()
            learners = LearnerGroup(model_dir, cfg.model.dtype, cfg.learner, cfg.algorithm,
                                    sampling_temperature=cfg.rollout.temperature, weights_host=t.host,
                                    weights_port=t.weights_port, weights_chunk_bytes=t.weights_chunk_mb << 20,
                                    weights_curve=keys.weights_server_side(replicas) if keys else None,
                                    weights_subscribers=replicas, weights_stall_timeout_s=t.weights_stall_timeout_s,
                                    log_dir=log_dir, weights_fanout=t.weights_fanout, weights_sync=t.weights_sync,
                                    weights_workers_per_replica=workers_per_replica(cfg.generator),
                                    weights_timeout_s=t.weights_ack_timeout_s, weights_shm=t.weights_shm,
                                    weights_bucket_bytes=t.weights_bucket_mb << 20, plan=plan)
            if pools is None:
                policy, pools = launch_rest()
            if resume_learner is not None:
                learners.load_checkpoint(str(resume_learner))
            endpoint = advertised(learners.weights_endpoint, learners.rank0_address)
            curves = {n: keys.weights_client(n) for n in replicas} if keys else None
            collective = t.weights_sync == "collective"  # a weights group instead of the ZeroMQ channel
            relay_host = t.host if t.weights_fanout == "relay" and not collective else None  # forwarding socket
            connect_generators(generators, cfg.generator, weights_endpoint=endpoint, weights_curve=curves,
                               weights_relay_host=relay_host, weights_sync=t.weights_sync,
                               weights_timeout_s=t.weights_ack_timeout_s, weights_chunk_bytes=t.weights_chunk_mb << 20)
            learners.wait_for_subscribers(len(generators), timeout_s=120)
            watch = GeneratorWatch(generators, endpoint, [curves[n] if curves else None for n in replicas],
                                   cfg.generator.recovery_wait_s, relay_host=relay_host, rejoins=not collective,
                                   names=replicas, chunk_bytes=t.weights_chunk_mb << 20)
            watch.check()
            pools.wait_ready()
        except BaseException:
            cls._stop_parts(learners, generators, pools)
            raise
        return cls(cfg, model_dir, learners, generators, policy, pools, watch)

    def placement(self) -> dict[str, list[str]]:
        """Role -> the node address of each of its actors (written to the run folder as placement.json)."""
        import ray

        def where(actor):
            return actor.__ray_call__.remote(lambda self: ray.util.get_node_ip_address())

        return {role: ray.get([where(a) for a in actors], timeout=60) for role, actors in self._actors().items()}

    def pids(self) -> dict[str, list[int]]:
        """Role -> the process id of each of its actors (pids.json: what an operator or a fault test kills)."""
        import ray

        return {role: ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors], timeout=60)
                for role, actors in self._actors().items()}

    def _actors(self) -> dict[str, list]:
        return {"EnvPool": self.pools.actors, "Generator": self.generators, "Learner": self.learners.actors}

    def stats(self) -> dict[str, float]:
        """Env-pool and generator counters (namespaced), for the step's metrics."""
        import ray

        out: dict[str, float] = {}
        for key, value in self.pools.stats().items():
            out[key if "/" in key else f"env/{key}"] = float(value)
        out["recovery/generator_restarts"] = float(self.watch.restarts)
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

    def health(self) -> str:
        """What broke among the generators ("" when nothing): the coordinator's watchdog asks every few seconds.
        A replica Ray restarted is re-subscribed here (see `needs_republish`)."""
        return self.watch.check()

    def needs_republish(self) -> bool:
        return self.watch.take_republish()

    def down_replicas(self) -> list[str]:
        """The weights-subscriber names of the generator replicas seen down (their acks are not awaited)."""
        return self.watch.down_names()

    def save_policy(self, folder: Path) -> None:
        """The current policy as a Hugging Face folder (what `launch.eval --model` and generators load), written
        by learner rank 0: the driver never holds the weights (at 7B they would be 15 GB of its memory)."""
        self.learners.save_policy(str(folder))

    def stop(self) -> None:
        self._stop_parts(self.learners, self.generators, self.pools)

    @staticmethod
    def _stop_parts(learners, generators, pools) -> None:
        from launch.job.generators import stop_generators

        for what, stop in (("env pools", lambda: pools and pools.shutdown()),
                           ("generators", lambda: generators and stop_generators(generators)),
                           ("learners", lambda: learners and learners.shutdown())):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                log.warning("stopping %s failed: %r", what, exc)
