"""Which GPUs each role's process sees, as Ray launches it, and the per-replica sampling seeds.

The Ray tests start a local Ray that declares two GPUs on a node whose processes all see
CUDA_VISIBLE_DEVICES=0,1 (as a GPU node does). This machine has no GPU: the two are declared to Ray, not
detected (a stand-in for real devices), so Ray's assignment and the variable it sets are real while no CUDA
call is made. Each role's actor options (the same functions the roles are started with) launch a small probe
actor that reports its own environment; no vLLM or DeepSpeed is started.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from configs.env import EnvConfig
from configs.generation import GeneratorConfig
from configs.learner import LearnerConfig
from launch.job.generators import actor_options, replica_launches
from launch.job.placement import (
    isolate_gpus,
    learner_bundle,
    learner_rank_options,
    pool_actor_options,
    visibility_problem,
)

ROOT = Path(__file__).resolve().parents[1]
NODE_GPUS = "0,1"


# -- options, no Ray ----------------------------------------------------------------------------------------
def test_an_actor_without_gpus_hides_them_and_keeps_its_env():
    given = {"num_cpus": 1, "runtime_env": {"env_vars": {"A": "1"}, "working_dir": "/x"}}
    out = isolate_gpus(given)
    assert out["runtime_env"] == {"env_vars": {"A": "1", "CUDA_VISIBLE_DEVICES": ""}, "working_dir": "/x"}
    assert given["runtime_env"]["env_vars"] == {"A": "1"}  # the caller's dict is left alone
    assert isolate_gpus({"num_gpus": 0})["runtime_env"] == {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}


def test_an_actor_with_gpus_keeps_rays_assignment():
    assert "runtime_env" not in isolate_gpus({"num_gpus": 1})
    with pytest.raises(ValueError, match="runtime_env.env_vars.CUDA_VISIBLE_DEVICES"):
        isolate_gpus({"num_gpus": 1, "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": "3"}}})


def test_each_role_option_hides_gpus_exactly_when_it_asks_for_none():
    cpu_gen = actor_options(GeneratorConfig(device="cpu", num_cpus=2))
    assert cpu_gen["num_gpus"] == 0 and cpu_gen["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu_gen["runtime_env"]["env_vars"]["PYTHONPATH"] == str(ROOT)
    assert cpu_gen["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "2"
    cuda_gen = actor_options(GeneratorConfig(device="cuda", tensor_parallel_size=2))
    assert cuda_gen["num_gpus"] == 2 and "CUDA_VISIBLE_DEVICES" not in cuda_gen["runtime_env"]["env_vars"]
    assert pool_actor_options(EnvConfig())["runtime_env"]["env_vars"] == {"CUDA_VISIBLE_DEVICES": ""}
    cpu_rank = learner_rank_options(LearnerConfig(num_cpus_per_rank=0), 1, "ln", "strategy")
    assert cpu_rank["num_cpus"] == 0.01 and cpu_rank["num_gpus"] == 0 and cpu_rank["name"] == "ln-1"
    assert cpu_rank["runtime_env"]["env_vars"] == {"CUDA_VISIBLE_DEVICES": ""}
    gpu_rank = learner_rank_options(LearnerConfig(num_gpus_per_rank=1), 0, "ln", "strategy")
    assert gpu_rank["num_gpus"] == 1 and "runtime_env" not in gpu_rank
    # learner.cpu_omp_wait_policy: in a CPU rank's environment (OpenMP reads it as torch loads), no other
    passive = learner_rank_options(LearnerConfig(cpu_omp_wait_policy="PASSIVE"), 0, "ln", "strategy")
    assert passive["runtime_env"]["env_vars"] == {"OMP_WAIT_POLICY": "PASSIVE", "CUDA_VISIBLE_DEVICES": ""}
    on_gpu = learner_rank_options(LearnerConfig(num_gpus_per_rank=1, cpu_omp_wait_policy="PASSIVE"), 0, "ln", "s")
    assert "runtime_env" not in on_gpu
    assert learner_bundle(LearnerConfig(num_cpus_per_rank=4, num_gpus_per_rank=1)) == {"CPU": 4, "GPU": 1}


def test_replicas_sample_with_different_seeds():
    base = GeneratorConfig(num_replicas=3, seed=7)
    launches = replica_launches(base, "gen")
    assert [r.cfg.seed for r in launches] == [7, 8, 9]
    assert [(r.name, r.index) for r in launches] == [("gen-0", 0), ("gen-1", 1), ("gen-2", 2)]
    assert base.seed == 7  # the run's section is not changed
    assert all(r.options == actor_options(base) for r in launches)
    # apart from the seed, every replica gets the run's section
    assert {(r.cfg.num_replicas, r.cfg.device, r.cfg.kv_cache_gb) for r in launches} == {(3, "cpu", 2.0)}


# -- as Ray launches them -----------------------------------------------------------------------------------
class Probe:
    """Reports what its process sees."""

    async def seen(self, requested_gpus: float) -> dict:
        import ray

        return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()], "job": os.environ.get("ROLE_ENV_JOB_MARK"),
                "pythonpath": os.environ.get("PYTHONPATH"), "omp_wait": os.environ.get("OMP_WAIT_POLICY"),
                "problem": visibility_problem(requested_gpus)}


@pytest.fixture(scope="module")
def gpu_node():
    from launch.job.ray_cluster import connect, shutdown

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = NODE_GPUS  # what the raylet, and every worker it starts, inherits
    try:
        connect(num_cpus=2, num_gpus=2, namespace="role-env-test",
                runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "ROLE_ENV_JOB_MARK": "job"}})
        yield
    finally:
        shutdown()
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def test_each_role_sees_the_gpus_it_was_given_and_no_other(gpu_node):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpu_ranks = LearnerConfig(num_cpus_per_rank=0.1, cpu_omp_wait_policy="PASSIVE")
    gpu_ranks = LearnerConfig(num_cpus_per_rank=0.1, num_gpus_per_rank=1)
    groups = {kind: placement_group([learner_bundle(ranks)])
              for kind, ranks in (("cpu", cpu_ranks), ("gpu", gpu_ranks))}
    ray.get([g.ready() for g in groups.values()], timeout=60)

    def in_group(kind):
        return PlacementGroupSchedulingStrategy(groups[kind], placement_group_bundle_index=0)

    roles = {  # role -> (its options, the GPUs it asked for)
        "generator/cpu": (actor_options(GeneratorConfig(device="cpu", num_cpus=0.1)), 0),
        "generator/cuda": (actor_options(GeneratorConfig(device="cuda", num_cpus=0.1)), 1),
        "envpool": (pool_actor_options(EnvConfig(num_cpus_per_actor=0.1)), 0),
        "learner/cpu": (learner_rank_options(cpu_ranks, 0, "cpu-rank", in_group("cpu")), 0),
        "learner/gpu": (learner_rank_options(gpu_ranks, 0, "gpu-rank", in_group("gpu")), 1),
        "unisolated": ({"num_cpus": 0.1}, 0),  # what every CPU role was started with before
    }
    actors = {role: ray.remote(Probe).options(**opts).remote() for role, (opts, _) in roles.items()}
    try:
        seen = {role: ray.get(actors[role].seen.remote(roles[role][1]), timeout=120) for role in roles}
        for role in ("generator/cpu", "envpool", "learner/cpu"):
            assert seen[role]["visible"] == "" and seen[role]["gpu_ids"] == [], (role, seen[role])
            assert seen[role]["problem"] == "", role
        for role in ("generator/cuda", "learner/gpu"):
            assert len(seen[role]["gpu_ids"]) == 1 and seen[role]["visible"] == seen[role]["gpu_ids"][0], role
            assert seen[role]["problem"] == "", role
        assert {seen["generator/cuda"]["visible"], seen["learner/gpu"]["visible"]} == {"0", "1"}
        # Ray itself leaves a role that asked for no GPU with the node's devices: the check names it
        assert seen["unisolated"]["visible"] == NODE_GPUS
        assert "asked for no GPU" in seen["unisolated"]["problem"]
        # the job's env vars reach every role next to the role's own
        assert {s["job"] for s in seen.values()} == {"job"}
        assert seen["generator/cpu"]["pythonpath"] == str(ROOT)
        assert seen["learner/cpu"]["omp_wait"] == "PASSIVE"  # learner.cpu_omp_wait_policy reached the process

        from launch.job.learners import _check_visibility  # what LearnerGroup runs before any rank picks a device

        _check_visibility([actors["learner/cpu"]], 0)
        _check_visibility([actors["learner/gpu"]], 1)
        with pytest.raises(RuntimeError, match="rank 1: CUDA_VISIBLE_DEVICES='0,1' in an actor that asked"):
            _check_visibility([actors["learner/cpu"], actors["unisolated"]], 0)
    finally:
        for actor in actors.values():
            ray.kill(actor)
        for group in groups.values():
            remove_placement_group(group)


def test_a_generator_replica_that_sees_unassigned_gpus_refuses_to_start(gpu_node):
    """Refused in the constructor, before the engine is built (so no vLLM is started here)."""
    import ray
    from ray.exceptions import RayActorError

    from launch.job.generators import Replica

    unisolated = ray.remote(Replica).options(num_cpus=0.1, max_restarts=0)
    replica = unisolated.remote("/nonexistent", GeneratorConfig())
    with pytest.raises(RayActorError, match="generator replica: CUDA_VISIBLE_DEVICES='0,1'"):
        ray.get(replica.describe.remote(), timeout=120)
