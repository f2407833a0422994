"""Generator replicas as Ray actors, placed from config (actors.policy_client.PolicyClient routes over them).

    handles = start_generators(model_dir, cfg.generator, dtype=cfg.model.dtype,
                               max_model_len=cfg.rollout.max_context_tokens, weights_endpoint=endpoint)
    policy = PolicyClient(handles)   # give it to env-pool actors

Placement: one actor per replica, each reserving `generator.num_cpus` CPUs and, on cuda, `num_gpus` GPUs
(at least `tensor_parallel_size`: vLLM's tensor-parallel workers use the GPUs Ray gives the actor). Replicas
are spread over nodes where Ray can. An async actor with a high `max_concurrency` lets every episode's request
wait inside the engine at once: that is what continuous batching needs.

Env of each actor: the repository root on PYTHONPATH (vLLM's engine process imports
`actors.weights.vllm_worker` for the weight loader), OMP_NUM_THREADS matching its CPUs (Ray sets 1 otherwise), and
no visible GPU when it asks Ray for none (launch.job.placement), so a cpu replica on a CUDA install stays on CPU.

Seeds: replica i samples with `generator.seed + i` (`replica_launches`); with one seed, fresh replicas would
draw the same samples for the same prompt, and a GRPO group spread over them would collapse to one answer.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.generator import Generator
from configs.generation import GeneratorConfig
from core.curve import CurveClient
from launch.job.placement import isolate_gpus, visibility_problem, with_role_log

REPO_ROOT = Path(__file__).resolve().parents[2]


def actor_options(cfg: GeneratorConfig) -> dict:
    """Ray options of one replica (what `launch.job.roles.resource_request` counts)."""
    gpus = cfg.num_gpus
    if cfg.device == "cuda":
        gpus = max(gpus, float(cfg.tensor_parallel_size))
    threads = max(1, math.floor(cfg.num_cpus)) if cfg.num_cpus else 1
    env = {"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    return isolate_gpus({
        "num_cpus": cfg.num_cpus,
        "num_gpus": gpus,
        "max_concurrency": 4096,
        "max_restarts": cfg.max_restarts,  # the driver re-subscribes a restarted replica (launch.job.roles)
        "max_task_retries": 0,  # a request is not idempotent: the episode ends lost instead
        "scheduling_strategy": "SPREAD",
        "runtime_env": {"env_vars": env},
    })


@dataclass(frozen=True)
class ReplicaLaunch:
    """How one replica is started: its name, index, Ray options and its own config section."""

    name: str
    index: int
    options: dict
    cfg: GeneratorConfig  # the section with this replica's seed (generator.seed + index)


def replica_launches(cfg: GeneratorConfig, name_prefix: str = "generator") -> list[ReplicaLaunch]:
    """One entry per replica of `cfg.num_replicas`; replica i samples with seed `cfg.seed + i`."""
    options = actor_options(cfg)
    return [ReplicaLaunch(name, i, dict(options), dataclasses.replace(cfg, seed=cfg.seed + i))
            for i, name in enumerate(replica_names(cfg.num_replicas, name_prefix))]


class Replica(Generator):
    """A generator as a Ray actor: a process that Ray restarted serves nothing before it has the current
    weights (Ray reruns the constructor with the first start's arguments)."""

    def __init__(self, model_path: str, cfg: GeneratorConfig, **kwargs):
        import ray

        problem = visibility_problem(actor_options(cfg)["num_gpus"])
        if problem:  # before the engine picks a device
            raise RuntimeError(f"generator replica: {problem}")
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(model_path, cfg, wait_for_weights=restarted, **kwargs)

    async def subscribe_weights(self, endpoint: str, curve: CurveClient | None = None, relay_host: str | None = None,
                                relay_advertise: str = "", chunk_bytes: int = 64 << 20) -> None:
        """As Generator's; a relay socket bound to a wildcard is advertised under this node's address."""
        import ray

        if relay_host == "0.0.0.0" and not relay_advertise:
            relay_advertise = ray.util.get_node_ip_address()
        await super().subscribe_weights(endpoint, curve, relay_host, relay_advertise, chunk_bytes)


def ray_name(name: str, tag: str) -> str | None:
    """The Ray actor name of replica `name` started under `tag` (None, unnamed, without a tag)."""
    return f"{tag}.{name}" if tag else None


def replica_names(n: int, prefix: str = "generator") -> list[str]:
    """The names of the first `n` replicas (they also name their weights-channel keys)."""
    return [f"{prefix}-{i}" for i in range(n)]


def start_generators(model_dir: str | Path, cfg: GeneratorConfig, *, dtype: str, max_model_len: int,
                     weights_endpoint: str = "", initial_version: int = 0, name_prefix: str = "generator",
                     timeout_s: float = 900.0, weights_curve: dict[str, CurveClient] | None = None,
                     log_dir: str | None = None, actor_tag: str = "",
                     weights_relay_host: str | None = None, weights_sync: str = "zmq",
                     weights_timeout_s: float = 300.0) -> list[Any]:
    """Start `cfg.num_replicas` generator actors, wait until each engine is ready, subscribe them to weights.
    `weights_curve`: each replica's CURVE credentials by name (`<name_prefix>-<i>`), when the channel has them.
    `log_dir`: each replica's output goes to `<log_dir>/<name>.log` (None: to the driver's terminal).
    `actor_tag`: replicas get the Ray actor names `ray_name(name, actor_tag)` (unique per start when it is).
    `weights_relay_host`: each replica binds its relay forwarding socket there (None: the channel is a star).
    `weights_sync` collective: `weights_endpoint` is learner rank 0's weights group, which each replica's workers
    join (replica i takes ranks 1 + i * workers onwards; the group forms when rank 0 waits for its peers).
    The two halves, `launch_generators` and `connect_generators`, let a caller start other roles in between."""
    handles = launch_generators(model_dir, cfg, dtype=dtype, max_model_len=max_model_len,
                                initial_version=initial_version, name_prefix=name_prefix, log_dir=log_dir,
                                actor_tag=actor_tag)
    connect_generators(handles, cfg, weights_endpoint=weights_endpoint, name_prefix=name_prefix, timeout_s=timeout_s,
                       weights_curve=weights_curve, weights_relay_host=weights_relay_host, weights_sync=weights_sync,
                       weights_timeout_s=weights_timeout_s)
    return handles


def launch_generators(model_dir: str | Path, cfg: GeneratorConfig, *, dtype: str, max_model_len: int,
                      initial_version: int = 0, name_prefix: str = "generator", log_dir: str | None = None,
                      actor_tag: str = "", options: dict[str, dict] | None = None) -> list[Any]:
    """Create the replicas' actors without waiting for them (their engines load meanwhile). `options`: each
    replica's Ray options by name, as the run's placement plan has them (launch.job.plan); None: computed here."""
    import ray

    remote_cls = ray.remote(Replica)
    launches = replica_launches(cfg, name_prefix)
    if options is not None and set(options) != {r.name for r in launches}:
        raise ValueError(f"the placement plan names replicas {sorted(options)}, the config {len(launches)}")
    return [remote_cls.options(name=ray_name(r.name, actor_tag),
                               **(options[r.name] if options is not None else with_role_log(r.options, log_dir, r.name)))
            .remote(str(model_dir), r.cfg, dtype=dtype, max_model_len=max_model_len, name=r.name,
                    initial_version=initial_version, replica_index=r.index) for r in launches]


def connect_generators(handles: list[Any], cfg: GeneratorConfig, *, weights_endpoint: str = "",
                       name_prefix: str = "generator", timeout_s: float = 900.0,
                       weights_curve: dict[str, CurveClient] | None = None, weights_relay_host: str | None = None,
                       weights_sync: str = "zmq", weights_timeout_s: float = 300.0,
                       weights_chunk_bytes: int = 64 << 20) -> None:
    """Wait until every launched replica's engine is ready, then subscribe each to the weights (see above)."""
    import ray

    names = replica_names(len(handles), name_prefix)
    ray.get([h.ready.remote() for h in handles], timeout=timeout_s)
    if weights_endpoint and weights_sync == "collective":
        workers = workers_per_replica(cfg)
        ray.get([h.join_weights_group.remote(weights_endpoint, 1 + i * workers, 1 + len(handles) * workers,
                                             weights_timeout_s) for i, h in enumerate(handles)], timeout=60)
    elif weights_endpoint:
        curves = [weights_curve[n] if weights_curve else None for n in names]
        ray.get([h.subscribe_weights.remote(weights_endpoint, c, weights_relay_host, "", weights_chunk_bytes)
                 for h, c in zip(handles, curves)], timeout=60)


def workers_per_replica(cfg: GeneratorConfig) -> int:
    """vLLM worker processes of one replica: one per tensor-parallel rank on CUDA, one on CPU."""
    return cfg.tensor_parallel_size if cfg.device == "cuda" else 1


def stop_generators(handles: list[Any], timeout_s: float = 60.0) -> None:
    import ray

    try:
        ray.get([h.shutdown.remote() for h in handles], timeout=timeout_s)
    finally:
        for h in handles:
            ray.kill(h)
