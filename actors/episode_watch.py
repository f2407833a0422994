"""Stopping a run whose episodes keep failing, instead of letting it draw item after item.

A family whose env cannot run here (a site that is down, a server that refuses every reset) ends each episode
`env_error` or `env_timeout` within seconds, a generator that fails every request ends them `aborted`, and the
pools draw new items as fast as they fail: no step is trained and the logs fill. The watch keeps each family's
last `window` endings and, once that many have ended, stops the run when more than `max_frac` of them were
failures, naming the family, the side that fails (env or generation) and the counts.
"""
from __future__ import annotations

import collections

ENV_FAILURES = ("env_error", "env_timeout")
GENERATION_FAILURES = ("aborted",)  # the generator raised or answered nothing (not a replica that died: "lost")
FAILURES = ENV_FAILURES + GENERATION_FAILURES


class EpisodesFailing(RuntimeError):
    """A family's episodes keep failing in the env; restarting the run's roles would not help."""


class EpisodeWatch:
    def __init__(self, window: int = 32, max_frac: float = 0.5):
        if window < 1 or not 0 < max_frac <= 1:
            raise ValueError(f"EpisodeWatch: window >= 1 and 0 < max_frac <= 1, got {window}, {max_frac}")
        self.window, self.max_frac = window, max_frac
        self._last: dict[str, collections.deque] = {}
        self._failed: collections.Counter[str] = collections.Counter()  # failures in each family's window

    def record(self, family: str, termination: str) -> None:
        """Note how an episode of `family` ended; raises EpisodesFailing when the family's window trips.
        O(1) per episode: it runs for every episode the coordinator hears of."""
        last = self._last.setdefault(family, collections.deque(maxlen=self.window))
        if len(last) == self.window and last[0] in FAILURES:
            self._failed[family] -= 1
        last.append(termination)
        if termination in FAILURES:
            self._failed[family] += 1
        if len(last) < self.window or self._failed[family] <= self.max_frac * self.window:
            return
        failed = collections.Counter(t for t in last if t in FAILURES)
        if sum(failed.values()) > self.max_frac * self.window:
            counts = ", ".join(f"{n} {t}" for t, n in sorted(failed.items()))
            env_side = sum(failed[t] for t in ENV_FAILURES) >= sum(failed[t] for t in GENERATION_FAILURES)
            what = f"the {family} env" if env_side else f"the policy's generation for the {family} env"
            raise EpisodesFailing(
                f"{what} keeps failing: of its last {self.window} episodes, {counts} "
                f"(more than env.failing_frac = {self.max_frac:g}); the env-pool logs say why. Stopping instead "
                "of drawing more items")
