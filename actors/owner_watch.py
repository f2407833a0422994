"""Ending a process when the process that owns it is gone: vLLM's engine outlives a killed generator.

`AsyncLLM` runs its engine core in a child process (actors/generator.py), and nothing ties that child's life
to the generator's: when the generator actor dies without a shutdown (a SIGKILL, a node's OOM killer, `ray
stop --force` after the job's driver was killed), the engine is re-parented and runs on. Seen here: after
the driver of a run was killed and `ray stop --force` had returned, its engine core was still decoding at
100 % of a core with 4.4 GB resident, on a machine of 2 cores and 24 GB, and stayed until killed by hand.
tests/test_owner_watch.py kills a process holding a generator, as a chaos kill of a generator actor does:
without the watch below its engine core and vLLM's resource tracker were both still running 20 s later.

So the generator asks each vLLM worker it reaches (`WeightLoadExtension.agentgym_watch_owner`: the engine
core itself under the `uni` executor, each rank's process under `mp`) to watch it: a daemon thread reads the
owner's start time every `interval_s` and ends its own process (`os._exit`) once the owner is gone, is a
zombie, or its pid now names another process (another start time). Under `mp`, vLLM's executor ends the
engine core when a rank dies (its worker monitor; read in its source, not tried here: it needs CUDA).

Linux only (/proc); where /proc cannot be read, nothing is watched and `watch_owner` says so by returning
None.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

log = logging.getLogger("agentgym.owner_watch")


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None when it is gone or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2, the command name, may hold spaces and parentheses: the fields after its last ')' are plain.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z":  # field 3, the state: a zombie has ended
        return None
    return fields[19].decode()  # field 22


def owner_alive(pid: int, started: str) -> bool:
    return start_time(pid) == started


def watch_owner(pid: int, started: str, interval_s: float = 1.0,
                on_gone: Callable[[], None] | None = None) -> threading.Thread | None:
    """Start a daemon thread that calls `on_gone` (default: end this process with status 1) once process
    `pid`, started at `started` (`start_time(pid)` read by the owner itself), is gone. None: /proc is not
    readable here, so nothing is watched."""
    if start_time(os.getpid()) is None:
        log.warning("owner_watch: /proc/<pid>/stat is not readable here; this process will not end with %d",
                    pid)
        return None
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")

    def gone() -> None:
        log.error("owner_watch: process %d (the owner of pid %d) is gone; ending this process", pid,
                  os.getpid())
        os._exit(1)

    def watch() -> None:
        while owner_alive(pid, started):
            time.sleep(interval_s)
        (on_gone or gone)()

    thread = threading.Thread(target=watch, name=f"owner-watch-{pid}", daemon=True)
    thread.start()
    return thread
