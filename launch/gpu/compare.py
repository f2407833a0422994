"""What the generator check (`launch.gpu_check`) measures with: a perturbed weight version, the weights channel's
form of a state dict, and the differences between two sets of logprobs. Shared by its steps
(launch/gpu/generator_steps.py, launch/gpu/generator_collective.py) and its verdict (launch/gpu/verdict.py).
"""
from __future__ import annotations

import numpy as np

# Weight noise of each update. Its logprob move must clear MOVE_FACTOR x the mean tolerance, so that a generator
# that kept its old weights cannot pass: on the check's fixed tokens, noise 0.01 moved the default model's
# logprobs by a mean of 0.79 and 0.02 by 2.0 (float32 and bfloat16 alike), 6x bfloat16's 4 x 0.08.
NOISE_SCALE = 0.02


def perturbed_state(state: dict, seed: int, scale: float) -> dict:
    """A new weight version: every tensor plus seeded Gaussian noise (same dtype and shape)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: (v.float() + scale * torch.randn(v.shape, generator=g)).to(v.dtype).contiguous()
            for k, v in state.items()}


def tensors_of(state: dict) -> list:
    """The weights channel's form of a state dict (float32 bytes)."""
    from core.weights.tensors import TensorBytes

    return [TensorBytes(k, "float32", tuple(v.shape), v.float().contiguous().numpy().tobytes())
            for k, v in state.items()]


def max_abs_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def diff_stats(pairs) -> dict:
    """{"max_abs", "mean_abs"} of |a - b| over every (a, b) pair of equal-length logprob lists."""
    diffs = []
    for a, b in pairs:
        max_abs_diff(a, b)  # checks the shapes
        diffs.append(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
    every = np.concatenate(diffs) if diffs else np.zeros(0)
    return {"max_abs": float(every.max()) if every.size else 0.0,
            "mean_abs": float(every.mean()) if every.size else 0.0}
