"""Stopping a run on SIGTERM or SIGINT within a grace period.

What must hold: the first signal asks the session to stop at once (no new episodes, the step in flight is not
published, the state is saved) and arms a timer; if the process has not exited `grace_s` later, it exits
without a new checkpoint (the last complete one stays, and `checkpoint.resume=auto` continues from it). A
second signal exits at once. The processes the run started go with it: Ray ends the actors a driver owns.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger("agentgym.stop")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop:
    def __init__(self, request_stop: Callable[[str], None], grace_s: float):
        self.request_stop, self.grace_s = request_stop, grace_s
        self.signal: int | None = None
        self._timer: threading.Timer | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> "SignalStop":
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:
            log.error("%s again: exiting now, without a new checkpoint", name)
            os._exit(128 + signum)
        self.signal = signum
        log.warning("%s: stopping within %.0f s with the state saved (send it again to exit at once)",
                    name, self.grace_s)
        self._timer = threading.Timer(self.grace_s, self._expired)
        self._timer.daemon = True
        self._timer.start()
        self.request_stop(name)

    def _expired(self) -> None:
        log.error("the run did not stop within checkpoint.stop_grace_s = %.0f s; exiting without a new "
                  "checkpoint (resume=auto continues from the last complete one)", self.grace_s)
        logging.shutdown()
        os._exit(128 + (self.signal or signal.SIGTERM))

    def restore(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
