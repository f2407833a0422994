"""The learner on a real local Ray with DeepSpeed on gloo: it learns a toy task with 2 ranks on ZeRO-2 and on
ZeRO-3, its ZeRO-3 weights equal a ZeRO-1 run's after the same steps, and a checkpoint resumes exactly.

Sampling is plain torch on a copy of the policy that receives every version over the weights channel, the way
a generator does (see core/cue_task.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from configs.learner import AlgorithmConfig, LearnerConfig
from core.cue_task import CueTask, load_weights
from core.weights.subscriber import WeightSubscriber

pytestmark = pytest.mark.slow

MAX_STEPS = 40
GROUPS, GROUP_SIZE, TURNS = 16, 8, 3
# Half a CPU per rank (each rank still runs one thread): two ranks fit beside actors that other tests may keep
# in a shared Ray; and a placement that cannot be met fails in two minutes instead of hanging.
CPUS_PER_RANK, SETUP_TIMEOUT_S = 0.5, 120


@pytest.fixture(scope="module")
def ray_local():
    from launch.job.ray_cluster import connect, shutdown

    started = connect()
    yield
    if started == "local":
        shutdown()


def _policy(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _weights(tensors) -> dict[str, np.ndarray]:
    return {t.name: np.frombuffer(bytes(t.data), dtype=np.float32).reshape(t.shape) for t in tensors}


@pytest.mark.parametrize("stage,stale,autocast", [(2, False, "none"), (3, True, "none"), (2, False, "bfloat16")],
                         ids=["zero2-on-policy", "zero3-one-stale", "zero2-bf16-autocast"])
def test_learns_the_cue_task(ray_local, tiny_model_dir, tiny_tokenizer, stage, stale, autocast):
    """Mean reward goes from chance (1/8) to >= 0.9. On ZeRO-3 every batch is trained one version after it
    was sampled, so the behaviour policy is stale and the importance weights are really at work. With
    learner.cpu_autocast the learner's matrix products run in bfloat16 under float32 weights: it learns as
    well, and its logprobs differ from the float32 sampler's by bfloat16 rounding only."""
    from launch.job.learners import LearnerGroup

    cfg = LearnerConfig(num_ranks=2, zero_stage=stage, lr=1e-2, micro_batch_tokens=256, mini_batches=2,
                        seed=0, num_cpus_per_rank=CPUS_PER_RANK, cpu_autocast=autocast)
    group = LearnerGroup(tiny_model_dir, "float32", cfg, AlgorithmConfig(adv_estimator="grpo"),
                         setup_timeout_s=SETUP_TIMEOUT_S)
    sub = WeightSubscriber(group.weights_endpoint, name="sampler")
    model, task = _policy(tiny_model_dir), CueTask(tiny_tokenizer, turns=TURNS)
    rewards, metrics, pending = [], [], None
    try:
        assert group.wait_for_subscribers(1, 30) == 1
        for step in range(MAX_STEPS):
            sent = group.publish_weights()
            got = sub.poll(timeout_ms=60_000)
            assert got is not None and got.version == sent["version"] == step
            load_weights(model, got.tensors)  # every policy tensor, lm_head.weight of the tied model included
            sub.ack(got.version)
            fresh = task.sample(model, GROUPS, GROUP_SIZE, version=got.version, seed=1000 * stage + step)
            batch, pending = (pending or fresh, fresh) if stale else (fresh, None)
            metrics.append(group.train_step(batch))
            rewards.append(float(np.mean([t.total_reward for t in fresh])))
            if len(rewards) >= 2 and np.mean(rewards[-2:]) >= 0.9:
                break
    finally:
        sub.close()
        group.shutdown()
    print(f"ZeRO-{stage} rewards by step: {[round(r, 2) for r in rewards]}")
    assert np.mean(rewards[:2]) < 0.3, rewards  # chance is 0.125
    assert np.mean(rewards[-2:]) >= 0.9, rewards
    for m in metrics:
        assert m["train/trajectories"] == GROUPS * GROUP_SIZE
        assert m["train/sampled_tokens"] == GROUPS * GROUP_SIZE * TURNS
        assert np.isfinite(m["train/grad_norm"]) and m["train/grad_norm"] > 0
        assert m["train/optimizer_steps"] == 2
        assert 0 <= m["train/clip_frac"] <= 1
    if autocast != "none":
        for m in metrics:  # on-policy: the weights measure the learner's rounding against the fp32 sampler
            assert m["train/staleness/0"] == 1.0
            assert abs(m["train/is_weight_mean"] - 1) < 0.02 and m["train/is_weight_max"] < 1.2
        assert max(abs(m["train/is_weight_mean"] - 1) for m in metrics) > 1e-5  # bfloat16 products did run
    elif not stale:
        for m in metrics:
            assert m["train/staleness/0"] == 1.0
            # the sampler's logprobs, from the published weights, match the learner's own to fp32 precision
            assert abs(m["train/is_weight_mean"] - 1) < 1e-4 and abs(m["train/is_weight_max"] - 1) < 1e-3
    else:
        later = metrics[1:]
        assert all(m["train/staleness/1"] == 1.0 for m in later)
        assert max(m["train/is_weight_max"] for m in later) > 1.01  # genuinely off-policy
        assert all(m["train/staleness/0"] == 0.0 for m in later)


