"""The generator check's verdict (`launch.gpu_check`): the tolerances of each dtype, the checks one run's figures
must pass, whether to pass, retry in the next dtype or fail, and the one JSON line that says so.
"""
from __future__ import annotations

from dataclasses import dataclass


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
# The logprob move of an update (noise launch.gpu.compare.NOISE_SCALE) must clear MOVE_FACTOR x the mean
# tolerance, so that a generator that kept its old weights cannot pass.
MOVE_FACTOR = 4.0


def within(stats: dict, tol: Tolerance) -> bool:
    return stats["max_abs"] < tol.max_abs and stats["mean_abs"] < tol.mean_abs


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
