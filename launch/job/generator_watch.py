"""The driver's watch over the generator replicas: a replica Ray restarted is subscribed to the weights channel
again and the current weights are published to it before it serves (it waits for them: launch.job.generators).

What must hold: a restart is noticed within one health check (`check`, which the coordinator's watchdog calls
every few seconds) and counted in `recovery/generator_restarts`; a replica that is down is logged once, not per
check; the run stops, naming why, only when every replica has been down for `recovery_wait_s`. The coordinator
checks while it waits for weight acks too, and does not wait for the acks of a replica seen down.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError

log = logging.getLogger("agentgym.generators")


class GeneratorWatch:
    def __init__(self, handles: Sequence[Any], weights_endpoint: str, curves: Sequence[Any],
                 recovery_wait_s: float, relay_host: str | None = None, rejoins: bool = True,
                 names: Sequence[str] = (), chunk_bytes: int = 64 << 20):
        """`names`: each replica's weights-subscriber name (what `down_names` answers in); `chunk_bytes`: the
        publisher's chunk size, which caps a rejoining replica's frames."""
        self.handles, self.weights_endpoint, self.curves = list(handles), weights_endpoint, list(curves)
        self.names = list(names) or [f"generator-{i}" for i in range(len(self.handles))]
        self.relay_host = relay_host  # where a replica binds its relay socket (None: star fan-out)
        self.chunk_bytes = chunk_bytes
        self.recovery_wait_s = recovery_wait_s
        self.rejoins = rejoins  # False with a weights group (weights_sync=collective): a restart fails the run
        self.incarnations: list[str | None] = [None] * len(self.handles)
        self.down_since: dict[int, float] = {}
        self.restarts = 0
        self._republish = False

    def check(self, timeout_s: float = 5.0) -> str:
        """"" while the replicas can serve (or some are coming back); else what broke."""
        refs = [h.health.remote() for h in self.handles]  # asked all at once: one timeout for every replica
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        answered = set(ready)
        for i, (handle, ref) in enumerate(zip(self.handles, refs)):
            try:
                if ref not in answered:
                    raise GetTimeoutError(f"no answer in {timeout_s:.0f} s")
                info = ray.get(ref)
            except (RayActorError, GetTimeoutError) as exc:
                if i not in self.down_since:
                    log.warning("generator replica %d is down (%s); Ray restarts it (generator.max_restarts)",
                                i, type(exc).__name__)
                    self.down_since[i] = time.monotonic()
                continue
            if self.incarnations[i] is not None and info["incarnation"] != self.incarnations[i]:
                self.restarts += 1
                if not self.rejoins:
                    return (f"generator replica {i} was restarted and cannot rejoin the weights group "
                            "(transport.weights_sync=collective); the roles are rebuilt")
                log.warning("generator replica %d was restarted; subscribing it to the weights again", i)
                ray.get(handle.subscribe_weights.remote(self.weights_endpoint, self.curves[i], self.relay_host, "",
                                                        self.chunk_bytes),
                        timeout=120)
                self._republish = True
            self.incarnations[i] = info["incarnation"]
            if self.down_since.pop(i, None) is not None:
                log.warning("generator replica %d is back", i)
            if info["problem"]:
                return info["problem"]
        if len(self.down_since) == len(self.handles):
            down_for = time.monotonic() - max(self.down_since.values())
            if down_for > self.recovery_wait_s:
                return (f"every generator replica has been down for {down_for:.0f} s "
                        f"(generator.recovery_wait_s = {self.recovery_wait_s:.0f})")
        return ""

    def down_names(self) -> list[str]:
        """The subscriber names of the replicas the last check found down (their weight acks are not awaited)."""
        down = self.down_since.copy()  # one step under the GIL: `check` may be changing it on another thread
        return [self.names[i] for i in sorted(down)]

    def take_republish(self) -> bool:
        """Whether a restarted replica needs the current weights (asked once per restart)."""
        wanted, self._republish = self._republish, False
        return wanted
