"""Synthetic valid trajectory records, for the transport benchmark and the wire tests."""
from __future__ import annotations

import numpy as np

from core.trajectory import LOGPROB_DTYPE, MASK_DTYPE, NO_VERSION, TOKEN_DTYPE, VERSION_DTYPE, Termination, Trajectory


def make_trajectory(num_tokens: int = 64, num_turns: int = 3, seed: int = 0, trajectory_id: str = "traj-0",
                    version: int = 3) -> Trajectory:
    """A valid record: a prompt, then `num_turns` sampled replies each followed by env tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50_000, num_tokens, dtype=np.int64).astype(TOKEN_DTYPE)
    mask = np.zeros(num_tokens, MASK_DTYPE)
    turn_ends = []
    if num_tokens and num_turns:
        prompt = num_tokens // (2 * num_turns + 1)
        span = max(1, (num_tokens - prompt) // num_turns)
        for k in range(num_turns):
            start = prompt + k * span
            end = min(num_tokens, start + max(1, span // 2))
            if end <= start or (turn_ends and end <= turn_ends[-1]):
                break
            mask[start:end] = 1
            turn_ends.append(end)
    sampled = mask.astype(bool)
    logprobs = np.where(sampled, -rng.random(num_tokens), 0.0).astype(LOGPROB_DTYPE)
    versions = np.where(sampled, version, NO_VERSION).astype(VERSION_DTYPE)
    return Trajectory(
        trajectory_id=trajectory_id, group_id="group-0", item_id="babyai_7", env="babyai",
        tokens=tokens, loss_mask=mask, logprobs=logprobs, versions=versions,
        turn_ends=np.asarray(turn_ends, TOKEN_DTYPE),
        turn_rewards=np.asarray([0.0] * (len(turn_ends) - 1) + [1.0] * bool(turn_ends), LOGPROB_DTYPE),
        horizon=10, termination=Termination.DONE, sample_index=1, metrics={"success": 1.0, "num_turns": 3.0},
    )


def trajectory_of_bytes(target_bytes: int, seed: int = 0, trajectory_id: str = "traj") -> Trajectory:
    """A record whose encoded size is about `target_bytes` (13 bytes per token on the wire)."""
    return make_trajectory(num_tokens=max(16, target_bytes // 13), num_turns=4, seed=seed,
                           trajectory_id=trajectory_id)
