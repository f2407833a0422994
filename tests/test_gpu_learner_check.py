"""launch.gpu_learner_check on the CPU (`--device cpu`: DeepSpeed on gloo, the weights group by gloo broadcast
instead of CUDA IPC): the same cases it runs on a GPU pass, and their checks are really computed."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CASES = "learn-bfloat16-zero2,fixed-bfloat16-zero2,fixed-bfloat16-zero3,fixed-float32-zero1,fixed-float32-zero3,ipc"


def test_learner_check_passes_on_cpu():
    proc = subprocess.run([sys.executable, "-m", "launch.gpu_learner_check", "--device", "cpu", "--cases", CASES,
                           "--timeout", "240"], capture_output=True, text=True, timeout=900)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_case = {line["case"]: line for line in lines if "case" in line}
    assert set(by_case) == set(CASES.split(",")), proc.stdout[-3000:] + proc.stderr[-3000:]
    learn = by_case["learn-bfloat16-zero2"]
    assert learn["checks"] == {"learned": True, "is_weight_near_1": True, "finite": True,
                               "checkpoint_replays": True, "float32_gradient_sums": True}, learn
    # the learner's bfloat16 logprobs differ from the float32 sampler's, so the weights measured something
    assert 0 < learn["is_weight_mean_dev"] < 0.05
    ipc = by_case["ipc"]
    assert ipc["modes"] == ["broadcast", "broadcast"] and ipc["max_abs_diff"] == [0.0, 0.0], ipc
    diffs = next(line["fixed_max_abs_diff"] for line in lines if "fixed_max_abs_diff" in line)
    assert diffs["fixed-bfloat16-zero3 vs fixed-bfloat16-zero2"] == 0.0
    assert 0 <= diffs["fixed-float32-zero3 vs fixed-float32-zero1"] < 1e-4
    assert lines[-1]["passed"] is True and proc.returncode == 0, lines[-1]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is visible here")
def test_refuses_cuda_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "launch.gpu_learner_check", "--cases", "ipc"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--device cpu" in proc.stderr


def test_case_names_are_checked_before_anything_runs():
    from launch.gpu_learner_check import parse_case

    assert parse_case('learn-bfloat16-zero3+data_types.grad_accum_dtype="fp32"') == (
        "learn", "bfloat16", 3, {"data_types.grad_accum_dtype": "fp32"})
    assert parse_case("fixed-float32-zero1+overlap_comm=false") == ("fixed", "float32", 1, {"overlap_comm": False})
    for bad, named in [("learn-fp16-zero2", "learn-fp16-zero2"), ("fixed-float32-zero4", "zero<1|2|3>"),
                       ("learn-float32-zero2+overlap_comm", "'overlap_comm' is not key=<json value>"),
                       ("learn-float32-zero2+x=fp32", "'x=fp32' is not")]:
        with pytest.raises(ValueError, match=re.escape(named)):
            parse_case(bad)
    proc = subprocess.run([sys.executable, "-m", "launch.gpu_learner_check", "--device", "cpu", "--cases", "lean"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "case 'lean'" in proc.stderr
