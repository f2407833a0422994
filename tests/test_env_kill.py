"""An env whose close hangs is killed, with the process it holds: a real JVM (SciWorld), and a child process of
a SyncEnv that blocks in close (written here because no shipped env hangs on purpose)."""
from __future__ import annotations

import asyncio
import subprocess
import threading

from core.env import SyncEnv, close_or_kill, run_sync_env


class HangingEnv(SyncEnv):
    """Holds a child process and blocks forever in close, like an env whose backend stopped answering."""

    family = "hanging"

    def __init__(self):
        self.child = subprocess.Popen(["sleep", "600"])
        self.release = threading.Event()

    def reset(self, item_id):
        raise NotImplementedError

    def step(self, text):
        raise NotImplementedError

    def close(self):
        self.release.wait(60)

    def kill(self):
        self.child.kill()
        self.child.wait(10)


def test_a_hanging_close_is_killed_with_its_process():
    inner = HangingEnv()
    env = run_sync_env(inner)
    outcome = asyncio.run(close_or_kill(env, timeout_s=0.5))
    inner.release.set()
    assert outcome == "killed"
    assert inner.child.poll() is not None


def test_sciworld_kill_ends_its_jvm_at_once():
    from configs.env import SciWorldConfig
    from environments.sciworld.env import SciWorldEnv

    env = SciWorldEnv(SciWorldConfig())
    pid_proc = env._simulator().process
    assert pid_proc.poll() is None
    env.kill()
    assert pid_proc.poll() is not None
    env.close()
