"""The cases of launch.gpu_learner_check (its docstring says what each checks), each run in a process of its
own."""
from __future__ import annotations

import multiprocessing as mp
import tempfile
import traceback

import numpy as np

LOOPBACK = "127.0.0.1"
MAX_STEPS, GROUPS, GROUP_SIZE, TURNS = 40, 16, 8, 3
# On-policy importance weights: float32 learner against the float32 sampler is rounding only (the CPU test asks
# 1e-4 on the mean); a bfloat16 learner rounds every weight and activation (unit roundoff 2^-8), and the tiny
# model's logprobs moved by a few percent under that.
IS_MEAN_TOL = {"float32": 1e-3, "bfloat16": 0.05}
REPLAY_TOL = {"float32": 1e-4, "bfloat16": 2e-2}  # max |w| difference after the replayed step
# Weights after the same fixed batches on two ZeRO stages: float32 agreed to 2e-5 on an H200 (different
# reduction orders); bfloat16 stages 2 and 3 were identical, and stage 1 (DeepSpeed's BF16_Optimizer) one
# bfloat16 rounding away (0.018 on weights of size 2-4, whose spacing there is 0.016).
FIXED_TOL = {"float32": 1e-4, "bfloat16": 0.04}


def _learner(model_dir: str, dtype: str, stage: int, device: str, publisher=None, micro_batch_tokens: int = 256,
             mini_batches: int = 2):
    from actors.learner import Learner
    from configs.learner import AlgorithmConfig, LearnerConfig

    cfg = LearnerConfig(num_ranks=1, zero_stage=stage, lr=1e-2, micro_batch_tokens=micro_batch_tokens,
                        mini_batches=mini_batches, seed=0, cpu_autocast="none",
                        num_gpus_per_rank=1 if device == "cuda" else 0, num_cpus_per_rank=1)
    # cpu_autocast none: a case trains in the dtype it names. With the default (auto), a CPU that multiplies
    # bfloat16 natively would run the float32 cases' products in bfloat16, and ZeRO stages that sum in different
    # orders would then drift apart by bfloat16 roundings (0.007 after 6 steps on a Zen 4 CPU) instead of float32
    # ones. A GPU ignores the setting.
    learner = Learner(0, 1, model_dir, dtype, cfg, AlgorithmConfig(adv_estimator="grpo"))
    port = learner.listen(LOOPBACK)
    info = learner.setup(LOOPBACK, port, publisher)
    return learner, info


def _samples(batch):
    from actors.learner import prepare_samples
    from configs.learner import AlgorithmConfig

    return prepare_samples(batch, AlgorithmConfig(adv_estimator="grpo"))


def _weights(tensors) -> dict[str, np.ndarray]:
    from core.cue_task import tensor_of

    return {t.name: tensor_of(t).float().numpy() for t in tensors}


def _zero_options(options: dict) -> None:
    """Diagnostics: extra DeepSpeed settings for this process's engines (a case's `+key=value` parts): a plain key
    goes under zero_optimization, a dotted one (`data_types.grad_accum_dtype`) from the config's top."""
    from actors import zero_engine

    plain = zero_engine.deepspeed_config

    def patched(*args, **kwargs) -> dict:
        config = plain(*args, **kwargs)
        for key, value in options.items():  # "a.b": config["a"]["b"]; a plain key: under zero_optimization
            *path, last = key.split(".") if "." in key else ("zero_optimization", key)
            node = config
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return config
    zero_engine.deepspeed_config = patched


