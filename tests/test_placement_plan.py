"""The placement plan (launch.job.plan): one value says where every role runs and with what; the resource check
counts it, `--print-placement` prints it, and the roles are started from it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from configs.load import load_config
from launch.job.plan import placement_plan
from launch.job.roles import resource_request
from tests.training_runs import ROOT


def test_every_role_is_in_the_plan_with_its_resources_and_env():
    cfg = load_config(None, ["learner.num_ranks=2", "generator.num_replicas=3", "env.num_actors=2",
                             "env.num_cpus_per_actor=0.5"])
    plan = placement_plan(cfg, "/tmp/run-logs")
    assert [r.name for r in plan.of("learner")] == ["learner-0", "learner-1"]
    assert [r.name for r in plan.of("generator")] == ["generator-0", "generator-1", "generator-2"]
    assert [r.name for r in plan.of("env_pool")] == ["envpool-0", "envpool-1"]
    assert all(r.cpus == 0.5 for r in plan.of("env_pool"))
    for r in plan.roles:  # no role that asked for no GPU sees one; each writes its own log
        assert r.gpus == 0 and r.env["CUDA_VISIBLE_DEVICES"] == ""
        assert r.env["AGENTGYM_ROLE_LOG"] == f"/tmp/run-logs/{r.name}.log"
    assert plan.learner_strategy == "STRICT_PACK" and len(plan.learner_bundles) == 2
    assert plan.asks() == resource_request(cfg)


def test_gpu_roles_see_what_ray_assigns_and_insecure_learners_may_spread():
    cfg = load_config(None, ["learner.num_gpus_per_rank=1", "generator.device=cuda", "generator.num_gpus=1",
                             "generator.tensor_parallel_size=2", "transport.allow_insecure=true"])
    plan = placement_plan(cfg)
    (rank,), (replica,) = plan.of("learner"), plan.of("generator")
    assert rank.gpus == 1 and "CUDA_VISIBLE_DEVICES" not in rank.env  # Ray's assignment holds
    assert replica.gpus == 2 and "CUDA_VISIBLE_DEVICES" not in replica.env
    assert plan.of("env_pool")[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.learner_strategy == "PACK" and plan.learner_bundles == [{"CPU": 1.0, "GPU": 1.0}]
    assert plan.asks()["GPU"] == resource_request(cfg)["GPU"] == 3
    with pytest.raises(ValueError, match="unknown role"):
        plan.of("coordinator")


def test_print_placement_prints_the_plan_and_starts_nothing():
    out = subprocess.run([sys.executable, "-m", "launch.train", "--print-placement", "generator.num_replicas=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:5] == ["role", "name", "CPUs", "GPUs", "where"]
    assert [line.split()[1] for line in lines[1:-1]] == ["learner-0", "generator-0", "generator-1", "envpool-0"]
    assert lines[-1].startswith("in all: 3 CPUs, 0 GPUs") and "STRICT_PACK" in lines[-1]
