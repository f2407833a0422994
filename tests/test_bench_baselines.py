"""The generator bench's baselines are what a user would run: HF in a process of its own with the OpenMP setting
the bench gave itself taken back, and the weights cast to the generator's dtype inside the timed update."""
from __future__ import annotations

import numpy as np
import torch

from core.weights.tensors import TensorBytes
from launch.bench.hf_baseline import run_clean
from launch.bench.weights_shards import cast


def test_hf_runs_without_the_benchs_openmp_setting(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # what launch.bench generator sets for itself
    got = run_clean(tiny_model_dir, [[5, 6, 7], [8, 9]], 4, 1, "float32", tmp_path / "spec.json",
                    restore={"OMP_WAIT_POLICY": None})
    assert got["omp_wait_policy"] == "" and got["torch_threads"] >= 1
    assert got["one_tokens"] > 0 and got["batched_tokens"] > 0 and got["batched_s"] > 0
    kept = run_clean(tiny_model_dir, [[5, 6, 7]], 2, 1, "float32", tmp_path / "spec2.json",
                     restore={"OMP_WAIT_POLICY": "ACTIVE"})  # a user's own setting is given back, not dropped
    assert kept["omp_wait_policy"] == "ACTIVE"


def test_the_cast_to_the_generators_dtype_is_a_real_conversion():
    values = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    t = TensorBytes("w", "float32", (4,), memoryview(values.view(np.uint8)))
    assert cast([t], "float32") == [t]  # nothing to do when the dtypes agree
    (low,) = cast([t], "bfloat16")
    assert low.dtype == "bfloat16" and low.shape == (4,) and len(bytes(low.data)) == 8
    back = torch.frombuffer(bytearray(low.data), dtype=torch.bfloat16).float()
    assert torch.equal(back, torch.tensor(values).to(torch.bfloat16).float())
