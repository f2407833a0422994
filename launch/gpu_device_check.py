"""Device check that fits a lent GPU machine: `python -m launch.gpu_device_check` needs torch, transformers and
msgpack, and never imports vLLM, Ray or DeepSpeed (its JSON line lists any of them that got imported, and fails
then). One JSON line; a few minutes on one GPU.

Parts (each in `parts`, with its checks; `ok` when every part that ran passed):
- `collective_ipc` (CUDA): learner rank 0 sends two versions of SmolLM2-135M's shape (270 MB in bfloat16) in
  buckets of `--bucket-mb` to a receiver process on the same GPU through CUDA IPC (actors.weights.group_buckets,
  actors.weights.cuda_ipc); bit for bit, acked, and each side's peak GPU memory above what it held before the
  version within two buckets.
- `collective_nccl` (CUDA, two GPUs or more; skipped with the reason otherwise): the same with the receiver
  seeing only the second GPU, as a Ray run's generator does, so NCCL broadcasts through two buffers a side.
- `collective_gloo` (`--device cpu`): the same broadcast code on gloo.
- `packed_sdpa`: a random model of SmolLM2-135M's shape (`--device cpu`: a tiny one) scores one packed row of
  several sequences with `packed_sdpa` and with `sdpa` (a dense mask), in bfloat16, against a float32 `sdpa`
  reference: packed_sdpa's logits and gradients must be as close to the reference as sdpa's own are (within
  twice sdpa's relative error, plus 1e-3), and each kernel's forward+backward tokens/s is reported.

The learner's own device check is `launch.gpu_learner_check` (it needs DeepSpeed). `--device cpu` runs every
part that can run without a GPU (tests/test_gpu_device_check.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

HEAVY = ("vllm", "ray", "deepspeed")


def rel_err(a, b) -> float:
    """|a - b| / |b| over all elements (Frobenius norms, in float64)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def packed_row(lengths: list[int], vocab: int, device, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, sum(lengths)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids.to(device), pos.to(device)


def score(model, ids, pos):
    """Logits and gradients of a learner-like loss: the sum of every next token's logprob."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    logp = logits.float().log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None]).sum()
    logp.backward()
    return logits.detach().float(), {n: p.grad.detach().float() for n, p in model.named_parameters()
                                     if p.grad is not None}


def packed_sdpa_case(device: str, small: bool, lengths: list[int], reps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from core.packed_attention import register

    register()
    dev = torch.device(device)
    if small:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192)
    else:  # SmolLM2-135M's shape
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).to(dev)
    ids, pos = packed_row(lengths, cfg.vocab_size, dev)
    ref_logits, ref_grads = score(model, ids, pos)  # float32, sdpa with its dense mask
    state = {k: v.clone() for k, v in model.state_dict().items()}
    out: dict = {"tokens": int(ids.numel()), "sequences": len(lengths), "parameters": model.num_parameters()}
    got = {}
    for attn in ("packed_sdpa", "sdpa"):
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16).to(dev)
        m.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
        logits, grads = score(m, ids, pos)
        got[attn] = (logits, grads)
        grad_err = rel_err(torch.cat([grads[n].flatten() for n in sorted(ref_grads)]),
                           torch.cat([ref_grads[n].flatten() for n in sorted(ref_grads)]))
        for _ in range(2):  # warm-up (kernel selection, allocator)
            score(m, ids, pos)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            score(m, ids, pos)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = (time.perf_counter() - t0) / reps
        out[attn] = {"logits_rel_err_vs_fp32": rel_err(logits, ref_logits), "grads_rel_err_vs_fp32": grad_err,
                     "tokens_per_s_fwd_bwd": ids.numel() / seconds, "seconds_per_step": seconds}
        del m
    (pl, pg), (sl, sg) = got["packed_sdpa"], got["sdpa"]
    out["packed_vs_sdpa"] = {"logits_rel_diff": rel_err(pl, sl),
                             "grads_rel_diff": rel_err(torch.cat([pg[n].flatten() for n in sorted(sg)]),
                                                       torch.cat([sg[n].flatten() for n in sorted(sg)]))}
    p, s = out["packed_sdpa"], out["sdpa"]
    checks = {"logits_within_bf16": p["logits_rel_err_vs_fp32"] <= 2 * s["logits_rel_err_vs_fp32"] + 1e-3,
              "grads_within_bf16": p["grads_rel_err_vs_fp32"] <= 2 * s["grads_rel_err_vs_fp32"] + 1e-3,
              "same_parameters_have_grads": set(pg) == set(sg) == set(ref_grads)}
    out.update(checks=checks, passed=all(checks.values()))
    return out


def run(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from launch.gpu.device_collective import collective_case, model_shapes

    started = time.monotonic()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("launch.gpu_device_check: no GPU visible (use --device cpu for the CPU form)")
    gpus = torch.cuda.device_count() if cuda else 0
    small = not cuda
    shapes = model_shapes(4, 96, 384, 1024) if small else model_shapes(30, 576, 1536, 49152)
    bucket = (args.bucket_mb << 20) if cuda else 256 << 10
    parts: dict = {}

    def attempt(name: str, fn) -> None:
        try:
            parts[name] = fn()
        except Exception as exc:
            parts[name] = {"error": f"{type(exc).__name__}: {exc}"[:1500], "passed": False}
        print(f"gpu_device_check: {name}: {'passed' if parts[name].get('passed') else 'FAILED'}",
              file=sys.stderr, flush=True)

    if cuda:
        attempt("collective_ipc", lambda: collective_case("ipc", shapes, bucket))
        if gpus >= 2:
            attempt("collective_nccl", lambda: collective_case("nccl", shapes, bucket))
        else:
            parts["collective_nccl"] = {"skipped": f"{gpus} GPU visible: NCCL between two processes needs two"}
    else:
        attempt("collective_gloo", lambda: collective_case("gloo", shapes, bucket))
    lengths = [512, 1024, 256, 1536, 768] if cuda else [40, 7, 64, 21]
    attempt("packed_sdpa", lambda: packed_sdpa_case(args.device, small, lengths, args.reps if cuda else 1))
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
    ran = [p for p in parts.values() if "skipped" not in p]
    return {"ok": bool(ran) and all(p.get("passed") for p in ran) and not heavy, "check": "gpu_device_check",
            "device": args.device, "card": torch.cuda.get_device_name(0) if cuda else "cpu", "gpus": gpus,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "heavy_imports": heavy, "parts": parts, "total_s": round(time.monotonic() - started, 1)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.gpu_device_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--bucket-mb", type=int, default=32,
                   help="bucket size on CUDA (the 270 MB version then spans 8 or more); the CPU form uses 256 KB")
    p.add_argument("--reps", type=int, default=10, help="timed forward+backward steps per kernel on CUDA")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    out = run(parse(argv))
    print(json.dumps(out, sort_keys=True, default=str), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
