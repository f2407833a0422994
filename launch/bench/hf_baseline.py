"""Hugging Face `generate` baselines of `launch.bench generator`, in a process of their own with HF's default threading.

The generator bench sets `OMP_WAIT_POLICY` (the generator actor's setting) for its own process before torch
loads, which would slow HF's CPU kernels if HF ran there; a user running HF would not set it. So the baselines
run here, started with the bench's environment minus the OpenMP variables the bench set, and torch's default
thread count. Prints one JSON line: tokens and seconds of each baseline, and the threading it ran with.
Usage (by the bench): `python -m launch.bench.hf_baseline SPEC.json`, SPEC = {model_dir, prompts, max_tokens,
hf_requests, dtype}.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_clean(model_dir: Path, prompts: list[list[int]], max_tokens: int, hf_requests: int, dtype: str,
              spec_path: Path, restore: dict[str, str | None], timeout_s: float = 3600) -> dict:
    """Run both HF baselines in a fresh process with `restore`'s variables as they were before the bench set
    them (None: unset); their figures."""
    spec_path.write_text(json.dumps({"model_dir": str(model_dir), "prompts": prompts, "max_tokens": max_tokens,
                                     "hf_requests": hf_requests, "dtype": dtype}))
    env = {k: v for k, v in os.environ.items() if k not in restore}
    env.update({k: v for k, v in restore.items() if v is not None})
    done = subprocess.run([sys.executable, "-m", "launch.bench.hf_baseline", str(spec_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the HF baseline process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_one_at_a_time(model_dir: Path, prompts: list[list[int]], max_tokens: int, dtype: str) -> tuple[int, float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=True, pad_token_id=eos)  # warm-up
        tokens, t0 = 0, time.monotonic()
        for p in prompts:
            out = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, pad_token_id=eos)
            tokens += out.shape[1] - len(p)
    elapsed = time.monotonic() - t0
    del model
    gc.collect()
    return tokens, elapsed


def hf_batched(model_dir: Path, prompts: list[list[int]], max_tokens: int, dtype: str) -> tuple[int, float]:
    """Hugging Face `generate` on every prompt at once: left-padded to the longest, with an attention mask.
    A row's tokens are counted up to and including its first end-of-sequence token (what follows is padding)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    pad = next(iter(eos_ids))
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=True, pad_token_id=pad)
        t0 = time.monotonic()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, pad_token_id=pad)
    elapsed = time.monotonic() - t0
    tokens = 0
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos_ids]
        tokens += ends[0] + 1 if ends else len(row)
    del model
    gc.collect()
    return tokens, elapsed


def main(argv: list[str]) -> int:
    import torch

    spec = json.loads(Path(argv[0]).read_text())
    model_dir, prompts = Path(spec["model_dir"]), spec["prompts"]
    one_tokens, one_s = hf_one_at_a_time(model_dir, prompts[:spec["hf_requests"]], spec["max_tokens"], spec["dtype"])
    batch_tokens, batch_s = hf_batched(model_dir, prompts, spec["max_tokens"], spec["dtype"])
    print(json.dumps({"one_tokens": one_tokens, "one_s": one_s, "batched_tokens": batch_tokens,
                      "batched_s": batch_s, "torch_threads": torch.get_num_threads(),
                      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
