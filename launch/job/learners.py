"""The learner ranks as Ray actors, behind one handle.

What must hold:
- One actor per data-parallel rank, each holding the CPU/GPU resources of `learner.num_*_per_rank`, in one
  placement group (docs/placement.md): all on one node (STRICT_PACK), or with transport.allow_insecure packed
  onto as few nodes as possible (PACK), since ranks on several nodes rendezvous unauthenticated. A rank
  without GPUs sees none; a rank with GPUs sees only Ray's and trains on the first (cuda:0); ranks that see
  otherwise are refused before set-up (launch.job.placement).
- The ranks rendezvous at 127.0.0.1 when they share a node, else at rank 0's node address; rank 0 picks the
  port. Every call goes to every rank at once (the ranks run collectives), and a failure on any rank raises
  here at once instead of leaving the others waiting in a collective.
- `wait_acks` runs in its own Ray concurrency group (`acks`, one thread): the coordinator waits there for the
  generators to take version v while the default group trains v + 1 (actors/learner.py keeps the publisher to
  one thread at a time).
- `train_step` takes a whole batch of trajectories: advantages are computed over the whole batch first (group
  estimators need whole groups, REINFORCE++ whitens over the batch; GAE is left to the ranks, which hold the
  value head), then the batch is sharded over ranks balanced by tokens.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from launch.job.ray_cluster import apply_ray_env

# Ray reads these when it is imported, not when it starts: set after `import ray`, a local Ray listens on
# every interface and advertises the machine's external address (seen with Ray 2.60). As in connect().
apply_ray_env()

import ray  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from actors.learner import Learner, PublisherOptions, prepare_samples  # noqa: E402
from configs.learner import AlgorithmConfig, LearnerConfig  # noqa: E402
from core.batching import shard  # noqa: E402
from core.curve import CurveServer  # noqa: E402
from core.trajectory import Trajectory  # noqa: E402
from core.weights.publisher import TensorBytes  # noqa: E402
from launch.job.placement import learner_bundle, learner_rank_options, visibility_problem, with_role_log  # noqa: E402

log = logging.getLogger("agentgym.learners")
LOOPBACK = "127.0.0.1"


def _node_of(actor) -> tuple[str, str]:
    return ray.get(actor.__ray_call__.remote(
        lambda self: (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())))


def _check_visibility(actors: list, gpus_per_rank: float) -> None:
    """Refuse to set up ranks that would see other GPUs than Ray gave them (before any picks a device)."""
    problems = ray.get([a.__ray_call__.remote(lambda self: visibility_problem(gpus_per_rank))
                        for a in actors])
    bad = [f"rank {rank}: {p}" for rank, p in enumerate(problems) if p]
    if bad:
        raise RuntimeError("learner ranks see the wrong GPUs: " + "; ".join(bad))


class _LearnerRank(Learner):
    """One rank as a Ray actor: the learner, with `wait_acks` in the `acks` concurrency group."""

    @ray.method(concurrency_group="acks")
    def wait_acks(self, version: int, timeout_s: float, excused: Sequence[str] = ()) -> dict[str, tuple[bool, str]]:
        return super().wait_acks(version, timeout_s, excused)


def _all(refs: list) -> list:
    """Results of one call on every rank; the first failure raises without waiting for the rest."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)
    return ray.get(refs)


