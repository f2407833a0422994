"""Advantage estimators on hand-computed cases, above all a sparse final reward over several turns."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core import advantages as adv
from core.trajectory import Termination, Trajectory


def make(spans: list[tuple[int, int]], rewards: list[float], group: str = "g", tid: str = "t",
         length: int | None = None) -> Trajectory:
    """A trajectory whose k-th reply is tokens [start, end) of spans[k] (sampled), and whose other tokens are
    prompt/env tokens; turn k ends at spans[k][1]."""
    n = length if length is not None else spans[-1][1] + 1
    mask = np.zeros(n, np.uint8)
    for a, b in spans:
        mask[a:b] = 1
    t = Trajectory(trajectory_id=tid, group_id=group, item_id="i", env="toy",
                   tokens=np.arange(n, dtype=np.int32) % 7, loss_mask=mask,
                   logprobs=np.where(mask, -0.5, 0).astype(np.float32),
                   versions=np.where(mask, 0, -1).astype(np.int32),
                   turn_ends=np.array([b for _, b in spans], np.int32),
                   turn_rewards=np.array(rewards, np.float32), horizon=10, termination=Termination.DONE)
    t.validate()
    return t


# Three turns; replies at tokens 2-3, 6-8, 11-12; env tokens in between; reward only at the end.
SPANS = [(2, 4), (6, 9), (11, 13)]
SAMPLED = np.array([2, 3, 6, 7, 8, 11, 12])
NOT_SAMPLED = np.setdiff1d(np.arange(14), SAMPLED)
TURN_OF = {2: 0, 3: 0, 6: 1, 7: 1, 8: 1, 11: 2, 12: 2}


def sparse(reward: float, **kw) -> Trajectory:
    return make(SPANS, [0.0, 0.0, reward], length=14, **kw)


def test_steps_group_sampled_tokens_by_turn():
    s = adv.steps_of(sparse(1.0), gamma=0.9)
    assert s.token_step.tolist() == [-1, -1, 0, 0, -1, -1, 1, 1, 1, -1, -1, 2, 2, -1]
    assert s.rewards.tolist() == [0.0, 0.0, 1.0]
    assert s.first_token.tolist() == [2, 6, 11]


def test_grpo_sparse_final_reward_reaches_every_sampled_token():
    group = [sparse(r, tid=f"t{i}") for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    out = adv.grpo(group, norm_by_std=True)
    std = np.std([1, 0, 0, 1], ddof=1)  # 0.57735
    for traj, a, r in zip(group, out, [1.0, 0.0, 0.0, 1.0]):
        expected = (r - 0.5) / (std + adv.EPS)
        assert a.dtype == np.float32 and a.shape == (14,)
        np.testing.assert_allclose(a[SAMPLED], expected, rtol=1e-6)
        assert np.all(a[NOT_SAMPLED] == 0)
    assert abs(out[0][2] - 0.8660254) < 1e-5  # 0.5 / 0.57735


def test_grpo_without_std_scaling_is_the_centred_reward():
    group = [sparse(r, tid=f"t{i}") for i, r in enumerate([2.0, 0.0, 1.0])]
    out = adv.grpo(group, norm_by_std=False)
    assert [float(a[2]) for a in out] == [1.0, -1.0, 0.0]


def test_grpo_groups_are_separate():
    trajs = [sparse(1.0, group="a", tid="1"), sparse(0.0, group="a", tid="2"),
             sparse(5.0, group="b", tid="3"), sparse(3.0, group="b", tid="4")]
    out = adv.grpo(trajs, norm_by_std=False)
    assert [float(a[2]) for a in out] == [0.5, -0.5, 1.0, -1.0]


def test_grpo_std_is_taken_per_group():
    # Same centred rewards, different spreads: a batch-wide std would give both groups one scale.
    rewards = {"narrow": [1.0, 0.0, 0.0, 1.0], "wide": [10.0, 0.0, 0.0, 10.0], "mixed": [3.0, 1.0, 2.0]}
    trajs = [sparse(r, group=g, tid=f"{g}{i}") for g, rs in rewards.items() for i, r in enumerate(rs)]
    out = adv.grpo(trajs, norm_by_std=True)
    for traj, a in zip(trajs, out):
        group = np.array(rewards[traj.group_id])
        expected = (traj.turn_rewards[-1] - group.mean()) / (group.std(ddof=1) + adv.EPS)
        np.testing.assert_allclose(a[SAMPLED], expected, rtol=1e-5)
    # The two groups with the same pattern get the same advantages although their rewards differ tenfold.
    np.testing.assert_allclose(out[0], out[4], rtol=1e-5)
    assert abs(float(out[0][2])) > 0.5


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_a_group_whose_rewards_are_all_equal_gets_zero_advantage(norm_by_std):
    trajs = [sparse(0.7, group="same", tid=f"s{i}") for i in range(4)] + [
        sparse(r, group="other", tid=f"o{i}") for i, r in enumerate([1.0, 0.0])]
    out = adv.grpo(trajs, norm_by_std=norm_by_std)
    for a in out[:4]:
        assert np.all(a == 0.0) and np.all(np.isfinite(a))  # no 0/0: the eps keeps the std division finite
    assert all(np.any(a[SAMPLED] != 0) for a in out[4:])


def test_group_estimators_refuse_a_group_of_one():
    with pytest.raises(ValueError, match="group 'solo' has 1 sample"):
        adv.grpo([sparse(1.0, group="solo")])
    with pytest.raises(ValueError, match="rloo"):
        adv.rloo([sparse(1.0, group="solo")])


def test_rloo_is_reward_minus_mean_of_the_others():
    group = [sparse(r, tid=f"t{i}") for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    out = adv.rloo(group)
    # sample 0: 1 - (0 + 0 + 1) / 3 = 2/3; sample 1: 0 - (1 + 0 + 1) / 3 = -2/3
    np.testing.assert_allclose(out[0][SAMPLED], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(out[1][SAMPLED], -2 / 3, rtol=1e-6)
    assert np.all(out[0][NOT_SAMPLED] == 0)


def test_reinforce_pp_discounts_over_turns_not_tokens():
    g = 0.9
    # unwhitened returns: turn 0 gets 0.81, turn 1 0.9, turn 2 1.0, whatever the reply lengths
    (a,) = adv.reinforce_pp([sparse(1.0)], gamma=g, whiten=False)
    expected = {p: g ** (2 - TURN_OF[p]) for p in SAMPLED}
    for p, e in expected.items():
        assert math.isclose(float(a[p]), e, rel_tol=1e-6), p
    assert np.all(a[NOT_SAMPLED] == 0)


def test_reinforce_pp_whitens_over_the_batch_sampled_tokens():
    g = 0.9
    batch = [sparse(1.0, tid="a"), sparse(0.0, tid="b")]
    out = adv.reinforce_pp(batch, gamma=g, whiten=True)
    raw = np.array([g ** (2 - TURN_OF[p]) for p in SAMPLED] + [0.0] * len(SAMPLED))
    mean, std = raw.mean(), raw.std()
    np.testing.assert_allclose(out[0][SAMPLED], (raw[:7] - mean) / (std + adv.EPS), rtol=1e-5)
    np.testing.assert_allclose(out[1][SAMPLED], (0.0 - mean) / (std + adv.EPS), rtol=1e-5)
    for a in out:
        assert np.all(a[SAMPLED] != 0) and np.all(a[NOT_SAMPLED] == 0)


def test_gae_sparse_final_reward_by_hand():
    g, lam = 0.9, 0.8
    values = np.zeros(14, np.float32)
    values[SAMPLED] = [0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6]
    values[NOT_SAMPLED] = 99.0  # never read: prompt and env positions
    a, ret = adv.gae(sparse(1.0), values, gamma=g, lam=lam)
    # step targets: T2 = 1; T1 = 0 + g((1-lam) V(11) + lam T2) = 0.9 (0.2*0.5 + 0.8) = 0.81
    # T0 = 0 + g((1-lam) V(6) + lam T1) = 0.9 (0.2*0.3 + 0.8*0.81) = 0.6372
    targets = {0: 0.6372, 1: 0.81, 2: 1.0}
    for p in SAMPLED:
        assert math.isclose(float(ret[p]), targets[TURN_OF[p]], rel_tol=1e-6), p
        assert math.isclose(float(a[p]), targets[TURN_OF[p]] - float(values[p]), rel_tol=1e-5), p
    assert np.all(a[NOT_SAMPLED] == 0) and np.all(ret[NOT_SAMPLED] == 0)
    assert np.all(a[SAMPLED] != 0)


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return():
    a, ret = adv.gae(sparse(2.0), np.zeros(14, np.float32), gamma=0.5, lam=1.0)
    for p in SAMPLED:
        assert math.isclose(float(a[p]), 2.0 * 0.5 ** (2 - TURN_OF[p]), rel_tol=1e-6)


def test_gae_token_level_recursion_agrees():
    """The step form equals token-level GAE with (gamma, lam) = 1 inside a reply and (g, l) across turns."""
    g, lam = 0.7, 0.6
    rng = np.random.default_rng(0)
    values = rng.normal(size=14).astype(np.float32)
    traj = make(SPANS, [0.3, -0.2, 1.0], length=14)
    a, _ = adv.gae(traj, values, gamma=g, lam=lam)
    rewards_at = {3: 0.3, 8: -0.2, 12: 1.0}
    expected, running = {}, 0.0
    for i in range(len(SAMPLED) - 1, -1, -1):
        p = SAMPLED[i]
        nxt = SAMPLED[i + 1] if i + 1 < len(SAMPLED) else None
        same_turn = nxt is not None and TURN_OF[nxt] == TURN_OF[p]
        d, l_ = (1.0, 1.0) if same_turn else (g, lam)
        v_next = float(values[nxt]) if nxt is not None else 0.0
        delta = rewards_at.get(p, 0.0) + d * v_next - float(values[p])
        running = delta + d * l_ * running if nxt is not None else delta
        expected[p] = running
    for p in SAMPLED:
        assert math.isclose(float(a[p]), expected[p], rel_tol=1e-5, abs_tol=1e-6), p


def test_turn_without_sampled_tokens_folds_into_the_step_before():
    # turn 1 (tokens 4..5) has no sampled token: its reward counts for turn 0's reply, discounted once
    traj = make([(2, 4), (5, 6), (7, 9)], [0.0, 1.0, 2.0], length=10)
    traj.loss_mask[5] = 0
    traj.logprobs[5] = 0
    traj.versions[5] = -1
    s = adv.steps_of(traj, gamma=0.5)
    assert s.rewards.tolist() == [0.5, 2.0]
    (a,) = adv.reinforce_pp([traj], gamma=0.5, whiten=False)
    assert a[2] == a[3] == np.float32(1.5) and a[7] == a[8] == np.float32(2.0)  # 0.5 + 0.5 * 2


def test_reward_before_any_sampled_token_raises():
    traj = make([(2, 4)], [1.0], length=5)
    traj.turn_ends = np.array([1, 4], np.int32)
    traj.turn_rewards = np.array([1.0, 0.0], np.float32)
    with pytest.raises(ValueError, match="no sampled token precedes"):
        adv.steps_of(traj, gamma=1.0)


def test_compute_advantages_dispatch():
    group = [sparse(1.0, tid="a"), sparse(0.0, tid="b")]
    assert np.allclose(adv.compute_advantages(group, "rloo")[0], adv.rloo(group)[0])
    with pytest.raises(ValueError, match="value head"):
        adv.compute_advantages(group, "gae")
    with pytest.raises(ValueError, match="adv_estimator"):
        adv.compute_advantages(group, "ppo")