def test_zero3_weights_equal_zero1_and_a_checkpoint_resumes(ray_local, tiny_model_dir, tiny_tokenizer,
                                                              tmp_path):
    """Same seeded batches through ZeRO-1 on one rank and ZeRO-3 on two (GAE with the value head, KL to the
    reference and the entropy bonus all on; one sequence per micro-batch, so the two ranks run different
    numbers of real micro-batches and the short one pads): gathered weights and gradient norms agree. Then a
    ZeRO-3 checkpoint, restored, replays the next step exactly."""
    from launch.job.learners import LearnerGroup

    algo = AlgorithmConfig(adv_estimator="gae", gamma=0.9, lam=0.95, kl_coef=0.05, entropy_coef=0.01)
    # cpu_autocast none: float32 products on every CPU, so the two stages' different summation orders differ by
    # float32 roundings (on a CPU with native bfloat16, `auto` would make them bfloat16 and drift ~1e-4 apart)
    common = dict(lr=1e-2, warmup_steps=1, micro_batch_tokens=10, ppo_epochs=2, mini_batches=1, seed=0,
                  num_cpus_per_rank=CPUS_PER_RANK, cpu_autocast="none")
    task = CueTask(tiny_tokenizer, turns=TURNS)
    initial = _policy(tiny_model_dir)
    # 15 trajectories (a dropped one makes the shards uneven), all sampled by version 0: stale later on
    batches = [task.sample(initial, 4, 4, version=0, seed=s)[:15] for s in (1, 2, 3)]
    before = {k: v.numpy().copy() for k, v in initial.state_dict().items()}

    one = LearnerGroup(tiny_model_dir, "float32", LearnerConfig(num_ranks=1, zero_stage=1, **common), algo,
                       weights_host=None, setup_timeout_s=SETUP_TIMEOUT_S)
    try:
        m_one = [one.train_step(b) for b in batches[:2]]
        w_one = _weights(one.gather_weights())
    finally:
        one.shutdown()

    three = LearnerGroup(tiny_model_dir, "float32", LearnerConfig(num_ranks=2, zero_stage=3, **common), algo,
                         weights_host=None, setup_timeout_s=SETUP_TIMEOUT_S)
    try:
        m_three = [three.train_step(b) for b in batches[:2]]
        w_three = _weights(three.gather_weights())
        three.save_policy(str(tmp_path / "policy"))  # written by rank 0 from its gathered weights
        three.save_checkpoint(str(tmp_path))
        m_next = three.train_step(batches[2])
        w_next = _weights(three.gather_weights())
        assert three.load_checkpoint(str(tmp_path)) == {"version": 2, "updates": 4}
        m_again = three.train_step(batches[2])
        w_again = _weights(three.gather_weights())
        assert three.version() == 3
    finally:
        three.shutdown()

    assert set(w_one) == set(w_three) == set(before)  # lm_head.weight included
    from core.models import folder_tensors

    saved = _weights(folder_tensors(tmp_path / "policy"))  # the policy folder holds exactly those weights
    assert set(saved) <= set(w_three) and len(saved) >= len(w_three) - 1  # a tied lm_head.weight may be left out
    assert all(np.array_equal(saved[k], w_three[k]) for k in saved)
    moved = max(float(np.abs(w_one[k] - before[k]).max()) for k in before)
    assert moved > 1e-3
    print("ZeRO-3 vs ZeRO-1 max abs weight difference:",
          max(float(np.abs(w_three[k] - w_one[k]).max()) for k in before), "moved:", moved)
    for k in before:
        np.testing.assert_allclose(w_three[k], w_one[k], atol=1e-4, rtol=0, err_msg=k)
    for a, b in zip(m_one, m_three):
        for key in ("grad_norm", "policy_loss", "value_loss", "kl_ref", "entropy", "is_weight_mean",
                    "is_weight_max", "truncated_frac"):
            assert a[f"train/{key}"] == pytest.approx(b[f"train/{key}"], rel=1e-4, abs=1e-6), key
        assert a["train/sampled_tokens"] == b["train/sampled_tokens"] == 15 * TURNS
    assert m_one[1]["train/is_weight_max"] > 1.0 and m_one[1]["train/value_loss"] > 0

    saved = tmp_path / "learner"
    assert list(saved.glob("*optim_states.pt")) and list(saved.glob("*model_states.pt"))
    for k in w_next:
        np.testing.assert_allclose(w_again[k], w_next[k], atol=1e-7, err_msg=k)
    assert m_again["train/grad_norm"] == pytest.approx(m_next["train/grad_norm"], rel=1e-6)
    assert max(float(np.abs(w_next[k] - w_three[k]).max()) for k in w_next) > 1e-4  # the step did move


