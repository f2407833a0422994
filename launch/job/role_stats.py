"""Each role's resident memory every step, read by the driver from /proc, and the driver's own tokens/s.

A long asynchronous run must stay flat: what grows (a cache, a queue, a leak in one role) shows first as one
role's resident memory climbing step after step, or its tokens/s falling. The step's metrics carry, every step:

- `perf/rss_mb/driver` and `perf/rss_mb/<role><i>` (learner, generator, env_pool: VmRSS of /proc/<pid>/status,
  what the process holds in memory now, not the peak, summed with the processes it started: a generator's vLLM
  engine core, an env pool's simulators) for every role process on the driver's node. Reading /proc costs well
  under a millisecond and asks nothing of the roles, so it cannot slow them.
- `perf/rss_unread`: role processes whose memory could not be read here (on another node, where a pid number
  names some other process, or gone since the last look): counted, never guessed. After a miss the pids are asked
  again (a restarted actor has a new one), at most every `refresh_s`.
- `perf/driver/tokens_per_s`: the step's trained tokens over its wall time, what passed through the driver.

The other roles' tokens/s are already in every step: the learner's `perf/train_tokens_per_s`, the generators'
`perf/gen_tokens_per_s` (all replicas) and `perf/generator<i>/tokens_per_s` (each, with `logging.log_every` 1,
the default). Env pools emit no tokens; their memory is what they report here.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
ROLE_KEYS = {"Learner": "learner", "Generator": "generator", "EnvPool": "env_pool"}


def rss_mb(pid: int | str = "self") -> float | None:
    """VmRSS of process `pid` in MiB (None when it cannot be read: gone, or not visible here)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def children(pid: int) -> list[int]:
    """The processes `pid`'s threads started (empty when gone or unreadable)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    except OSError:
        return []
    return out


def tree_rss_mb(pid: int) -> float | None:
    """VmRSS of `pid` and of every process below it (None when `pid` itself cannot be read)."""
    own = rss_mb(pid)
    if own is None:
        return None
    seen, todo, total = {pid}, children(pid), own
    while todo:
        child = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        total += rss_mb(child) or 0.0  # a child that just ended counts nothing
        todo += children(child)
    return total


class RoleMemory:
    def __init__(self, locate: Callable[[], dict[str, list[tuple[int, bool]]]], refresh_s: float = 30.0):
        """`locate()`: role class name -> (pid, on this node) of each of its actors (asked again after a miss)."""
        self.locate, self.refresh_s = locate, refresh_s
        self.where: dict[str, list[tuple[int, bool]]] = {}
        self.asked = float("-inf")
        self._ask()

    def _ask(self) -> None:
        self.asked = time.monotonic()
        try:
            self.where = self.locate()
        except Exception as exc:  # a role being restarted: counted as unread below until the next ask
            log.warning("role processes could not be located: %r", exc)

    def sample(self) -> dict[str, float]:
        out = {"perf/rss_mb/driver": rss_mb() or 0.0}
        unread = 0
        for role, places in self.where.items():
            name = ROLE_KEYS.get(role, role.lower())
            for i, (pid, local) in enumerate(places):
                value = tree_rss_mb(pid) if local else None
                if value is None:
                    unread += 1
                else:
                    out[f"perf/rss_mb/{name}{i}"] = value
        out["perf/rss_unread"] = float(unread)
        if unread and time.monotonic() - self.asked >= self.refresh_s:
            self._ask()
        return out


def driver_tokens_per_s(metrics: dict[str, float]) -> float:
    """The step's trained tokens over the step's wall time (0 when either is missing)."""
    seconds = metrics.get("perf/step_seconds", 0.0)
    return metrics.get("train/batch_tokens", 0.0) / seconds if seconds > 0 else 0.0


def ray_locate(actors: dict[str, list]) -> dict[str, list[tuple[int, bool]]]:
    """(pid, on the driver's node) of every actor, asked of the actors themselves through Ray."""
    import ray

    here = ray.get_runtime_context().get_node_id()

    def whereabouts(_self):
        import os as _os

        import ray as _ray
        return _os.getpid(), _ray.get_runtime_context().get_node_id()

    out = {}
    for role, handles in actors.items():
        found = ray.get([a.__ray_call__.remote(whereabouts) for a in handles], timeout=60)
        out[role] = [(pid, node == here) for pid, node in found]
    return out

