"""Advantage estimators: one advantage per token, feeding the decoupled PPO loss.

What must hold, for every estimator:
- Advantages live on sampled tokens only (loss_mask == 1); prompt, template and env tokens get exactly 0.
- Rewards are per turn (`turn_rewards`), and a turn's reward reaches the reply that earned it and, through the
  return, every earlier reply of the episode. A sparse reward at the last turn therefore gives non-zero
  advantages to every sampled token of the episode (unless the estimator's baseline cancels it exactly, e.g. a
  GRPO group whose samples all scored the same).
- Group estimators (GRPO, RLOO) see whole groups: every sample of a `group_id` is in the same call.

The unit of time is the *step*: a turn of the episode with at least one sampled token. Discounting (`gamma`)
and GAE's lambda apply between steps, never between the tokens of one reply. A turn without sampled tokens is
folded into the step before it (its reward discounted by gamma per turn in between); sampled tokens after the
last `turn_ends` offset (a reply cut off by shutdown) form a last step with reward 0. A reward that arrives
before the first sampled token has no action to credit and raises.

GAE with a value head, over steps: V(s) is the value head's output at the position that predicts a token, i.e.
the value of the state just before that token is sampled. With T_k the lambda-return of step k,

    T_k = r_k + gamma * ((1 - lam) * V(first token of step k+1) + lam * T_{k+1}),  T = 0 after the last step,

each sampled token t of step k gets return T_k and advantage T_k - V(t). This is token-level GAE with discount
and lambda 1 inside a reply and (gamma, lam) across turn boundaries. The episode's end is treated as terminal
(value 0) whatever the termination; a truncated episode carries no next state to bootstrap from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from core.trajectory import Trajectory

ESTIMATORS = ("grpo", "rloo", "reinforce_pp", "gae")
EPS = 1e-6


@dataclass
class Steps:
    """The step structure of one trajectory: which sampled tokens belong to which step, and step rewards."""

    token_step: np.ndarray  # [T] int64, step index of each sampled token, -1 elsewhere
    rewards: np.ndarray  # [S] float64, reward of each step (folded and discounted as described above)
    first_token: np.ndarray  # [S] int64, index of each step's first sampled token

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])


def steps_of(traj: Trajectory, gamma: float) -> Steps:
    """Group the sampled tokens of `traj` into steps and attach each turn's reward to its step."""
    sampled = np.flatnonzero(traj.loss_mask)
    turn_ends = traj.turn_ends.astype(np.int64)
    # turn k covers token offsets [turn_ends[k-1], turn_ends[k]); tokens past the last end are turn K
    turn_of_token = np.searchsorted(turn_ends, sampled, side="right")
    turns_with_tokens, first_pos = np.unique(turn_of_token, return_index=True)
    step_of_turn = np.full(traj.num_turns + 1, -1, dtype=np.int64)
    step_of_turn[turns_with_tokens] = np.arange(turns_with_tokens.size)
    rewards = np.zeros(turns_with_tokens.size, dtype=np.float64)
    step, turns_since_step = -1, 0
    for k in range(traj.num_turns):
        if step_of_turn[k] >= 0:
            step, turns_since_step = int(step_of_turn[k]), 0
        else:
            turns_since_step += 1
        r = float(traj.turn_rewards[k])
        if r == 0.0:
            continue
        if step < 0:
            raise ValueError(f"trajectory {traj.trajectory_id}: turn {k} has reward {r} but no sampled token "
                             f"precedes it, so no action can be credited")
        rewards[step] += (gamma ** turns_since_step) * r
    token_step = np.full(traj.num_tokens, -1, dtype=np.int64)
    token_step[sampled] = step_of_turn[turn_of_token]
    return Steps(token_step=token_step, rewards=rewards, first_token=sampled[first_pos].astype(np.int64))


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_k = r_k + gamma * G_{k+1}, with G = 0 after the last step."""
    out = np.zeros(rewards.shape[0], dtype=np.float64)
    running = 0.0
    for k in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def _broadcast(traj: Trajectory, value_per_traj: float) -> np.ndarray:
    return (traj.loss_mask.astype(np.float64) * value_per_traj).astype(np.float32)


def _groups(trajs: Sequence[Trajectory], min_size: int, estimator: str) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.group_id, []).append(i)
    for gid, members in groups.items():
        if len(members) < min_size:
            raise ValueError(f"{estimator}: group {gid!r} has {len(members)} sample(s); it needs at least "
                             f"{min_size} for a baseline (rollout.group_size)")
    return groups


def grpo(trajs: Sequence[Trajectory], norm_by_std: bool = True) -> list[np.ndarray]:
    """Group-relative: (R_i - mean_group R) / (std_group R + eps), std with Bessel's correction, on every
    sampled token. With `norm_by_std` off, the centred reward alone (Dr. GRPO)."""
    scores = np.array([t.total_reward for t in trajs], dtype=np.float64)
    adv = np.zeros_like(scores)
    for members in _groups(trajs, 2, "grpo").values():
        s = scores[members]
        centred = s - s.mean()
        adv[members] = centred / (s.std(ddof=1) + EPS) if norm_by_std else centred
    return [_broadcast(t, a) for t, a in zip(trajs, adv)]


def rloo(trajs: Sequence[Trajectory]) -> list[np.ndarray]:
    """Leave-one-out: R_i - mean of the other samples' R in its group, on every sampled token."""
    scores = np.array([t.total_reward for t in trajs], dtype=np.float64)
    adv = np.zeros_like(scores)
    for members in _groups(trajs, 2, "rloo").values():
        s = scores[members]
        adv[members] = s - (s.sum() - s) / (len(members) - 1)
    return [_broadcast(t, a) for t, a in zip(trajs, adv)]


