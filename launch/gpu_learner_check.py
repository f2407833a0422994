"""GPU check of the learner: `python -m launch.gpu_learner_check` on a machine with a GPU; it needs DeepSpeed,
transformers, pyzmq and msgpack, not Ray and not vLLM (launch.gpu_check covers the generator).

Each case runs in a process of its own (one process group each), as learner rank 0 of 1 on cuda:0 with NCCL,
on the tiny test model (core.tiny_model):
- `learn-<dtype>-zero<stage>`: the cue task of core/cue_task.py, sampled on the CPU by a float32 copy of the
  policy that takes each version over the weights channel (ZeroMQ; shared memory on one node) as a generator
  does. It must reach a mean reward of 0.9 from chance (1/8). On-policy, the importance weights must stay near
  1: a packed micro-batch whose sequences saw each other on the GPU would put them far off. Then a checkpoint:
  save, one more step, restore, the same step again: the weights must come out the same up to the GPU's
  non-deterministic reductions.
- `ipc`: the weights group (`transport.weights_sync=collective`) with a receiver process on the same GPU, as a
  colocated vLLM worker would be: the group must pick CUDA IPC, and two versions must arrive equal to the
  learner's gathered weights, in the engine's dtype.
- `fixed-<dtype>-zero<stage>`: six steps on fixed batches (all sampled by the initial model, so later steps are
  off-policy); the weights after them must agree between the stages run of one dtype (FIXED_TOL).
- `throughput`: whole learner steps (bfloat16, ZeRO-2, sdpa) of a random model of SmolLM2-135M's shape on
  `--throughput` random sequences: tokens per second and peak GPU memory.
A case name may add DeepSpeed settings for diagnosis: `+key=json` sets zero_optimization.key, `+a.b=json`
sets the config's a.b (e.g. `learn-bfloat16-zero3+data_types.grad_accum_dtype="bf16"`). `--all-steps` runs
every learn case for its 40 steps instead of stopping once it has learned, to show that it stays learned.

What it found on an H200 (docs/gpu.md, "What has run on a GPU"): a bfloat16 learner whose gradients added up
in bfloat16 over micro-batches collapsed after learning; gradients now add up in float32
(actors/zero_engine.py), and the check `float32_gradient_sums` keeps it so.

`--device cpu` runs the same cases on gloo (how the script itself is tested without a GPU). Prints one JSON
line per case and a summary; exit code 1 unless every case passed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import traceback

import numpy as np

from launch.gpu.learner_cases import FIXED_TOL, fixed_case, ipc_case, learn_case, throughput_case

DEFAULT_CASES = ("learn-bfloat16-zero2,learn-bfloat16-zero3,learn-float32-zero3,fixed-bfloat16-zero1,"
                 "fixed-bfloat16-zero3,fixed-float32-zero1,fixed-float32-zero3,ipc,throughput")


def _compare_fixed(results: dict) -> dict:
    """Each fixed case's weights against the first fixed case of its dtype: the largest difference."""
    out, first = {}, {}
    for name, r in results.items():
        if not name.startswith("fixed-") or "weights" not in r:
            continue
        dtype = name.split("-")[1]
        if dtype not in first:
            first[dtype] = (name, r["weights"])
            continue
        ref_name, ref = first[dtype]
        out[f"{name} vs {ref_name}"] = max(float(np.abs(r["weights"][k] - ref[k]).max()) for k in ref)
    return out


def parse_case(name: str) -> tuple[str, str, int, dict]:
    """(kind, dtype, ZeRO stage, DeepSpeed options) of a case name; ValueError naming what is wrong."""
    if name in ("ipc", "throughput"):
        return name, "", 0, {}
    base, *extra = name.split("+")
    parts = base.split("-")
    if len(parts) != 3 or parts[0] not in ("learn", "fixed") or parts[1] not in ("float32", "bfloat16") \
            or parts[2] not in ("zero1", "zero2", "zero3"):
        raise ValueError(f"case {name!r}: expected ipc, throughput or <learn|fixed>-<float32|bfloat16>-zero<1|2|3>"
                         "[+key=json ...]")
    options = {}
    for item in extra:
        key, sep, value = item.partition("=")
        try:
            options[key] = json.loads(value) if sep and key else None
        except json.JSONDecodeError:
            options[key] = None
        if options[key] is None:
            raise ValueError(f"case {name!r}: {item!r} is not key=<json value>")
    return parts[0], parts[1], int(parts[2].removeprefix("zero")), options


def _run_case(name: str, fn, args, out) -> None:
    try:
        out.put((name, fn(*args)))
    except BaseException:
        out.put((name, {"passed": False, "error": traceback.format_exc()[-4000:]}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.gpu_learner_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--cases", default=DEFAULT_CASES,
                   help="comma-separated: learn-<float32|bfloat16>-zero<1|2|3>[+zero_key=json ...], "
                   "fixed-<dtype>-zero<stage>[+...], ipc, throughput")
    p.add_argument("--throughput", type=int, nargs=3, default=(64, 1024, 4), metavar=("SEQS", "LEN", "STEPS"),
                   help="the throughput case's batch (sequences, tokens each) and timed steps")
    p.add_argument("--all-steps", action="store_true", help="learn cases run all their steps (no early stop)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a case may take")
    args = p.parse_args(argv)
    from core.tiny_model import build_tiny_model

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device is visible: run with --device cpu", file=sys.stderr)
            return 2
    try:
        cases = {name: parse_case(name) for name in args.cases.split(",")}
    except ValueError as exc:
        p.error(str(exc))
    model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-model-")))
    ctx = mp.get_context("spawn")
    summary, results = {}, {}
    for name, (kind, dtype, stage, options) in cases.items():
        if kind == "ipc":
            fn, fargs = ipc_case, (model_dir, args.device)
        elif kind == "throughput":
            fn, fargs = throughput_case, (args.device, "bfloat16" if args.device == "cuda" else "float32",
                                          *args.throughput)
        elif kind == "learn":
            fn, fargs = learn_case, (model_dir, dtype, stage, args.device, options, args.all_steps)
        else:
            fn, fargs = fixed_case, (model_dir, dtype, stage, args.device, options)
        out = ctx.Queue()
        start = time.monotonic()
        proc = ctx.Process(target=_run_case, args=(name, fn, fargs, out))
        proc.start()
        try:
            _, result = out.get(timeout=args.timeout)
        except Exception:
            result = {"passed": False, "error": f"no result within {args.timeout:.0f} s (exit {proc.exitcode})"}
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        result["seconds"] = round(time.monotonic() - start, 1)
        results[name] = result
        print(json.dumps({"case": name, **{k: v for k, v in result.items() if k != "weights"}}, default=str),
              flush=True)
        summary[name] = bool(result.get("passed"))
    if any(n.startswith("fixed-") for n in results):
        diffs = _compare_fixed(results)
        summary["fixed_stages_agree"] = all(d <= FIXED_TOL[pair.split("-")[1]] for pair, d in diffs.items())
        print(json.dumps({"fixed_max_abs_diff": diffs}), flush=True)
    print(json.dumps({"summary": summary, "passed": all(summary.values())}), flush=True)
    return 0 if all(summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