class LearnerGroup:
    def __init__(self, model_path: str, dtype: str, learner: LearnerConfig, algorithm: AlgorithmConfig, *,
                 sampling_temperature: float = 1.0, weights_host: str | None = LOOPBACK,
                 weights_port: int = 0, weights_chunk_bytes: int = 64 << 20, name: str = "learner",
                 setup_timeout_s: float = 900.0, weights_curve: CurveServer | None = None,
                 weights_subscribers: list[str] | None = None, weights_stall_timeout_s: float = 60.0,
                 log_dir: str | None = None, weights_fanout: str = "star", weights_sync: str = "zmq",
                 weights_workers_per_replica: int = 1, weights_timeout_s: float = 300.0, weights_shm: bool = True,
                 weights_bucket_bytes: int = 512 << 20, spread_nodes: bool = False, plan: Any = None):
        """Start `learner.num_ranks` actors and set them up (loads the model; blocks until ready).
        `weights_host` None: no weights publisher (e.g. a benchmark). `weights_curve`: the publisher's CURVE
        keys and the subscribers it admits; `weights_subscribers`: the names it accepts without CURVE;
        `weights_fanout`: star or relay (core.weights.relay). `weights_sync`: zmq, or collective (rank 0 forms a
        weights group with `weights_subscribers`' workers, `weights_workers_per_replica` each, in buckets of at
        most `weights_bucket_bytes`). `spread_nodes` (transport.allow_insecure): the ranks may spread over
        several nodes and rendezvous, unauthenticated, at rank 0's node address; otherwise they are kept on one
        node (STRICT_PACK) and meet on 127.0.0.1. `plan`: the run's placement plan (launch.job.plan), whose
        learner bundles, strategy and rank options are used as they are (`spread_nodes` is then its strategy);
        None: computed here from `learner`."""
        self.learner_cfg, self.algorithm = learner, algorithm
        n = learner.num_ranks
        if plan is not None:
            ranks = plan.of("learner")
            if len(ranks) != n or len(plan.learner_bundles) != n:
                raise ValueError(f"the placement plan has {len(ranks)} learner ranks, the config {n}")
            spread_nodes = plan.learner_strategy == "PACK"
            rank_options = [dict(r.options) for r in ranks]
        else:
            rank_options = [with_role_log(learner_rank_options(learner, rank, name, None), log_dir, f"{name}-{rank}")
                            for rank in range(n)]
        bundles = plan.learner_bundles if plan is not None else [learner_bundle(learner) for _ in range(n)]
        self._pg = placement_group(bundles, strategy="PACK" if spread_nodes else "STRICT_PACK", name=f"{name}-pg")
        self.actors: list = []
        try:
            ray.get(self._pg.ready(), timeout=setup_timeout_s)
            remote = ray.remote(concurrency_groups={"acks": 1})(_LearnerRank)
            self.actors = [
                remote.options(**{**rank_options[rank], "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=rank)})
                .remote(rank, n, str(model_path), dtype, learner, algorithm, sampling_temperature)
                for rank in range(n)]
            _check_visibility(self.actors, learner.num_gpus_per_rank)
            nodes = [_node_of(a) for a in self.actors]
            self.rank0_address = nodes[0][1]  # where rank 0 (the weights publisher) runs
            host = LOOPBACK if len({node_id for node_id, _ in nodes}) == 1 else nodes[0][1]
            if host != LOOPBACK and not spread_nodes:  # STRICT_PACK rules it out; never rendezvous off-node unasked
                raise RuntimeError(f"learner ranks landed on several nodes ({sorted({a for _, a in nodes})}) "
                                   "without transport.allow_insecure: their rendezvous is not authenticated")
            if host != LOOPBACK:
                log.warning("learner ranks on several nodes rendezvous at %s, not authenticated: whoever reaches it "
                            "can read and overwrite the store's keys (transport.allow_insecure=true)", host)
            port = ray.get(self.actors[0].listen.remote(host))
            self.master = (host, port)
            publisher = PublisherOptions(weights_host, weights_port, weights_chunk_bytes, weights_curve,
                                         weights_subscribers, weights_stall_timeout_s, weights_fanout,
                                         weights_sync, weights_workers_per_replica, weights_timeout_s, weights_shm,
                                         weights_bucket_bytes)
            infos = _all([a.setup.remote(host, port, publisher if rank == 0 and weights_host else None)
                          for rank, a in enumerate(self.actors)])
        except BaseException:
            self.shutdown()
            raise
        self.parameters = infos[0]["parameters"]
        self.weights_endpoint: str | None = infos[0]["weights_endpoint"]
        log.info("learners: %d ranks, ZeRO-%d, rendezvous %s:%d, %d parameters", n, learner.zero_stage, host,
                 port, self.parameters)

    @property
    def num_ranks(self) -> int:
        return len(self.actors)

    def train_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One learner step on the whole batch; returns its metrics (over all ranks)."""
        if not trajectories:
            raise ValueError("train_step needs at least one trajectory")
        shards = shard(prepare_samples(trajectories, self.algorithm), self.num_ranks)
        return _all([a.train_step.remote(s) for a, s in zip(self.actors, shards)])[0]

    def publish_weights(self) -> dict:
        """Send the current version to every weights subscriber; returns {version, bytes, seconds}."""
        return _all([a.publish_weights.remote() for a in self.actors])[0]

    def gather_weights(self) -> list[TensorBytes]:
        """The full policy weights, gathered by every rank and returned from rank 0."""
        return _all([a.gather_weights.remote() for a in self.actors])[0]

    def wait_for_subscribers(self, n: int, timeout_s: float) -> int:
        return ray.get(self.actors[0].wait_for_subscribers.remote(n, timeout_s))

    def wait_acks(self, version: int, timeout_s: float, excused: Sequence[str] = ()) -> dict[str, tuple[bool, str]]:
        return ray.get(self.actors[0].wait_acks.remote(version, timeout_s, list(excused)))

    def version(self) -> int:
        return ray.get(self.actors[0].get_version.remote())

    def peak_memory_mb(self) -> list[dict[str, float]]:
        """Per rank: peak resident memory of its process (and peak GPU memory on GPU)."""
        return _all([a.peak_memory_mb.remote() for a in self.actors])

    def save_policy(self, folder: str) -> None:
        """The current policy as a model folder in `folder` (shared storage across nodes), written by rank 0."""
        _all([a.save_policy.remote(folder) for a in self.actors])

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its part into `path` (shared storage across nodes)."""
        _all([a.save_checkpoint.remote(path) for a in self.actors])

    def load_checkpoint(self, path: str) -> dict:
        return _all([a.load_checkpoint.remote(path) for a in self.actors])[0]

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=30)
            except Exception as exc:  # a dead or stuck rank: killing it is all that is left
                log.warning("learner close failed: %s", exc)
            ray.kill(a)
        self.actors = []
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