def reinforce_pp(trajs: Sequence[Trajectory], gamma: float, whiten: bool = True) -> list[np.ndarray]:
    """REINFORCE++: each sampled token gets the discounted return of its step (discounted over turns), then
    the batch is whitened over all its sampled tokens: (G - mean) / (std + eps)."""
    out = []
    for t in trajs:
        steps = steps_of(t, gamma)
        returns = discounted_returns(steps.rewards, gamma)
        g = np.zeros(t.num_tokens, dtype=np.float64)
        on = steps.token_step >= 0
        g[on] = returns[steps.token_step[on]]
        out.append(g)
    if whiten:
        masks = [t.loss_mask.astype(bool) for t in trajs]
        flat = np.concatenate([g[m] for g, m in zip(out, masks)]) if out else np.zeros(0)
        if flat.size:
            mean, std = flat.mean(), flat.std()
            out = [np.where(m, (g - mean) / (std + EPS), 0.0) for g, m in zip(out, masks)]
    return [g.astype(np.float32) for g in out]


def gae(traj: Trajectory, values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns [T] (float32, 0 off the sampled tokens) from per-token values [T] (the value of
    the state before each token; read only on sampled tokens). See the module docstring for the recursion."""
    if values.shape != (traj.num_tokens,):
        raise ValueError(f"gae: values of trajectory {traj.trajectory_id} have shape {values.shape}, "
                         f"expected ({traj.num_tokens},)")
    steps = steps_of(traj, gamma)
    v = values.astype(np.float64)
    targets = np.zeros(steps.num_steps, dtype=np.float64)
    after = 0.0  # (1 - lam) * V(next step's first token) + lam * T_{next}, 0 after the last step
    for k in range(steps.num_steps - 1, -1, -1):
        targets[k] = steps.rewards[k] + gamma * after
        after = (1.0 - lam) * v[steps.first_token[k]] + lam * targets[k]
    on = steps.token_step >= 0
    returns = np.zeros(traj.num_tokens, dtype=np.float64)
    returns[on] = targets[steps.token_step[on]]
    advantages = np.where(on, returns - v, 0.0)
    return advantages.astype(np.float32), returns.astype(np.float32)


def compute_advantages(trajs: Sequence[Trajectory], estimator: str, *, gamma: float = 1.0,
                       norm_by_std: bool = True) -> list[np.ndarray]:
    """Per-token advantages for a whole batch, for the estimators that need no model (not gae: the learner
    computes GAE after its value pass, with `gae`)."""
    if estimator == "grpo":
        return grpo(trajs, norm_by_std)
    if estimator == "rloo":
        return rloo(trajs)
    if estimator == "reinforce_pp":
        return reinforce_pp(trajs, gamma)
    if estimator == "gae":
        raise ValueError("gae advantages need the value head: the learner computes them after its value pass")
    raise ValueError(f"adv_estimator: expected one of {', '.join(ESTIMATORS)}, got {estimator!r}")
