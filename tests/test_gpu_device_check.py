"""The device check that fits a lent GPU machine (launch/gpu_device_check.py) in its `--device cpu` form, and the
GPU checks' command lines.

The CPU form runs in a subprocess whose Python cannot import vLLM, Ray, DeepSpeed, ZeroMQ, cryptography or
omegaconf (a sitecustomize refuses them, standing in for a lent machine that has torch and transformers only):
it must still run every CPU part and pass: the weights group's bounded broadcast on gloo (bit for bit, acked,
at most two bucket buffers a side, a version of more than four buckets) and packed_sdpa against sdpa in
bfloat16 against a float32 reference.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("vllm", "ray", "deepspeed", "zmq", "cryptography", "omegaconf")

BLOCKER = f'''
import importlib.machinery, sys
class _Absent(importlib.machinery.PathFinder):
    """The path finder, blind to the blocked packages: for them find_spec answers None, as where not installed."""
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def test_device_check_cpu_form_runs_with_torch_and_transformers_only(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    probe = subprocess.run([sys.executable, "-c", "import zmq"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'zmq'" in probe.stderr  # the blocker works
    result = subprocess.run([sys.executable, "-m", "launch.gpu_device_check", "--device", "cpu"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.stdout + result.stderr
    out = json.loads(lines[0])
    assert result.returncode == 0 and out["ok"], json.dumps(out, indent=1)[:4000] + result.stderr[-3000:]
    assert out["heavy_imports"] == []
    gloo = out["parts"]["collective_gloo"]
    assert all(gloo["checks"].values()) and gloo["version_bytes"] > 4 * gloo["bucket_bytes"]
    for r in gloo["receiver"]:
        assert r["mode"] == "broadcast" and r["buffers_allocated"] == 2 and r["buffer_peak_bytes"] <= 2 * r["buffer_bytes"]
    packed = out["parts"]["packed_sdpa"]
    assert all(packed["checks"].values())
    assert packed["packed_sdpa"]["tokens_per_s_fwd_bwd"] > 0 and packed["sdpa"]["tokens_per_s_fwd_bwd"] > 0


def test_gpu_check_and_device_check_help():
    for module in ("launch.gpu_check", "launch.gpu_device_check"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0 and "--device" in result.stdout, (module, result.stderr)
