"""The cyclic garbage collector in long-lived roles that hold thousands of small objects in flight.

A role's process imports torch, transformers and Ray before its loop starts: millions of objects that live as
long as the process. CPython's collector traverses them on every full collection, and with thousands of
episodes in flight (each an asyncio task, a future, a spec, a summary) full collections come often: in the
scale benchmark's driver they were the largest single cost after Ray's own calls. `freeze_startup_heap`, called
once when a role's loop starts, moves every object alive at that moment into the permanent generation
(`gc.freeze`), so later collections traverse only what the loop allocated. Objects frozen are never collected
by the cyclic collector: a cycle among them that later becomes garbage stays in memory, which is why this is
called once, after start-up, and not on objects made per episode.
"""
from __future__ import annotations

import gc


def thaw_heap() -> None:
    """Give frozen objects back to the collector (when an in-process loop ends, e.g. in tests and benches)."""
    gc.unfreeze()


def freeze_startup_heap() -> int:
    """Collect what start-up left, then freeze every object alive now; returns how many are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorClock:
    """The time this process spends in the cyclic collector while installed (gc.callbacks), in seconds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._began = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        import time

        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.collections += 1

    def __enter__(self) -> "CollectorClock":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)
