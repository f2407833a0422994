"""Hugging Face `generate` baselines of `launch.bench generator`, in a process of their own with HF's default threading.

The generator bench sets `OMP_WAIT_POLICY` (the generator actor's setting) for its own process before torch
loads, which would slow HF's CPU kernels if HF ran there; a user running HF would not set it. So the baselines
run here, started with the bench's environment minus the OpenMP variables the bench set, and torch's default
thread count. Prints one JSON line: tokens and seconds of each baseline, and the threading it ran with.
Usage (by the bench): `python -m launch.bench.hf_baseline SPEC.json`, SPEC = {model_dir, prompts, max_tokens,
hf_requests, dtype}.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
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


def main(argv: list[str]) -> int:
    import torch

    from launch.bench.generator import hf_batched, hf_one_at_a_time

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
