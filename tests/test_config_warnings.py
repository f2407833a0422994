"""Settings that load but are almost surely not meant are warned about at start, naming the key: float32 on GPUs."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs.load import config_warnings, load_config
from launch.job.cli import parse

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides, named", [
    (["generator.device=cuda"], "generator.device=cuda"),
    (["learner.num_gpus_per_rank=1"], "learner.num_gpus_per_rank=1"),
    (["generator.num_gpus=1"], "generator.num_gpus=1"),
])
def test_float32_on_gpus_is_warned_naming_the_keys(overrides, named):
    warnings = config_warnings(load_config(None, ["model.dtype=float32", *overrides]))
    assert [key for key, _ in warnings] == ["model.dtype"]
    why = warnings[0][1]
    assert named in why and "bfloat16" in why


@pytest.mark.parametrize("overrides", [[], ["model.dtype=bfloat16"]])
def test_cpu_runs_get_no_warning(overrides):
    assert config_warnings(load_config(None, overrides)) == []


def test_bfloat16_on_gpus_gets_no_warning():
    cfg = load_config(None, ["model.dtype=bfloat16", "generator.device=cuda", "learner.num_gpus_per_rank=1"])
    assert config_warnings(cfg) == []


def test_the_cli_logs_the_warning_at_start(caplog):
    with caplog.at_level(logging.WARNING, logger="agentgym.config"):
        parse(["model.dtype=float32", "generator.device=cuda"], "launch.train", "")
    [record] = caplog.records
    assert "config warning: model.dtype" in record.getMessage()


def test_the_warning_reaches_stderr_without_logging_set_up(tmp_path):
    """`launch.train` has not configured logging when it parses its config: the warning must still be seen."""
    for name in ("torch", "ray", "vllm", "deepspeed"):  # the config is checked before any of these is imported
        (tmp_path / f"{name}.py").write_text("import sys\nsys.exit(99)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--print-config", "model.dtype=float32",
                           "learner.num_gpus_per_rank=1"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "config warning: model.dtype" in proc.stderr and "learner.num_gpus_per_rank=1" in proc.stderr
