"""`python -m launch.bench learner`: learner training throughput and memory, ZeRO 1/2/3 with 1 and 2 ranks.

Each configuration starts fresh learner ranks on a local Ray (so that peak memory is its own), runs `--warmup`
train steps, then times `--steps` train steps on the same synthetic batch: multi-turn records of `--seq-len`
tokens, about half of them sampled, with GRPO advantages. A train step is the learner's whole step: the
proximal pass over the batch, then forward, backward and the optimizer step. Training tokens/s counts every
token of the batch (prompt, env and sampled) per second of train step. Peak memory is the largest peak RSS
among the ranks' processes (model, optimizer state and activations included).

The CPUs are shared out evenly: with `--cpus 2`, one rank gets two threads and two ranks get one each, so the
rows compare ways of using the same machine. Ratios against ZeRO-1 on one rank are printed side by side.
With `--attn packed_sdpa,sdpa` every configuration runs with each attention implementation (the first is the
one the bare keys name); `<attn>_over_<other>` is then the ratio of their training tokens/s, side by side.

The model is `--model PATH` (a Hugging Face folder). By default it is the converted SmolLM2-135M-Instruct in
the model cache (~/.cache/agentgym-rl/models/SmolLM2-135M-Instruct, written by the conversion of the embedded
default model); when that is missing the benchmark stops and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


from launch.bench.report import emit, table
from launch.bench.samples import make_trajectory

DEFAULT_MODEL = Path.home() / ".cache" / "agentgym-rl" / "models" / "SmolLM2-135M-Instruct"


def resolve_model(path: str) -> Path:
    model = Path(path).expanduser() if path else DEFAULT_MODEL
    if not (model / "config.json").is_file():
        raise SystemExit(
            f"bench learner: no model at {model}. Pass --model PATH (a Hugging Face folder: config.json, "
            f"safetensors, tokenizer), or convert the default SmolLM2-135M-Instruct into the model cache "
            f"first.")
    return model


def synthetic_batch(n: int, seq_len: int, turns: int, vocab: int, group_size: int = 4):
    batch = []
    for i in range(n):
        t = make_trajectory(num_tokens=seq_len, num_turns=turns, seed=i, trajectory_id=f"bench-{i}",
                            version=0)
        t.tokens = (t.tokens % vocab).astype(t.tokens.dtype)
        t.group_id = f"group-{i // group_size}"
        t.turn_rewards[-1] = float(i % 2)  # rewards differ within each group: non-zero advantages
        t.validate()
        batch.append(t)
    return batch


def _measure(model: Path, args, cfg, algorithm, batch, name: str) -> tuple[float, float, float, float]:
    """(setup seconds, seconds per timed train step, peak MB of the largest rank, last grad norm)."""
    from launch.job.learners import LearnerGroup  # after connect(): see main

    start = time.perf_counter()
    group = LearnerGroup(str(model), args.dtype, cfg, algorithm, weights_host=None, name=name)
    setup_s = time.perf_counter() - start
    try:
        for _ in range(args.warmup):
            group.train_step(batch)
        start = time.perf_counter()
        for _ in range(args.steps):
            metrics = group.train_step(batch)
        step_s = (time.perf_counter() - start) / args.steps
        peak = max(m["rss_mb"] for m in group.peak_memory_mb())
    finally:
        group.shutdown()
    return setup_s, step_s, peak, metrics["train/grad_norm"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.bench learner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="Hugging Face model folder (default: SmolLM2-135M)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--stages", default="1,2,3", help="ZeRO stages, comma-separated")
    parser.add_argument("--ranks", default="1,2", help="learner rank counts, comma-separated")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs shared by the ranks")
    parser.add_argument("--seqs", type=int, default=4, help="sequences per batch")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--turns", type=int, default=4, help="agent turns per sequence")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048, help="token budget of a micro-batch")
    parser.add_argument("--attn", default="packed_sdpa",
                        help="learner.attn_implementation, comma-separated: each configuration runs with each")
    parser.add_argument("--warmup", type=int, default=1, help="untimed train steps first")
    parser.add_argument("--steps", type=int, default=2, help="timed train steps")
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from launch.job.ray_cluster import connect, shutdown

    model = resolve_model(args.model)
    connect(num_cpus=args.cpus)  # before anything imports ray, so that the local Ray stays on loopback

    from configs.learner import AlgorithmConfig, LearnerConfig

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    batch = synthetic_batch(args.seqs, args.seq_len, args.turns, vocab)
    batch_tokens = sum(t.num_tokens for t in batch)
    sampled = sum(int(t.loss_mask.sum()) for t in batch)
    print(f"model {model}, {args.dtype}; batch {len(batch)} x {args.seq_len} tokens ({sampled} sampled), "
          f"micro-batches of {args.micro_batch_tokens} tokens; {args.cpus} CPUs shared by the ranks")
    attns = args.attn.split(",")
    configs = [(a, int(s), int(r)) for s in args.stages.split(",") for r in args.ranks.split(",") for a in attns]
    rows, figures, base, first_tps = [], {}, None, {}
    headers = ["attention", "stage", "ranks", "cpus/rank", "setup s", "step s", "tokens/s", "vs first", "peak MB/rank",
               "grad norm"]
    try:
        bar = tqdm(configs, desc="bench learner", unit="config")
        for attn, stage, ranks in bar:
            try:
                setup_s, step_s, peak, grad_norm = _measure(
                    model, args, LearnerConfig(
                        num_ranks=ranks, zero_stage=stage, num_cpus_per_rank=args.cpus / ranks, lr=1e-6,
                        micro_batch_tokens=args.micro_batch_tokens, seed=0, attn_implementation=attn),
                    AlgorithmConfig(adv_estimator="grpo"), batch, f"bench-z{stage}-r{ranks}")
            except Exception as exc:  # e.g. a rank killed for memory: the other configurations still count
                rows.append([attn, f"ZeRO-{stage}", ranks, args.cpus / ranks, "failed", type(exc).__name__]
                            + [""] * 4)
                bar.write(f"ZeRO-{stage} with {ranks} rank(s) failed: {str(exc).splitlines()[0][:200]}")
                continue
            tps = batch_tokens / step_s
            base = base or tps
            suffix = "" if attn == attns[0] else f"_{attn}"
            figures[f"tokens_per_s_zero{stage}_{ranks}rank{suffix}"] = tps
            figures[f"peak_mb_zero{stage}_{ranks}rank{suffix}"] = peak
            if attn == attns[0]:
                first_tps[stage, ranks] = tps
            elif (stage, ranks) in first_tps:
                figures[f"{attns[0]}_over_{attn}_zero{stage}_{ranks}rank"] = first_tps[stage, ranks] / tps
            rows.append([attn, f"ZeRO-{stage}", ranks, args.cpus / ranks, setup_s, step_s, tps, tps / base, peak,
                         grad_norm])
            bar.write(table(headers, rows[-1:]).splitlines()[-1])
    finally:
        shutdown()
    print(table(headers, rows))
    emit(figures)
    return 0