def test_one_step_batches_skip_the_proximal_pass_with_the_same_result(ray_local, tiny_model_dir, tiny_tokenizer):
    """ppo_epochs = mini_batches = 1: the fused step (the training forward's own logprobs as the proximal ones)
    moves the weights exactly as the two-pass step does, on stale batches, with the same metrics."""
    from launch.job.learners import LearnerGroup

    task = CueTask(tiny_tokenizer, turns=TURNS)
    initial = _policy(tiny_model_dir)
    batches = [task.sample(initial, 4, 4, version=0, seed=s) for s in (5, 6)]
    results = {}
    for fuse in (True, False):
        cfg = LearnerConfig(num_ranks=1, zero_stage=1, lr=1e-2, micro_batch_tokens=64, seed=0,
                            num_cpus_per_rank=CPUS_PER_RANK, fuse_proximal_pass=fuse)
        group = LearnerGroup(tiny_model_dir, "float32", cfg, AlgorithmConfig(adv_estimator="grpo"),
                             weights_host=None, setup_timeout_s=SETUP_TIMEOUT_S)
        try:
            metrics = [group.train_step(b) for b in batches]
            results[fuse] = (metrics, _weights(group.gather_weights()))
        finally:
            group.shutdown()
    (m_fused, w_fused), (m_two, w_two) = results[True], results[False]
    before = {k: v.numpy() for k, v in initial.state_dict().items()}
    assert max(float(np.abs(w_fused[k] - before[k]).max()) for k in before) > 1e-3
    for k in w_two:
        np.testing.assert_allclose(w_fused[k], w_two[k], atol=1e-6, rtol=0, err_msg=k)
    for a, b in zip(m_fused, m_two):
        for key in ("grad_norm", "policy_loss", "entropy", "is_weight_mean", "is_weight_max", "clip_frac"):
            assert a[f"train/{key}"] == pytest.approx(b[f"train/{key}"], rel=1e-5, abs=1e-7), key
    assert m_fused[1]["train/is_weight_max"] > 1.0  # the second batch is off-policy: the weights are at work
