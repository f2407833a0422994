"""Each role's memory as the step's metrics carry it: a role's process with the processes it started (a
generator's engine core), and what cannot be read here counted, never guessed."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from launch.job.role_stats import RoleMemory, driver_tokens_per_s, rss_mb, tree_rss_mb


def test_a_roles_memory_includes_the_processes_it_started():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(200 << 20); x[::4096] = b'1' * "
                              "len(x[::4096]); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while (rss_mb(child.pid) or 0) < 150 and time.monotonic() < deadline:
            time.sleep(0.2)
        own, tree = rss_mb(os.getpid()), tree_rss_mb(os.getpid())
        assert tree - own >= 150  # the child's 200 MB, touched
    finally:
        child.kill()
        child.wait()
    assert tree_rss_mb(child.pid) is None  # gone


def test_unreadable_roles_are_counted_and_asked_for_again():
    asked = []
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def locate():
        asked.append(time.monotonic())
        return {"Learner": [(os.getpid(), True)], "Generator": [(os.getpid(), False), (gone.pid, True)]}

    memory = RoleMemory(locate, refresh_s=0.0)
    got = memory.sample()
    assert got["perf/rss_mb/learner0"] > 0 and got["perf/rss_mb/driver"] > 0
    assert "perf/rss_mb/generator0" not in got and "perf/rss_mb/generator1" not in got  # another node; gone
    assert got["perf/rss_unread"] == 2.0 and len(asked) == 2  # asked at start, and again after the miss
    assert driver_tokens_per_s({"train/batch_tokens": 600.0, "perf/step_seconds": 20.0}) == 30.0
    assert driver_tokens_per_s({}) == 0.0
