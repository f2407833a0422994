"""A run whose roles ask for more CPUs or GPUs than the cluster has is refused before anything is placed; the
request counted is the one the roles' actor options make."""
from __future__ import annotations

import pytest

from configs.load import load_config
from launch.job.generators import actor_options
from launch.job.placement import learner_bundle, pool_actor_options
from launch.job.roles import check_resources, resource_request


def test_the_default_recipe_fits_two_cpus():
    check_resources(load_config(None), {"CPU": 2.0})


@pytest.mark.parametrize("overrides, needle", [
    (["env.num_cpus_per_actor=1", "env.num_actors=2"], "env.num_actors * env.num_cpus_per_actor = 2"),
    (["learner.num_ranks=2"], "learner.num_ranks * learner.num_cpus_per_rank = 2"),
    (["generator.num_gpus=1"], "generator.num_replicas * generator.num_gpus = 1"),
])
def test_too_much_is_refused_naming_the_keys(overrides, needle):
    with pytest.raises(SystemExit) as err:
        check_resources(load_config(None, overrides), {"CPU": 2.0})
    assert needle in str(err.value) and "the Ray cluster has" in str(err.value)


def test_a_cuda_generator_counts_its_tensor_parallel_gpus():
    """Each cuda replica asks Ray for max(num_gpus, tensor_parallel_size) GPUs: three TP-4 replicas need
    12."""
    cfg = load_config(None, ["generator.device=cuda", "generator.num_replicas=3",
                             "generator.tensor_parallel_size=4"])
    assert resource_request(cfg)["GPU"] == 12
    with pytest.raises(SystemExit) as err:
        check_resources(cfg, {"CPU": 96.0, "GPU": 8.0})
    assert "12 GPU" in str(err.value)
    key = "generator.num_replicas * max(generator.num_gpus, generator.tensor_parallel_size)"
    assert f"{key} = 12" in str(err.value)
    check_resources(load_config(None, ["generator.device=cuda", "generator.num_replicas=2",
                                       "generator.tensor_parallel_size=4"]), {"CPU": 96.0, "GPU": 8.0})


def test_the_request_is_what_the_roles_ask_ray_for():
    cfg = load_config(None, ["learner.num_ranks=4", "learner.num_gpus_per_rank=1",
                             "learner.num_cpus_per_rank=8", "generator.device=cuda", "generator.num_replicas=2",
                             "generator.tensor_parallel_size=2", "generator.num_cpus=8", "env.num_actors=32",
                             "env.num_cpus_per_actor=1"])
    assert resource_request(cfg) == {"CPU": 80.0, "GPU": 8.0}
    check_resources(cfg, {"CPU": 96.0, "GPU": 8.0})
    replica, rank = actor_options(cfg.generator), learner_bundle(cfg.learner)
    pool = pool_actor_options(cfg.env)
    assert resource_request(cfg) == {
        "CPU": 2 * replica["num_cpus"] + 4 * rank["CPU"] + 32 * pool["num_cpus"],
        "GPU": 2 * replica["num_gpus"] + 4 * rank["GPU"] + 32 * pool["num_gpus"]}
    with pytest.raises(SystemExit, match="learner.num_ranks \\* learner.num_gpus_per_rank = 4"):
        check_resources(cfg, {"CPU": 96.0, "GPU": 7.0})


def test_a_cpu_learner_rank_counts_its_minimal_bundle():
    cfg = load_config(None, ["learner.num_cpus_per_rank=0", "generator.num_cpus=0"])
    assert resource_request(cfg) == {"CPU": 0.01, "GPU": 0.0}
    with pytest.raises(SystemExit, match="learner.num_ranks \\* learner.num_cpus_per_rank = 0.01"):
        check_resources(cfg, {"CPU": 0.0})


def test_learner_ranks_that_fit_no_single_node_need_allow_insecure_naming_the_keys():
    """Ranks on several nodes rendezvous through torch's TCPStore and run gloo/NCCL between the nodes, none of
    it authenticated: without transport.allow_insecure the ranks must fit one node (STRICT_PACK)."""
    nodes = [{"CPU": 96.0, "GPU": 8.0}, {"CPU": 96.0, "GPU": 8.0}]
    total = {"CPU": 192.0, "GPU": 16.0}
    spread = ["learner.num_ranks=12", "learner.num_gpus_per_rank=1", "learner.num_cpus_per_rank=8"]
    with pytest.raises(SystemExit) as err:
        check_resources(load_config(None, spread), total, nodes)
    message = str(err.value)
    for needle in ("learner.num_ranks = 12", "learner.num_gpus_per_rank = 1", "learner.num_cpus_per_rank = 8",
                   "fit on no single node", "not authenticated", "transport.allow_insecure=true"):
        assert needle in message, message
    check_resources(load_config(None, [*spread, "transport.allow_insecure=true"]), total, nodes)
    check_resources(load_config(None, ["learner.num_ranks=8", "learner.num_gpus_per_rank=1",
                                       "learner.num_cpus_per_rank=8"]), total, nodes)  # one node holds them
