"""The raylet repeats some warnings on a timer for as long as their cause lasts: the one that says Ray's temp
directory is over its disk threshold comes every 10 s, from every node. On the driver's terminal the first of
each is shown; its repeats are counted, and shown again as one line with the count every `every_s` (10 min),
so a warning that still holds is not lost and a day-long run does not print it 8,640 times. Each raylet's own
log (`<ray temp dir>/session_latest/logs/raylet.out`) keeps every line.

Only lines Ray forwards from a raylet are touched: the roles' own output goes to their log files, and a
worker's line that Ray forwards is printed as Ray prints it.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Callable

log = logging.getLogger("agentgym.ray")

_VARYING = re.compile(r"\d")  # timestamps, pids, sizes, session names, hex ids
_HANDLER = "ray_print_logs"  # the name Ray's driver gives its forwarded-log printer (ray/_private/worker.py)
_MAX_KEYS = 1024


def _key(line: str) -> str:
    """What stays the same between two repeats of one warning: the words without digits."""
    return " ".join(word for word in line.split() if not _VARYING.search(word))


class RepeatFilter:
    """Thins the raylet's lines in a batch of forwarded logs (Ray's `LogBatch`: a dict with `pid`, `lines`)."""

    def __init__(self, every_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self.every_s, self.clock = every_s, clock
        self._seen: dict[str, list] = {}  # key -> [when last shown, repeats since]

    def __call__(self, batch: dict) -> dict | None:
        """The batch to print (None: nothing left in it)."""
        if batch.get("pid") != "raylet":
            return batch
        kept = []
        for line in batch.get("lines", ()):
            key, now = _key(line), self.clock()
            seen = self._seen.get(key)
            if seen is None:
                if len(self._seen) >= _MAX_KEYS:
                    self._seen.pop(next(iter(self._seen)))
                self._seen[key] = [now, 0]
                kept.append(line)
            elif now - seen[0] >= self.every_s:
                repeats = f" [and {seen[1]} more like it since {(now - seen[0]) / 60:.0f} min ago]" if seen[1] else ""
                kept.append(line + repeats)
                seen[:] = [now, 0]
            else:
                seen[1] += 1
        return dict(batch, lines=kept) if kept else None


def install(every_s: float = 600.0) -> bool:
    """Put a `RepeatFilter` in front of the printer Ray's driver uses for forwarded logs (after `ray.init`
    with `log_to_driver`). Returns False, and changes nothing, where this Ray has no such printer: its lines
    then print as Ray prints them."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    lock = getattr(dispatcher, "_lock", None)
    if not isinstance(getattr(dispatcher, "handlers", None), list) or lock is None:
        return False
    with lock:
        for i, (name, handler) in enumerate(dispatcher.handlers):
            if name == _HANDLER:
                if not isinstance(handler, _Filtered):  # not filtered already
                    dispatcher.handlers = [*dispatcher.handlers[:i], (name, _Filtered(handler, RepeatFilter(every_s))),
                                           *dispatcher.handlers[i + 1:]]
                return True
    log.debug("no %s handler to filter: the raylet's repeated warnings print as Ray prints them", _HANDLER)
    return False


class _Filtered:
    def __init__(self, handler: Callable[[dict], None], thin: RepeatFilter):
        self.handler, self.thin = handler, thin

    def __call__(self, batch: dict) -> None:
        kept = self.thin(batch)
        if kept is not None:
            self.handler(kept)