def learn_case(model_dir: str, dtype: str, stage: int, device: str, options: dict, all_steps: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.learner import PublisherOptions
    from core.cue_task import CueTask, load_weights
    from core.weights.subscriber import WeightSubscriber

    _zero_options(options)
    learner, info = _learner(model_dir, dtype, stage, device, PublisherOptions(host=LOOPBACK))
    sub = WeightSubscriber(info["weights_endpoint"], name="sampler")
    sampler = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    task = CueTask(AutoTokenizer.from_pretrained(model_dir), turns=TURNS)
    rewards, metrics = [], []
    try:
        assert learner.wait_for_subscribers(1, 60) == 1, "the sampler did not subscribe"
        for step in range(MAX_STEPS):
            sent = learner.publish_weights()
            got = sub.poll(timeout_ms=60_000)
            assert got is not None and got.version == sent["version"] == step, (step, sent, got)
            load_weights(sampler, got.tensors)
            sub.ack(got.version)
            batch = task.sample(sampler, GROUPS, GROUP_SIZE, version=got.version, seed=1000 * stage + step)
            metrics.append(learner.train_step(_samples(batch)))
            rewards.append(float(np.mean([t.total_reward for t in batch])))
            if not all_steps and len(rewards) >= 2 and np.mean(rewards[-2:]) >= 0.9:
                break
        is_mean = max(abs(m["train/is_weight_mean"] - 1) for m in metrics)
        replay = _replay(learner, task, sampler, stage)
        memory = learner.peak_memory_mb()
        accumulation = str(learner.engine.get_data_types()[1]).removeprefix("torch.")
    finally:
        sub.close()
        learner.close()
    checks = {"learned": bool(np.mean(rewards[-2:]) >= 0.9 and np.mean(rewards[:2]) < 0.3),
              "is_weight_near_1": is_mean < IS_MEAN_TOL[dtype],
              "finite": all(np.isfinite(m["train/grad_norm"]) for m in metrics),
              "checkpoint_replays": replay < REPLAY_TOL[dtype],
              "float32_gradient_sums": accumulation == "float32"}
    trace = {k: [round(float(m[f"train/{k}"]), 4) for m in metrics]
             for k in ("grad_norm", "is_weight_mean", "is_weight_max", "clip_frac", "entropy", "policy_loss")}
    return {"steps": len(rewards), "rewards": [round(r, 2) for r in rewards], "is_weight_mean_dev": is_mean,
            "trace": trace,
            "replay_max_abs": replay, "step_s": float(np.median([m["train/step_seconds"] for m in metrics])),
            "memory_mb": memory, "checks": checks, "passed": all(checks.values())}


def fixed_case(model_dir: str, dtype: str, stage: int, device: str, options: dict, steps: int = 6) -> dict:
    """`steps` train steps on fixed batches, all sampled by the initial model on the CPU (so later steps are
    off-policy): the weights after them, to compare stages with each other."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.cue_task import CueTask

    _zero_options(options)
    learner, _ = _learner(model_dir, dtype, stage, device)
    sampler = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    task = CueTask(AutoTokenizer.from_pretrained(model_dir), turns=TURNS)
    try:
        norms = [learner.train_step(_samples(task.sample(sampler, GROUPS, GROUP_SIZE, version=0, seed=s)))
                 ["train/grad_norm"] for s in range(steps)]
        weights = _weights(learner.gather_weights())
    finally:
        learner.close()
    return {"grad_norms": [round(n, 5) for n in norms], "weights": weights, "passed": all(np.isfinite(norms))}


def _replay(learner, task, sampler, stage: int) -> float:
    """Save, step, restore, the same step again: the largest weight difference between the two outcomes."""
    batch = task.sample(sampler, 4, 4, version=learner.get_version(), seed=7 + stage)
    with tempfile.TemporaryDirectory() as path:
        learner.save_checkpoint(path)
        learner.train_step(_samples(batch))
        first = _weights(learner.gather_weights())
        learner.load_checkpoint(path)
        learner.train_step(_samples(batch))
        second = _weights(learner.gather_weights())
    return float(max(np.abs(first[k] - second[k]).max() for k in first))


def _ipc_receiver(endpoint: str, versions: int, device: str, out) -> None:
    import torch

    from actors.weights.group_subscriber import CollectiveSubscriber
    from actors.weights.group import Group, receive
    from actors.weights.cuda_ipc import Importer

    try:
        sub = CollectiveSubscriber(endpoint, "replica-0", timeout_s=120)
        group = Group(sub.host, sub.port, 1, 2, torch.device(device, 0) if device == "cuda" else torch.device("cpu"),
                      timeout_s=120)
        importer = Importer(group.source_index) if group.ipc else None
        for _ in range(versions):
            seq, _, ann, _ = sub.next(lambda: False)
            got = receive(group, ann, torch.bfloat16, ipc=importer)
            out.put((ann.version, ann.mode, group.ipc, {n: t.float().cpu().numpy() for n, t in got},
                     {n: str(t.dtype) for n, t in got}))
            sub.ack(seq, True)
        group.close()
    except BaseException:
        out.put(("error", traceback.format_exc()))


def ipc_case(model_dir: str, device: str) -> dict:
    """The learner (bfloat16, ZeRO-2) publishes two versions by the weights group to a receiver on its GPU."""
    from actors.learner import PublisherOptions
    from core.cue_task import CueTask

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    options = PublisherOptions(host=LOOPBACK, sync="collective", subscribers=["replica-0"], timeout_s=120)
    learner, info = _learner(model_dir, "bfloat16", 2, device, options)
    proc = ctx.Process(target=_ipc_receiver, args=(info["weights_endpoint"], 2, device, out), daemon=True)
    proc.start()
    results, expected = [], []
    try:
        learner.wait_for_subscribers(1, 120)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        sampler = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        task = CueTask(AutoTokenizer.from_pretrained(model_dir), turns=TURNS)
        for k in range(2):
            expected.append(_weights(learner.gather_weights()))
            learner.publish_weights()
            results.append(out.get(timeout=120))
            if results[-1][0] == "error":
                raise RuntimeError(f"receiver: {results[-1][1]}")
            acks = learner.wait_acks(learner.get_version(), 60)
            assert acks.get("replica-0", (False,))[0], acks
            learner.train_step(_samples(task.sample(sampler, 4, 4, version=k, seed=k)))
    finally:
        learner.close()
        proc.join(30)
    diffs = [max(float(np.abs(got[n] - want[n]).max()) for n in want) for (_, _, _, got, _), want
             in zip(results, expected)]
    missing = [sorted(set(want) - set(got)) for (_, _, _, got, _), want in zip(results, expected)]
    checks = {"ipc_mode": all(r[1] == "ipc" for r in results) if device == "cuda" else True,
              "versions_in_order": [r[0] for r in results] == [0, 1],
              "every_tensor": not any(missing),
              "equal_to_learner": max(diffs) == 0.0,
              "engine_dtype": all(set(r[4].values()) == {"torch.bfloat16"} for r in results),
              "versions_differ": any(float(np.abs(expected[0][n] - expected[1][n]).max()) > 0 for n in expected[0])}
    return {"modes": [r[1] for r in results], "max_abs_diff": diffs, "missing": missing, "checks": checks,
            "passed": all(checks.values())}


def _smollm_shaped(path: str, seed: int = 0) -> str:
    """A random model of SmolLM2-135M's shape (30 layers, width 576, 9 heads over 3 KV heads, vocab 49152, tied
    embeddings), saved to `path`: the default model's cost without its files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def throughput_case(device: str, dtype: str, seqs: int, seq_len: int, steps: int) -> dict:
    """Train steps of the SmolLM2-135M-shaped model on `seqs` random sequences of `seq_len` tokens (the second
    half sampled): tokens per second of a whole learner step, and peak GPU memory."""
    from core.trajectory import Termination, Trajectory

    model_dir = _smollm_shaped(tempfile.mkdtemp(prefix="smollm-shape-"))
    learner, _ = _learner(model_dir, dtype, 2, device, micro_batch_tokens=8192, mini_batches=1)
    rng = np.random.default_rng(0)

    def batch(version: int) -> list:
        out = []
        for i in range(seqs):
            mask = np.zeros(seq_len, np.uint8)
            mask[seq_len // 2:] = 1
            out.append(Trajectory(
                trajectory_id=f"t{version}-{i}", group_id=f"g{version}-{i // 4}", item_id=f"i{i // 4}", env="random",
                tokens=rng.integers(0, 49152, seq_len).astype(np.int32), loss_mask=mask,
                logprobs=np.where(mask, -10.8, 0).astype(np.float32),  # about log(1 / 49152): uniform
                versions=np.where(mask, version, -1)
                .astype(np.int32), turn_ends=np.array([seq_len], np.int32),
                turn_rewards=np.array([float(rng.random() < 0.5)], np.float32), horizon=1,
                termination=Termination.DONE, sample_index=i % 4))
        return out
    try:
        seconds = []
        for step in range(steps + 1):  # the first is warm-up
            m = learner.train_step(_samples(batch(step)))
            seconds.append(m["train/step_seconds"])
        memory = learner.peak_memory_mb()
    finally:
        learner.close()
    median = float(np.median(seconds[1:]))
    return {"dtype": dtype, "batch": f"{seqs} x {seq_len}", "step_s": [round(s, 3) for s in seconds],
            "tokens_per_s": round(seqs * seq_len / median), "memory_mb": memory,
            "policy_loss": m["train/policy_loss"], "grad_norm": m["train/grad_norm"],
            "passed": bool(np.isfinite(m["train/grad_norm"]) and np.isfinite(m["train/policy_loss"]))}
