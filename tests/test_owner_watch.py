"""A generator's vLLM engine ends with the generator (actors/owner_watch.py): real processes, real engine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from actors.owner_watch import owner_alive, start_time

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, cwd=ROOT, **kwargs)


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids of `pids` still running (not zombies) after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if start_time(p) is not None]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_start_time_tells_a_process_from_a_reused_pid():
    mine = start_time(os.getpid())
    assert mine is not None and mine.isdigit()
    assert owner_alive(os.getpid(), mine)
    assert not owner_alive(os.getpid(), str(int(mine) + 1))  # the same pid, started at another time
    child = subprocess.Popen(["sleep", "0"])
    child.wait()
    assert start_time(child.pid) is None and not owner_alive(child.pid, mine)


def test_a_watcher_ends_its_process_when_the_owner_is_killed():
    owner = subprocess.Popen(["sleep", "120"])
    watched = _python("""
        import sys, time
        from actors.owner_watch import start_time, watch_owner
        pid = int(sys.argv[1])
        assert watch_owner(pid, start_time(pid), interval_s=0.1) is not None
        time.sleep(120)
        """, str(owner.pid))
    try:
        time.sleep(1.5)
        assert watched.poll() is None, "the watcher ended its process while the owner ran"
        os.kill(owner.pid, signal.SIGKILL)  # not reaped yet: a zombie counts as gone
        assert watched.wait(timeout=10) == 1
    finally:
        for p in (owner, watched):
            p.kill()
            p.wait()


@pytest.mark.timeout(300)
def test_the_engine_process_ends_when_its_generator_is_killed(tiny_model_dir):
    """The generator in a process of its own, as a Ray actor has it; SIGKILL that process and its vLLM engine
    core (a child, re-parented on the kill) must end too."""
    owner = _python("""
        import asyncio, sys
        from actors.generator import Generator
        from configs.generation import GeneratorConfig
        cfg = GeneratorConfig(kv_cache_gb=0.0625, max_num_seqs=4, enforce_eager=True, session_tokens=512)
        g = Generator(sys.argv[1], cfg, dtype="float32", max_model_len=1024, name="watched-gen")
        asyncio.new_event_loop().run_until_complete(g.ready())
        print("READY", flush=True)
        import time; time.sleep(600)
        """, str(tiny_model_dir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    descendants: list[int] = []
    try:
        lines = iter(owner.stdout.readline, "")  # vLLM prints to stdout too
        started = any(line.strip() == "READY" for line in lines)
        assert started, f"the generator did not start (exit {owner.poll()})"
        descendants = [p.pid for p in psutil.Process(owner.pid).children(recursive=True)]
        assert descendants, "no engine process under the generator: vLLM's layout changed"
        running = _gone_within(descendants, 2)
        assert len(running) == len(descendants), "the engine ended while its generator ran"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        left = _gone_within(descendants, 20)
        assert not left, "still running 20 s after their generator was killed: " + \
            ", ".join(f"{p} {' '.join(psutil.Process(p).cmdline())[:80]}" for p in left)
    finally:
        owner.kill()
        owner.wait()
        for pid in descendants:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
