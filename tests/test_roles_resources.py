"""A run whose roles ask for more CPUs or GPUs than the cluster has is refused before anything is placed."""
from __future__ import annotations

import pytest

from configs.load import load_config
from launch.roles import check_resources


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
